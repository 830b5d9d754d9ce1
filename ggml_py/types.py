"""Element types and ops, mirrored one-to-one from include/ggml_py.h.

The numbers are ggml's (GGUF files store them), so they are part of the file
format. `check_against_core()` runs at import and fails loudly if the C header
and these enums ever drift apart.
"""
import operator
from enum import IntEnum

import numpy as np


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


class Type(IntEnum):
    """Element types, numbered as ggml numbers them. str() is the name ("Q8_0")."""
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    BF16 = 30

    def __str__(self):
        return self.name

    def __format__(self, spec):
        return _format(self, spec)

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


class Op(IntEnum):
    """Graph operations (same order as enum ggml_py_op). str() is the name ("MUL_MAT")."""

    def __str__(self):
        return self.name

    def __format__(self, spec):
        return _format(self, spec)

    NONE = 0
    # copies
    DUP = 1
    CPY = 2
    CONT = 3
    # element-wise binary, src1 broadcast over src0
    ADD = 4
    SUB = 5
    MUL = 6
    DIV = 7
    # element-wise unary
    SCALE = 8
    NEG = 9
    SQR = 10
    SQRT = 11
    RELU = 12
    GELU = 13
    SILU = 14
    SWIGLU = 15
    # reductions over rows
    SUM_ROWS = 16
    MEAN = 17
    ARGMAX = 18
    # normalisation
    NORM = 19
    RMS_NORM = 20
    SOFT_MAX = 21
    # matrix products and row access
    MUL_MAT = 22
    GET_ROWS = 23
    SET_ROWS = 24
    ROPE = 25
    CONCAT = 26
    # views
    VIEW = 27
    RESHAPE = 28
    PERMUTE = 29
    TRANSPOSE = 30


OP_COUNT = 31

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


def check_against_core(core):
    """Raise ImportError when Type or Op differs from the C header's enums."""
    if {t.name: int(t) for t in Type} != core.TYPE_IDS:
        raise ImportError("ggml_py: Type differs from enum ggml_py_type in the C core")
    for t in Type:
        if core.type_traits_raw(int(t)) is None:
            raise ImportError(f"ggml_py: Type.{t.name}={int(t)} has no type traits in the C core")
    if core.OP_COUNT != OP_COUNT:
        raise ImportError(f"ggml_py: Op has {OP_COUNT} members, the C core {core.OP_COUNT}")
    for op in Op:
        if core.OP_IDS[op.name] != int(op):
            raise ImportError(f"ggml_py: Op.{op.name} differs from the C core")
