"""Graph-building ops. Building does no math: each op checks its inputs, then
records a new tensor with its op, sources and parameters. Shapes are numpy order.

Broadcasting follows ggml: for add/sub/mul/div the second operand is repeated
over the first, each of its (right-aligned) dimensions dividing the first's.
"""
import contextlib
import math
import numbers
import struct
import threading

from ggml_py import _core
from ggml_py.core.tensor import MAX_DIMS, Tensor, ne_of_shape, packed_nbytes
from ggml_py.core.types import (Op, Type, data_alignment, exact_int, exact_shape, row_bytes,
                                type_traits)

# types the element-wise copy converts between (others copy only to their own type)
FLOAT_TYPES = (Type.F32, Type.F16, Type.BF16)
F32_MAX = 3.4028234663852886e38   # op params are float32

ROPE_NORMAL = 0
ROPE_NEOX = 2


def _int(opname, name, value):
    """An integer argument (a Python or numpy int, not a float or text to be
    truncated or parsed, nor a bool, which numpy refuses as an axis or a size);
    TypeError naming the op and argument otherwise."""
    number = exact_int(value)
    if number is None:
        raise TypeError(f"{opname}: {name} must be an integer, got {value!r:.40}")
    return number


def _real(what, value):
    """A real number argument as float (not text to be parsed); TypeError naming `what`."""
    if not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number, got {value!r:.40}")
    return float(value)


def _f32_bits(x, what="a parameter"):
    """A float stored in an int32 op_params slot; ValueError (naming `what`, e.g.
    "scale: s") for one beyond float32's range (inf and NaN pass, as floats do)."""
    x = _real(what, x)
    if math.isfinite(x) and abs(x) > F32_MAX:
        raise ValueError(f"{what} {x} is beyond float32's range")
    return struct.unpack("<i", struct.pack("<f", x))[0]


_placement = threading.local()


@contextlib.contextmanager
def place_results(placer):
    """Within the block, each new result that owns its data (not a view) asks
    placer.place(nbytes) where to live: None (fresh memory of its context) or
    (tensor, byte offset) inside another tensor's data; placer.created(t) is
    then told of the result. A graph allocator packs results whose lifetimes
    do not overlap into one buffer this way (see ggml_py.core.graph_alloc)."""
    previous = getattr(_placement, "placer", None)
    _placement.placer = placer
    try:
        yield placer
    finally:
        _placement.placer = previous


def _new(op, src, type, ne, ndim, params=None, nb=None, view_of=None, view_offset=0):
    """A tensor made by `op` in the context of src[0]."""
    ctx = src[0].ctx
    nbytes = packed_nbytes(type, ne)   # sizes past int64 stop here, before C
    placer = getattr(_placement, "placer", None)
    if placer is None or view_of is not None:
        return _core.new_tensor(Tensor, ctx, int(type), tuple(ne), nb, ndim, int(op), tuple(src),
                                params, view_of, view_offset)
    place = placer.place(nbytes)
    if place is not None:
        view_of, view_offset = place
        if view_of.read_only:
            raise ValueError(f"{op.name.lower()}: cannot place a result in read-only memory")
    t = _core.new_tensor(Tensor, ctx, int(type), tuple(ne), nb, ndim, int(op), tuple(src),
                         params, view_of, view_offset)
    placer.created(t)
    return t


def _check_tensor(opname, **tensors):
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{opname}: {name} must be a Tensor, got {type(t).__name__}")


def _check_type(opname, name, t, allowed):
    if t.type not in allowed:
        names = ", ".join(a.name for a in allowed)
        raise ValueError(f"{opname}: {name} is {t.type.name}, expected {names}")


def _divides(n, d):
    """d divides n, for broadcasting; a zero-size dimension matches only zero."""
    return n % d == 0 if d else n == 0


def _packed_rows(t):
    """A row's elements (or blocks) are adjacent."""
    return t._nb[0] == type_traits(t.type)["type_size"]


def _same_context(opname, *tensors):
    if any(t.ctx is not tensors[0].ctx for t in tensors):
        raise ValueError(f"{opname}: tensors belong to different contexts")


def _check_writable(opname, name, t):
    if t.read_only:
        raise ValueError(f"{opname}: {name} {t.shape} is read-only (it wraps a read-only "
                         f"buffer); copy it into a new tensor first")


def _check_float(opname, name, value, positive=False):
    """A finite float32 >= 0 (> 0 with positive)."""
    value = _real(f"{opname}: {name}", value)
    if not abs(value) <= F32_MAX or value < 0 or (positive and value == 0):   # NaN fails too
        raise ValueError(f"{opname}: {name} must be a finite number "
                         f"{'> 0' if positive else '>= 0'}, got {value}")
    return value


# ---- copies -----------------------------------------------------------------

def dup(a):
    """A contiguous copy of a (same type and shape)."""
    _check_tensor("dup", a=a)
    return _new(Op.DUP, (a,), a.type, a._ne, a.ndim)


def cont(a):
    """A contiguous copy of a possibly strided view (same type and shape)."""
    _check_tensor("cont", a=a)
    return _new(Op.CONT, (a,), a.type, a._ne, a.ndim)


def cpy(a, b):
    """Copy a into b (b may be a view); returns b's view.

    Equal types copy bits (any type); otherwise F32/F16/BF16 convert element
    by element and quantized types row by row (packed rows of one length)."""
    _check_tensor("cpy", a=a, b=b)
    _same_context("cpy", a, b)
    if _nelements(a) != _nelements(b):
        raise ValueError(f"cpy: a is {a.shape} but b is {b.shape}: element counts differ")
    _check_writable("cpy", "b", b)
    if a.type != b.type:   # a conversion: a must convert to float, b from it
        if not type_traits(a.type)["has_to_float"]:
            raise ValueError(f"cpy: cannot copy from {a.type.name}")
        if not type_traits(b.type)["has_from_float"]:
            raise ValueError(f"cpy: cannot copy to {b.type.name}")
    # the kernel converts blocks row by row; element by element it moves bits
    # (same type) or converts between F32/F16/BF16 only
    quantized = type_traits(a.type)["is_quantized"] or type_traits(b.type)["is_quantized"]
    by_rows = quantized or (a.type != b.type and not
                            (a.type in FLOAT_TYPES and b.type in FLOAT_TYPES))
    if by_rows and (a._ne[0] != b._ne[0] or not _packed_rows(a) or not _packed_rows(b)):
        raise ValueError(f"cpy: a is {a.type.name} {a.shape} but b is {b.type.name} {b.shape}: "
                         f"a quantized copy needs packed rows of the same length")
    if _may_overlap(a, b) and not _same_elements(a, b):   # as numpy's b[...] = a: all of
        a = dup(a)                                         # a is read before b is written
    return _new(Op.CPY, (a, b), b.type, b._ne, b.ndim, nb=b._nb, view_of=b)


def _may_overlap(a, b):
    """Whether a and b span common bytes: a copy from one into the other then needs a
    copy of the source first, or it reads elements it has already written (in an order
    that depends on the threads).

    Views of one tensor, and leafs (which may wrap one buffer), are compared by address;
    an op's result never shares memory with another tensor it did not come from (its
    own memory, or a graph allocator's packing that keeps live results apart — whose
    first build gives every result one stand-in address: addresses would mislead)."""
    if _nelements(a) == 0 or _nelements(b) == 0:
        return False
    root_a, root_b = _memory_of(a), _memory_of(b)
    if root_a is not root_b and (root_a.op != Op.NONE or root_b.op != Op.NONE):
        return False
    return a.data_ptr < b.data_ptr + b.nbytes and b.data_ptr < a.data_ptr + a.nbytes


# ops whose result is (a view of) the memory of a source: which source
VIEW_SOURCE = {Op.VIEW: 0, Op.RESHAPE: 0, Op.PERMUTE: 0, Op.TRANSPOSE: 0, Op.CPY: 1,
               Op.SET_ROWS: 2, Op.ALL_REDUCE: 0}


def _memory_of(t):
    """The tensor whose memory t lies in: t, or what its chain of views is a view of."""
    while t.op in VIEW_SOURCE:
        t = t.src[VIEW_SOURCE[t.op]]
    return t


def _same_elements(a, b):
    """a and b are the very same elements (a copy of one onto the other changes nothing)."""
    return (a.data_ptr, a.type, a._ne, a._nb) == (b.data_ptr, b.type, b._ne, b._nb)


def _nelements(t):
    ne = t._ne
    return ne[0] * ne[1] * ne[2] * ne[3]


# ---- element-wise -----------------------------------------------------------

def _binary(op, a, b):
    name = op.name.lower()
    _check_tensor(name, a=a, b=b)
    _same_context(name, a, b)
    _check_type(name, "a", a, (Type.F32,))
    _check_type(name, "b", b, (Type.F32,))
    # ggml's rule on the 4-D sizes: b (1, 3) repeats over a (3,) as well as b (3,) does
    if not all(_divides(na, nb_) for na, nb_ in zip(a._ne, b._ne)):
        raise ValueError(f"{name}: a is {a.shape} but b is {b.shape}: "
                         f"b cannot be broadcast over a (each dimension of b must divide a's)")
    return _new(op, (a, b), Type.F32, a._ne, a.ndim)


def add(a, b):
    """a + b, b broadcast over a (F32)."""
    return _binary(Op.ADD, a, b)


def sub(a, b):
    """a - b, b broadcast over a (F32)."""
    return _binary(Op.SUB, a, b)


def mul(a, b):
    """a * b, b broadcast over a (F32)."""
    return _binary(Op.MUL, a, b)


def div(a, b):
    """a / b, b broadcast over a (F32)."""
    return _binary(Op.DIV, a, b)


def _unary(op, a, params=None):
    name = op.name.lower()
    _check_tensor(name, a=a)
    _check_type(name, "a", a, (Type.F32,))
    return _new(op, (a,), Type.F32, a._ne, a.ndim, params)


def scale(a, s):
    """a * s for a float s."""
    return _unary(Op.SCALE, a, [_f32_bits(s, "scale: s")])


def neg(a):
    """-a."""
    return _unary(Op.NEG, a)


def sqr(a):
    """a * a."""
    return _unary(Op.SQR, a)


def sqrt(a):
    """Element-wise square root."""
    return _unary(Op.SQRT, a)


def relu(a):
    """a where a > 0, else 0 (as ggml: NaN gives 0, where numpy's maximum keeps NaN)."""
    return _unary(Op.RELU, a)


def gelu(a):
    """GELU, tanh approximation (as ggml)."""
    return _unary(Op.GELU, a)


def silu(a):
    """a * sigmoid(a)."""
    return _unary(Op.SILU, a)


def swiglu(a, b):
    """silu(a) * b, the gated FFN activation; a and b have the same shape."""
    _check_tensor("swiglu", a=a, b=b)
    _same_context("swiglu", a, b)
    _check_type("swiglu", "a", a, (Type.F32,))
    _check_type("swiglu", "b", b, (Type.F32,))
    if a._ne != b._ne:
        raise ValueError(f"swiglu: a is {a.shape} but b is {b.shape}: shapes differ")
    return _new(Op.SWIGLU, (a, b), Type.F32, a._ne, a.ndim)


# ---- reductions -------------------------------------------------------------

def sum_rows(a):
    """Sum over the last axis, kept as size 1: (..., n) -> (..., 1)."""
    _check_tensor("sum_rows", a=a)
    _check_type("sum_rows", "a", a, (Type.F32,))
    return _new(Op.SUM_ROWS, (a,), Type.F32, (1,) + a._ne[1:], a.ndim)


def mean(a):
    """Mean over the last axis, kept as size 1: (..., n) -> (..., 1)."""
    _check_tensor("mean", a=a)
    _check_type("mean", "a", a, (Type.F32,))
    return _new(Op.MEAN, (a,), Type.F32, (1,) + a._ne[1:], a.ndim)


def argmax(a):
    """Index of the largest element of each row, I32: (..., n) -> (...)."""
    _check_tensor("argmax", a=a)
    _check_type("argmax", "a", a, (Type.F32,))
    if a._ne[0] == 0:
        raise ValueError(f"argmax: a is {a.shape}: rows are empty")
    ne = a._ne[1:] + (1,)
    return _new(Op.ARGMAX, (a,), Type.I32, ne, max(1, a.ndim - 1))


# ---- normalisation ------------------------------------------------------------

def norm(a, eps=1e-5):
    """(a - mean) / sqrt(var + eps) over the last axis; eps >= 0."""
    return _unary(Op.NORM, a, [_f32_bits(_check_float("norm", "eps", eps))])


def rms_norm(a, eps=1e-6):
    """a / sqrt(mean(a^2) + eps) over the last axis; eps >= 0."""
    return _unary(Op.RMS_NORM, a, [_f32_bits(_check_float("rms_norm", "eps", eps))])


def soft_max(a, mask=None, scale=1.0):
    """softmax(a * scale + mask) over the last axis (ggml's soft_max_ext).

    mask: F32 or F16, (..., rows, n) with the same n and at least a's rows;
    its outer dimensions broadcast over a's.
    """
    _check_tensor("soft_max", a=a)
    _check_type("soft_max", "a", a, (Type.F32,))
    src = (a,)
    if mask is not None:
        _check_tensor("soft_max", mask=mask)
        _same_context("soft_max", a, mask)
        _check_type("soft_max", "mask", mask, (Type.F32, Type.F16))
        m, x = mask._ne, a._ne
        if m[0] != x[0] or m[1] < x[1] or not _divides(x[2], m[2]) or not _divides(x[3], m[3]):
            raise ValueError(f"soft_max: a is {a.shape} but mask is {mask.shape}: mask must have "
                             f"a's row length, at least its rows, and broadcast over the rest")
        if mask._nb[0] != type_traits(mask.type)["type_size"]:
            raise ValueError(f"soft_max: mask {mask.shape} rows must be contiguous")
        src = (a, mask)
    return _new(Op.SOFT_MAX, src, Type.F32, a._ne, a.ndim, [_f32_bits(scale, "soft_max: scale")])


# ---- matrix products and rows -------------------------------------------------

def mul_mat(a, b):
    """ggml's mul_mat: a (.., N, K) any type, b (.., M, K) F32 -> (.., M, N) F32.

    Result[m, n] = dot(a[n], b[m]). Outer dimensions of a broadcast over b's
    (b's must be multiples of a's), as grouped-query attention needs.
    """
    _check_tensor("mul_mat", a=a, b=b)
    _same_context("mul_mat", a, b)
    if a._ne[0] != b._ne[0]:
        raise ValueError(f"mul_mat: a is {a.shape} but b is {b.shape}: inner dimensions differ")
    # the kernel divides by a's outer sizes, so an empty one never matches
    if not all(a._ne[i] and _divides(b._ne[i], a._ne[i]) for i in (2, 3)):
        raise ValueError(f"mul_mat: a is {a.shape} but b is {b.shape}: "
                         f"a's outer dimensions must divide b's")
    _check_type("mul_mat", "b", b, (Type.F32,))
    traits = type_traits(a.type)
    if not traits["has_vec_dot"]:
        raise ValueError(f"mul_mat: a is {a.type.name}, which has no dot product kernel")
    if a._nb[0] != traits["type_size"]:
        raise ValueError(f"mul_mat: a {a.shape} must have contiguous rows (take cont() first)")
    row_bytes(a.type, a._ne[0])
    ne = (a._ne[1], b._ne[1], b._ne[2], b._ne[3])
    return _new(Op.MUL_MAT, (a, b), Type.F32, ne, max(2, a.ndim, b.ndim))


def get_rows(a, ids):
    """Rows of a picked by I32 ids, as F32: a (R, n), ids (k,) -> (k, n).

    Batched: a (B, R, n) with ids (B, k) gives (B, k, n).
    """
    _check_tensor("get_rows", a=a, ids=ids)
    _same_context("get_rows", a, ids)
    _check_type("get_rows", "ids", ids, (Type.I32,))
    if not type_traits(a.type)["has_to_float"]:
        raise ValueError(f"get_rows: a is {a.type.name}, which cannot be converted to F32")
    if ids._ne[3] != 1 or ids._ne[1] != a._ne[2] or ids._ne[2] != a._ne[3]:
        raise ValueError(f"get_rows: a is {a.shape} but ids is {ids.shape}: "
                         f"ids must be (k,) or match a's outer dimensions")
    ne = (a._ne[0], ids._ne[0], ids._ne[1], ids._ne[2])
    return _new(Op.GET_ROWS, (a, ids), Type.F32, ne, max(2, ids.ndim + 1))


def set_rows(dst, src, ids, scales=None):
    """Write the F32 rows of src into dst at I32 row ids; returns dst's view.

    dst (R, n) of F32/F16/BF16 (or any type with a from_float), src (k, n), ids (k,);
    or stacks of them, dst (P, R, n) and src (P, k, n), the same ids in every plane (the
    KV caches: a plane per head). An I8 dst holds each group of n / g values of a row as
    int8 with one F32 scale, x ~ q * scale, scale = max|x| / 127 (symmetric, rounded to
    nearest): `scales` (R, g), or (P, R, g), F32 gets the scales of the written rows (the
    int8 KV cache: g = 1 a head's row).
    """
    _check_tensor("set_rows", dst=dst, src=src, ids=ids)
    _same_context("set_rows", dst, src, ids)
    _check_type("set_rows", "src", src, (Type.F32,))
    _check_type("set_rows", "ids", ids, (Type.I32,))
    _check_writable("set_rows", "dst", dst)
    if dst.type == Type.I8:
        return _set_rows_i8(dst, src, ids, scales)
    if scales is not None:
        raise ValueError(f"set_rows: scales are written only with an I8 dst, not {dst.type.name}")
    if not type_traits(dst.type)["has_from_float"]:
        raise ValueError(f"set_rows: cannot write rows of {dst.type.name}")
    _check_set_rows_shapes(dst, src, ids)
    src, ids = (dup(t) if _may_overlap(t, dst) else t for t in (src, ids))   # read before written
    return _new(Op.SET_ROWS, (src, ids, dst), dst.type, dst._ne, dst.ndim,
                nb=dst._nb, view_of=dst)


def _check_set_rows_shapes(dst, src, ids):
    if not _packed_rows(dst):
        # rows are written whole by the type's from_float
        raise ValueError(f"set_rows: dst {dst.shape} must have contiguous rows")
    if src._ne[0] != dst._ne[0] or ids._ne[0] != src._ne[1] or ids.ndim != 1 \
            or src._ne[2] != dst._ne[2] or src._ne[3] != dst._ne[3]:
        raise ValueError(f"set_rows: dst is {dst.shape}, src is {src.shape}, ids is {ids.shape}: "
                         f"src must be (len(ids), row length of dst)")


def _set_rows_i8(dst, src, ids, scales):
    """set_rows into an I8 dst (R, n) or (P, R, n): int8 per group with its scale in
    scales (R, g) or (P, R, g)."""
    if scales is None:
        raise ValueError("set_rows: an I8 dst needs scales (R, groups) F32 for its int8 groups")
    _check_tensor("set_rows", scales=scales)
    _same_context("set_rows", dst, scales)
    _check_type("set_rows", "scales", scales, (Type.F32,))
    _check_writable("set_rows", "scales", scales)
    if dst.ndim not in (2, 3) or scales.ndim != dst.ndim or src.ndim != dst.ndim:
        raise ValueError(f"set_rows: an I8 dst {dst.shape}, its scales {scales.shape} and src "
                         f"{src.shape} must be matrices, or stacks of them")
    _check_set_rows_shapes(dst, src, ids)
    n, groups = dst.shape[-1], scales.shape[-1]
    if scales.shape[:-1] != dst.shape[:-1] or groups == 0 or n % groups or not _packed_rows(scales):
        raise ValueError(f"set_rows: scales {scales.shape} must be (rows of dst = "
                         f"{dst.shape[:-1]}, groups dividing {n}) with contiguous rows")
    if not _packed_rows(src) or _may_overlap(src, dst) or _may_overlap(src, scales):
        src = dup(src)                       # the quantizer reads each group twice, packed
    if _may_overlap(ids, dst) or _may_overlap(ids, scales):
        ids = dup(ids)
    return _new(Op.SET_ROWS, (src, ids, dst, scales), dst.type, dst._ne, dst.ndim,
                [n // groups], nb=dst._nb, view_of=dst)


def rope(a, pos, n_dims, mode=ROPE_NORMAL, freq_base=10000.0, freq_scale=1.0, freq_factors=None):
    """Rotary position embedding of a (tokens, heads, head_dim) by I32 positions (tokens,).

    mode ROPE_NORMAL rotates adjacent pairs, ROPE_NEOX the two halves of the
    first n_dims; theta_i = pos * freq_scale * freq_base^(-2i/n_dims) (/ freq_factors[i]).
    """
    _check_tensor("rope", a=a, pos=pos)
    _same_context("rope", a, pos)
    _check_type("rope", "a", a, (Type.F32,))
    _check_type("rope", "pos", pos, (Type.I32,))
    if pos.ndim != 1 or pos._ne[0] != a._ne[2]:
        raise ValueError(f"rope: a is {a.shape} but pos is {pos.shape}: "
                         f"one position per token (a's third-from-last dimension)")
    n_dims, mode = _int("rope", "n_dims", n_dims), _int("rope", "mode", mode)
    if n_dims <= 0 or n_dims % 2 or n_dims > a._ne[0]:
        raise ValueError(f"rope: n_dims={n_dims} must be even and at most the head size {a._ne[0]}")
    if mode not in (ROPE_NORMAL, ROPE_NEOX):
        raise ValueError(f"rope: mode must be ROPE_NORMAL (0) or ROPE_NEOX (2), got {mode}")
    _check_float("rope", "freq_base", freq_base, positive=True)
    _check_float("rope", "freq_scale", freq_scale, positive=True)
    src = (a, pos)
    if freq_factors is not None:
        _check_tensor("rope", freq_factors=freq_factors)
        _same_context("rope", a, freq_factors)
        _check_type("rope", "freq_factors", freq_factors, (Type.F32,))
        if freq_factors._ne[0] < n_dims // 2:
            raise ValueError(f"rope: freq_factors needs n_dims/2 = {n_dims // 2} values")
        if freq_factors._nb[0] != 4:
            # the kernel reads the factors as a packed float array
            raise ValueError(f"rope: freq_factors {freq_factors.shape} must be contiguous")
        src = (a, pos, freq_factors)
    params = [n_dims, mode, _f32_bits(freq_base, "rope: freq_base"),
              _f32_bits(freq_scale, "rope: freq_scale")]
    return _new(Op.ROPE, src, Type.F32, a._ne, a.ndim, params)


ATTENTION_TYPES = (Type.F32, Type.F16, Type.Q8_0, Type.Q4_0, Type.I8)   # with kernels of their own


def attention(q, k, v, kv_index, scale, k_scales=None, v_scales=None):
    """softmax(scale * q k^T) v for each token over its own list of cache slots.

    q (T, H, D) F32; k, v the cache pools, head-major (Hkv, slots, D) as the model's
    caches hold them, or (slots, Hkv*D) with a slot's heads side by side: F32, F16, Q8_0,
    Q4_0 or I8 (int8 per head, its scales (Hkv, slots, 1) or (slots, Hkv) F32 in k_scales
    / v_scales, as set_rows writes them; I8 and Q8_0 values in -127..127, as the
    quantizers write them: like ggml's Q8_0 dot, the integer kernels take |x| of a byte),
    or another type with a dot product (k) and a to_float (v); H a multiple of Hkv
    (query head h reads kv head h // (H // Hkv));
    kv_index I32 (2*T + N,): for token t, kv_index[2t:2t+2] = (start, count), and its slots
    are kv_index[start:start+count], in the N values after the pairs. Returns (T, H, D)
    F32; a token with no slots gets zeros. Each token's result depends only on its query
    and its slots (not on the other tokens). The node's profiles: 'slim' (the whole score
    row-block of a few query rows) and 'flash' (key tiles with an online softmax); see
    docs/attention.md.
    """
    _check_tensor("attention", q=q, k=k, v=v, kv_index=kv_index)
    _same_context("attention", q, k, v, kv_index)
    _check_type("attention", "q", q, (Type.F32,))
    _check_type("attention", "kv_index", kv_index, (Type.I32,))
    if q.ndim != 3 or k.ndim not in (2, 3) or v.ndim != k.ndim or kv_index.ndim != 1:
        raise ValueError(f"attention: q {q.shape} must be (T, H, D), k {k.shape} and v {v.shape} "
                         f"(Hkv, slots, D) or (slots, Hkv*D), kv_index {kv_index.shape} "
                         f"one-dimensional")
    T, H, D = q.shape
    if H == 0 or D == 0:
        raise ValueError(f"attention: q {q.shape} must have heads (H > 0) of values (D > 0)")
    Hkv, _ = attention_pool_shape(k, D)
    wrong_row = k.shape[-1] != D if k.ndim == 3 else k.shape[-1] % D
    if k.shape != v.shape or wrong_row or Hkv == 0 or H % Hkv:
        raise ValueError(f"attention: q is {q.shape}, k {k.shape}, v {v.shape}: k and v must be "
                         f"(Hkv, slots, {D}) or (slots, Hkv*{D}) with Hkv dividing H = {H}")
    for name, t, need, scales in (("k", k, "has_vec_dot", k_scales), ("v", v, "has_to_float", v_scales)):
        traits = type_traits(t.type)
        if t.type != Type.I8 and (not traits[need] or D % traits["blck_size"]):
            raise ValueError(f"attention: {name} of {t.type.name} cannot be read in heads of {D}")
        if not _packed_rows(t):
            raise ValueError(f"attention: {name} {t.shape} must have contiguous rows")
        _check_attention_scales(name, t, scales, k.shape[:-1] + (k.shape[-1] // D,))
    if q._nb[0] != 4 or kv_index._nb[0] != 4 or kv_index.shape[0] < 2 * T:
        raise ValueError(f"attention: q {q.shape} rows and kv_index {kv_index.shape} must be "
                         f"contiguous, kv_index at least 2*T = {2 * T} long")
    return _new(Op.ATTENTION, (q, k, v, kv_index, k_scales, v_scales), Type.F32, q._ne, 3,
                [_f32_bits(scale, "attention: scale")])


def attention_pool_shape(pool, D):
    """(Hkv, slots) of an attention cache pool, (Hkv, slots, D) or (slots, Hkv*D)."""
    if pool.ndim == 3:
        return pool.shape[0], pool.shape[1]
    return pool.shape[1] // D, pool.shape[0]


INT_MAX = 2**31 - 1     # MPI counts elements in a C int


def all_reduce(a, comm):
    """The element-wise sum of a (F32, contiguous) over the processes of comm, an mpi4py
    intracommunicator (e.g. MPI.COMM_WORLD), in place: the result is a view of a's memory,
    which MPI reads and overwrites, so the op that made a writes straight into the buffer
    MPI sends (no copy). Every process of comm must compute graphs with the same
    all_reduce nodes, in the same order, of the same size (else MPI waits for the
    missing ones). Profile: one thread calls MPI_Allreduce with the GIL released, the
    pool's workers asleep meanwhile (a single-thread stage with `wait`).
    """
    from ggml_py.core.comm import comm_params    # (imports mpi4py, which comm comes from)
    _check_tensor("all_reduce", a=a)
    _check_type("all_reduce", "a", a, (Type.F32,))
    _check_writable("all_reduce", "a", a)
    if not a.is_contiguous:
        raise ValueError(f"all_reduce: a {a.shape} must be contiguous (MPI reduces one "
                         f"buffer; take cont() first)")
    if _nelements(a) > INT_MAX:
        raise ValueError(f"all_reduce: a {a.shape} has more than {INT_MAX} elements, "
                         f"MPI_Allreduce's count")
    t = _new(Op.ALL_REDUCE, (a,), Type.F32, a._ne, a.ndim, comm_params(comm), nb=a._nb,
             view_of=a)
    t._comm = comm      # kept alive while the node lives
    return t


def _check_attention_scales(name, pool, scales, shape):
    """An I8 pool's scales: F32 of `shape` (the pool's, one value per head), contiguous
    rows; none for other types."""
    if pool.type != Type.I8:
        if scales is not None:
            raise ValueError(f"attention: {name}_scales go with an I8 {name}, not {pool.type.name}")
        return
    if scales is None:
        raise ValueError(f"attention: an I8 {name} needs {name}_scales {shape} F32")
    _check_tensor("attention", **{f"{name}_scales": scales})
    _same_context("attention", pool, scales)
    _check_type("attention", f"{name}_scales", scales, (Type.F32,))
    if scales.shape != shape or not _packed_rows(scales):
        raise ValueError(f"attention: {name}_scales {scales.shape} must be {shape} (one per "
                         f"head and slot) with contiguous rows")


def concat(a, b, axis=0):
    """Join a and b (F32) along numpy `axis`; other dimensions must match."""
    _check_tensor("concat", a=a, b=b)
    _same_context("concat", a, b)
    _check_type("concat", "a", a, (Type.F32,))
    _check_type("concat", "b", b, (Type.F32,))
    ndim = max(a.ndim, b.ndim)
    given = _int("concat", "axis", axis)
    axis = given + ndim if given < 0 else given
    if not 0 <= axis < ndim:
        raise ValueError(f"concat: axis {given} out of range for {ndim} dimensions")
    dim = ndim - 1 - axis
    if any(a._ne[i] != b._ne[i] for i in range(MAX_DIMS) if i != dim):
        raise ValueError(f"concat: a is {a.shape} but b is {b.shape}: "
                         f"shapes differ outside axis {axis}")
    ne = list(a._ne)
    ne[dim] += b._ne[dim]
    return _new(Op.CONCAT, (a, b), Type.F32, ne, ndim, [dim])


# ---- views (no copy) ------------------------------------------------------------

def view(a, shape, strides=None, offset=0):
    """A view of a's data: numpy-order shape and byte strides, at byte offset."""
    _check_tensor("view", a=a)
    shape = exact_shape(shape, "view")    # an iterator is read once, here
    ne = ne_of_shape(shape, "view")
    offset = _int("view", "offset", offset)
    traits = type_traits(a.type)
    if strides is None:
        nb = _contiguous_nb(a.type, ne)
    else:
        strides = tuple(strides)    # an iterator is read once, here
        if len(strides) != len(shape):
            raise ValueError(f"view: shape {tuple(shape)} and strides {tuple(strides)} differ in length")
        nb = tuple(reversed([_int("view", "a stride", s) for s in strides])) + (0,) * (MAX_DIMS - len(shape))
        nb = tuple(nb[i] if i < len(shape) else nb[len(shape) - 1] * ne[len(shape) - 1]
                   for i in range(MAX_DIMS))
        if nb[0] != traits["type_size"]:
            raise ValueError(f"view: the last stride must be the element size {traits['type_size']}")
    if offset < 0 or any(s < 0 for s in nb):
        raise ValueError("view: negative offset or stride")
    align = data_alignment(a.type)
    if offset % align or any(s % align for s in nb):
        raise ValueError(f"view: offset {offset} and strides {tuple(reversed(nb[:len(shape)]))} "
                         f"must be multiples of {align} bytes, where {a.type.name} data starts")
    extent = offset + row_bytes(a.type, ne[0]) + sum((ne[i] - 1) * nb[i] for i in range(1, MAX_DIMS))
    if 0 in ne:
        extent = offset
    if extent > a.nbytes:
        raise ValueError(f"view: shape {tuple(shape)} at offset {offset} needs {extent} bytes, "
                         f"a {a.shape} has {a.nbytes}")
    return _new(Op.VIEW, (a,), a.type, ne, len(shape), nb=nb, view_of=a, view_offset=offset)


def _contiguous_nb(type, ne):
    nb = [type_traits(type)["type_size"], row_bytes(type, ne[0])]
    nb += [nb[1] * ne[1], nb[1] * ne[1] * ne[2]]
    return tuple(nb)


def reshape(a, shape):
    """The same contiguous data with a new numpy-order shape."""
    _check_tensor("reshape", a=a)
    if not a.is_contiguous:
        raise ValueError(f"reshape: a {a.shape} is not contiguous (take cont() first)")
    shape = exact_shape(shape, "reshape")
    ne = ne_of_shape(shape, "reshape")
    if ne[0] * ne[1] * ne[2] * ne[3] != _nelements(a):
        raise ValueError(f"reshape: cannot reshape {a.shape} into {tuple(shape)}: element counts differ")
    row_bytes(a.type, ne[0])
    return _new(Op.RESHAPE, (a,), a.type, ne, len(shape), nb=_contiguous_nb(a.type, ne),
                view_of=a)


def permute(a, axes):
    """numpy.transpose(a, axes) without a copy: result.shape[i] = a.shape[axes[i]]."""
    return _permuted(Op.PERMUTE, a, axes)


def _permuted(op, a, axes):
    _check_tensor(op.name.lower(), a=a)
    axes = [_int("permute", "an axis", x) for x in axes]
    if sorted(axes) != list(range(a.ndim)):
        raise ValueError(f"permute: axes {tuple(axes)} are not a permutation of {a.ndim} axes")
    if type_traits(a.type)["blck_size"] != 1 and axes[-1] != a.ndim - 1:
        raise ValueError(f"permute: a {a.type.name} tensor cannot move its row axis")
    shape, strides = a.shape, a.strides
    new_shape = [shape[i] for i in axes]
    new_strides = [strides[i] for i in axes]
    ne = ne_of_shape(new_shape, "permute")
    nb = tuple(reversed(new_strides)) + tuple(a._nb[a.ndim:])
    return _new(op, (a,), a.type, ne, a.ndim, nb=nb, view_of=a)


def transpose(a):
    """Swap the last two axes without a copy."""
    _check_tensor("transpose", a=a)
    if a.ndim < 2:
        raise ValueError(f"transpose: a {a.shape} needs at least 2 dimensions")
    axes = list(range(a.ndim))
    axes[-1], axes[-2] = axes[-2], axes[-1]
    return _permuted(Op.TRANSPOSE, a, axes)
