"""Element types and ops, made at import from the C core's lists (include/ggml_py.h:
GGML_PY_TYPES, GGML_PY_OPS), and the facts about each type (its traits).

The type numbers are ggml's (GGUF files store them), so they are part of the file format.
"""
import operator
from enum import IntEnum

import numpy as np

from ggml_py import _core


def exact_int(value):
    """value as an int if it is an integer (numpy's too, not a bool), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def checked_int(name, value, low=None, high=None):
    """value as an int if it is an integer (numpy's too, not a bool) in low..high (None:
    unbounded); else a TypeError (not an integer) or ValueError (out of range) naming it."""
    number = exact_int(value)
    if number is None:
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if (low is not None and number < low) or (high is not None and number > high):
        bounds = f"at least {low}" if high is None else f"at most {high}" if low is None \
            else f"in {low}..{high}"
        raise ValueError(f"{name} must be {bounds}, got {number}")
    return number


def _format(member, spec):
    """f"{t:>6}" pads the name (int's format would pad the number); a number's format
    code (f"{t:d}", f"{t:x}") formats the number."""
    if spec and spec[-1] in "bcdoxXneEfFgG%":
        return int.__format__(member, spec)
    return format(member.name, spec)


class _Named(IntEnum):
    """str() is the name ("Q8_0", "MUL_MAT"); a format spec of a number formats the number."""

    def __str__(self):
        return self.name

    def __format__(self, spec):
        return _format(self, spec)


class _TypeMembers(_Named):
    @classmethod
    def of(cls, value, where):
        """A Type from a Type, its number or its name in any case ('f32', 'Q8_0');
        TypeError or ValueError naming `where` (the function asking) for anything else."""
        if isinstance(value, str):
            if value.upper() in cls.__members__:
                return cls[value.upper()]
        else:
            number = exact_int(value)
            if number is None:
                raise TypeError(f"{where}: type must be a Type (e.g. gg.F32), its number or "
                                f"its name, got {type(value).__name__}")
            if number in cls._value2member_map_:
                return cls(number)
        raise ValueError(f"{where}: unknown type {value!r} (one of "
                         f"{', '.join(cls.__members__)})")


# the C core's lists (include/ggml_py.h) are the only ones: the members come from there
Type = _TypeMembers("Type", _core.TYPE_IDS, module=__name__, qualname="Type")
Type.__doc__ = "Element types, numbered as ggml numbers them (GGML_PY_TYPES in include/ggml_py.h)."
Op = _Named("Op", _core.OP_IDS, module=__name__, qualname="Op")
Op.__doc__ = "Graph operations, in the order of GGML_PY_OPS (include/ggml_py.h)."
OP_COUNT = _core.OP_COUNT

NUMPY_DTYPES = {
    Type.F32: np.dtype(np.float32),
    Type.F16: np.dtype(np.float16),
    Type.BF16: np.dtype(np.uint16),   # raw bits: numpy has no bfloat16
    Type.I8: np.dtype(np.int8),
    Type.I16: np.dtype(np.int16),
    Type.I32: np.dtype(np.int32),
    Type.I64: np.dtype(np.int64),
    Type.F64: np.dtype(np.float64),
}
TYPES_OF_DTYPES = {dt: t for t, dt in NUMPY_DTYPES.items() if t != Type.BF16}


def exact_shape(shape, where):
    """shape as a tuple of ints >= 0 (numpy's integers too; not bools or floats, as numpy
    refuses them); TypeError or ValueError that starts with `where` otherwise."""
    try:
        sizes = None if isinstance(shape, (str, bytes)) else tuple(exact_int(d) for d in shape)
    except TypeError:                      # not a sequence
        sizes = None
    if sizes is None or None in sizes:
        raise TypeError(f"{where}: a shape is a sequence of integers, got {shape!r}")
    if any(d < 0 for d in sizes):
        raise ValueError(f"{where}: negative dimension in shape {sizes}")
    return sizes


def type_traits(type):
    """Facts about a type: name, block size, bytes per block, quantized, vec_dot type."""
    raw = _core.type_traits_raw(int(Type.of(type, "type_traits")))
    if raw is None:
        raise ValueError(f"type_traits: unknown type {type!r}")
    name, blck_size, type_size, is_quantized, vec_dot_type, has_to, has_from, has_dot = raw
    return {
        "name": name, "blck_size": blck_size, "type_size": type_size,
        "is_quantized": bool(is_quantized), "vec_dot_type": Type(vec_dot_type),
        "has_to_float": has_to, "has_from_float": has_from, "has_vec_dot": has_dot,
    }


def data_alignment(type):
    """Bytes a `type` element or block must start on for the kernels, which read it
    through typed pointers: the largest power of two dividing its size, at most 8
    (F32 4, F16 2, a Q4_0 block 2, a Q8_K block 4). Arena tensors and packed rows
    always are; views at other offsets or strides, and buffers elsewhere, are refused."""
    size = type_traits(type)["type_size"]
    return min(size & -size, 8)


def row_bytes(type, n):
    """Bytes of a row of n elements of `type` (n >= 0 must fill whole blocks)."""
    type = Type.of(type, "row_bytes")
    traits = type_traits(type)
    n = operator.index(n)
    if n < 0:
        raise ValueError(f"a row cannot have a negative number of elements, got {n}")
    if n % traits["blck_size"]:
        raise ValueError(f"a row of {traits['name']} needs a multiple of "
                         f"{traits['blck_size']} elements, got {n}")
    return _core.row_size(int(type), n)
