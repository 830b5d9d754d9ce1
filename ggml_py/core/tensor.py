"""Tensors and the Context arena that owns them, in numpy shape order.

C keeps ggml's order (ne[0] is a row's length); here shapes read as numpy's:
`ctx.new_tensor(F32, (4, 3))` is 4 rows of 3, i.e. ne = (3, 4, 1, 1).
"""
import math

import numpy as np

from ggml_py import _core
from ggml_py.core.profiles import TaskProfile
from ggml_py.core.quants import ROWS8_TYPES
from ggml_py.core.types import (NUMPY_DTYPES, TYPES_OF_DTYPES, Op, Type, data_alignment,
                                exact_shape, row_bytes)

MAX_DIMS = 4


def ne_of_shape(shape, where):
    """numpy shape (outermost first) -> ggml ne (4 ints, innermost first).

    Sizes are exact ints: a shape whose element count does not fit in int64
    (the C core's ne) raises ValueError here, before C sees it."""
    shape = exact_shape(shape, where)
    if not 1 <= len(shape) <= MAX_DIMS:
        raise ValueError(f"tensors have 1 to {MAX_DIMS} dimensions, got shape {shape}")
    if max(shape) > _core.INT64_MAX or math.prod(shape) > _core.INT64_MAX:
        raise ValueError(f"shape {shape} has more elements than int64 can count")
    return tuple(reversed(shape)) + (1,) * (MAX_DIMS - len(shape))


def packed_nbytes(type, ne):
    """Bytes of a packed tensor of `type` with ggml-order ne; ValueError past int64."""
    nbytes = row_bytes(type, ne[0]) * math.prod(ne[1:])
    if nbytes > _core.INT64_MAX:
        raise ValueError(f"a {Type(type).name} tensor of {math.prod(ne)} elements needs "
                         f"{nbytes} bytes, more than int64 can count")
    return nbytes


class Tensor(_core.TensorBase):
    """A node or leaf of a graph. Created by a Context or by an op, never directly
    (Tensor() raises TypeError). `read_only`: the data is a read-only buffer
    (from_buffer of a read-only array, or a view of such a tensor); no op
    writes into it."""

    @property
    def type(self):
        """Element type (Type)."""
        return Type(self._type)

    @property
    def op(self):
        """The op that produces this tensor (Op.NONE for a leaf)."""
        return Op(self._op)

    @property
    def shape(self):
        """numpy-order shape."""
        return tuple(reversed(self._ne[:self.ndim]))

    @property
    def strides(self):
        """numpy-order byte strides."""
        return tuple(reversed(self._nb[:self.ndim]))

    @property
    def profile(self):
        """The task profile the executor uses for this node."""
        return TaskProfile._from_raw(self._profile_raw())

    @profile.setter
    def profile(self, profile):
        """Pin `profile` (one matching a profile of profiles()); the planner leaves it alone."""
        if not isinstance(profile, TaskProfile):
            raise TypeError(f"profile must be a TaskProfile, got {type(profile).__name__}")
        allowed = self.profiles()
        if not any(profile.same_code_path(p) for p in allowed):
            names = ", ".join(p.name for p in allowed)
            raise ValueError(f"{self.op.name.lower()}: profile {profile.name!r} (id {profile.id}) "
                             f"does not match any of this node's profiles: {names} "
                             f"(ids and valid stages must match)")
        self._set_profile_raw(*profile._to_raw())
        self.profile_pinned = True   # the planner leaves a profile set by hand alone

    profile_pinned = False

    def _plan_profile(self, profile):
        """Set a profile chosen by the planner (not pinned)."""
        self._set_profile_raw(*profile._to_raw())

    def default_profile(self):
        """The profile the built-in rule picks for this node (MUL_MAT: the `cpu` kernels
        up to a measured M per weight type, else ggml's rule; docs/tune.md)."""
        return TaskProfile._from_raw(self._default_profile_raw())

    def profiles(self):
        """The profiles this node's op and source types support, default first."""
        return [TaskProfile._from_raw(r) for r in self._op_profiles_raw()]

    def set_rows8(self, rows8, where="set_rows8"):
        """Give this Q4_0, Q4_K, Q5_K or Q6_K matrix (a leaf or a view: e.g. some columns of a wider
        one) a second copy of its weights, packed rows interleaved by eight as
        gg.interleave_rows8 returns them (kept alive with the tensor): MUL_MAT's SIMD kernels
        read that copy instead, faster; every other op, and the scalar kernels, read the
        tensor's own data. The copy's bytes are taken as they are (they must be those
        weights, and a later change to the tensor's own bytes does not reach them); its
        shape and layout are checked (ValueError)."""
        rows8 = np.asarray(rows8)
        if self.type not in ROWS8_TYPES or self.ndim != 2 or self.shape[0] % 8:
            raise ValueError(f"{where}: rows8 is for a Q4_0, Q4_K, Q5_K or Q6_K matrix of a "
                             f"multiple of 8 rows, not {self.type.name} {self.shape}")
        if (rows8.dtype != np.uint8 or not rows8.flags.c_contiguous
                or rows8.shape != (self.shape[0], row_bytes(self.type, self.shape[1]))
                or rows8.ctypes.data % data_alignment(self.type)):
            raise ValueError(f"{where}: rows8 must be the contiguous uint8 array that "
                             f"gg.interleave_rows8(weights, type) returns for these weights")
        self._set_rows8(rows8)

    def numpy(self):
        """A zero-copy numpy view of the data (quantized types: raw bytes per row)."""
        if self.type in NUMPY_DTYPES:
            dtype = NUMPY_DTYPES[self.type]
            shape, strides = self.shape, self.strides
        else:
            dtype = np.dtype(np.uint8)
            n_row = row_bytes(self.type, self._ne[0])
            shape = self.shape[:-1] + (n_row,)
            strides = self.strides[:-1] + (1,)
        offset = self.data_ptr - self.owner_base
        return np.ndarray(shape, dtype=dtype, buffer=self.owner, offset=offset, strides=strides)

    def __repr__(self):
        name = f" {self.name!r}" if self.name else ""
        return f"<Tensor{name} {self.type.name} {self.shape} op={self.op.name}>"


class Context(_core.Context):
    """An arena that owns tensor structs and data. mem_size is in bytes.

    >>> ctx = Context(mem_size=1 << 20)
    >>> a = ctx.new_tensor(F32, (4, 3))        # 4 rows of 3, zero-filled
    """

    def new_tensor(self, type, shape, name=None):
        """A new zero-filled leaf tensor of `type` with numpy-order `shape`."""
        type = Type.of(type, "new_tensor")
        shape = exact_shape(shape, "new_tensor")    # an iterator is read once, here
        ne = ne_of_shape(shape, "new_tensor")
        packed_nbytes(type, ne)
        t = _core.new_tensor(Tensor, self, int(type), ne, None, len(shape))
        if name:
            t.name = name
        return t

    def from_numpy(self, array, type=None, name=None):
        """A new leaf holding a copy of `array` (float32/float16/int32/...).

        With `type`, a float array is converted (e.g. to F16) on the way in.
        """
        array = np.asarray(array)
        if array.ndim == 0:
            array = array.reshape(1)
        # a copy: values in the other byte order (">f4") are read as numpy reads them
        src_type = TYPES_OF_DTYPES.get(array.dtype.newbyteorder("="))
        if type is None:
            if src_type is None:
                raise TypeError(f"from_numpy: dtype {array.dtype} has no tensor type; "
                                f"use one of {sorted(str(d) for d in TYPES_OF_DTYPES)}")
            type = src_type
        type = Type.of(type, "from_numpy")
        tensor = self.new_tensor(type, array.shape, name=name)
        if type in NUMPY_DTYPES and type != Type.BF16:
            tensor.numpy()[...] = array
        else:
            from ggml_py.core.quants import quantize   # the quant module owns conversions
            view = tensor.numpy()
            view[...] = quantize(np.asarray(array, np.float32), type).view(view.dtype).reshape(
                view.shape)
        return tensor

    def from_buffer(self, buffer, type, shape, name=None, rows8=None):
        """A leaf whose data is `buffer` itself (no copy), e.g. a memory-mapped weight.

        buffer: a C-contiguous numpy array of exactly the tensor's bytes; it is
        kept alive by the tensor. A read-only buffer (a weight mapped from a
        file) gives a read-only tensor: reading ops use it, and cpy/set_rows
        into it (or into a view of it) raise ValueError. Its bytes are taken
        as they are, so a float buffer must be of the tensor's own dtype (a
        float64 array as F32 would be read as garbage: TypeError) and every
        buffer in this machine's byte order; raw bytes (uint8, ...) may hold
        any type (quantized blocks, BF16 bits).

        rows8: for a Q4_0, Q4_K, Q5_K or Q6_K matrix of a multiple of 8 rows, the same weights
        as gg.interleave_rows8(buffer, type) gives them (kept alive too): MUL_MAT's
        SIMD kernels read that copy instead, faster (every other op, and the scalar
        kernels, read `buffer`).
        """
        type = Type.of(type, "from_buffer")
        shape = exact_shape(shape, "from_buffer")
        ne = ne_of_shape(shape, "from_buffer")
        expected = packed_nbytes(type, ne)
        buffer = np.asarray(buffer)
        if buffer.dtype.itemsize > 1 and not buffer.dtype.isnative:
            raise ValueError(f"from_buffer: the buffer's {buffer.dtype.str} is in the other byte "
                             f"order; convert it first (buffer.astype(buffer.dtype.newbyteorder('=')))")
        align = data_alignment(type)
        if buffer.ctypes.data % align:
            raise ValueError(f"from_buffer: the buffer's address is not a multiple of {align} "
                             f"bytes, which {type.name} data must start on; pass a copy "
                             f"(buffer.copy())")
        if buffer.dtype.kind in "fc" and NUMPY_DTYPES.get(type) != buffer.dtype:
            raise TypeError(f"from_buffer: a {buffer.dtype} buffer does not hold {type.name} values; "
                            f"convert it (from_numpy) or pass its bytes (buffer.view(np.uint8))")
        if not buffer.flags.c_contiguous or buffer.nbytes != expected:
            raise ValueError(f"from_buffer: {type.name} {tuple(shape)} needs {expected} contiguous "
                             f"bytes, buffer has {buffer.nbytes} "
                             f"({'contiguous' if buffer.flags.c_contiguous else 'not contiguous'})")
        t = _core.new_tensor(Tensor, self, int(type), ne, None, len(shape),
                             external=buffer)
        if rows8 is not None:
            t.set_rows8(rows8, where="from_buffer")
        if name:
            t.name = name
        return t
