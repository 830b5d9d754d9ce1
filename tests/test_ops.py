"""Every op against a numpy reference: odd sizes, 1-D to 4-D, non-contiguous
inputs, every thread count (bitwise equal), and bad input raising clear errors.

Tolerances: ops numpy computes the same way in float32 (add, scale, sqrt, ...)
must match exactly; the rest are compared with a float64 reference.
"""
import itertools

import numpy as np
import pytest

import ggml_py as gg
from ggml_py.core import ops as core_ops
from ggml_py.core import tensor as core_tensor
from conftest import compute, f16, make_input, same_bits, shape_id

pytestmark = pytest.mark.kernels

SHAPES = [(1,), (7,), (257,), (3, 1), (1, 33), (3, 7), (2, 3, 33), (2, 1, 3, 7), (3, 2, 5, 17)]
LAYOUTS = ("contiguous", "transposed", "permuted", "swapped", "strided")


def shape_layouts(shapes=SHAPES, layouts=LAYOUTS):
    """(shape, layout) pairs, skipping layouts a shape of that rank falls back from."""
    min_ndim = {"contiguous": 1, "strided": 1, "transposed": 2, "permuted": 3, "swapped": 3}
    return [pytest.param(s, lay, id=f"{shape_id(s)}-{lay}")
            for s in shapes for lay in layouts if len(s) >= min_ndim[lay]]


def rand(rng, shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, shape).astype(np.float32)


def assert_close(got, want, rtol, atol):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=atol)


# ---- copies -------------------------------------------------------------------

@pytest.mark.parametrize("type", [gg.F32, gg.F16], ids=["f32", "f16"])
@pytest.mark.parametrize("shape,layout", shape_layouts())
@pytest.mark.parametrize("op", [gg.dup, gg.cont], ids=["dup", "cont"])
def test_dup_cont(ctx, rng, op, shape, layout, type):
    x = rand(rng, shape)
    a = make_input(ctx, x, layout, type)
    y = op(a)
    assert y.type == type and y.shape == shape and y.is_contiguous
    got = compute(y)
    np.testing.assert_array_equal(got, x.astype(got.dtype))


CPY_TYPES = [(gg.F32, gg.F32), (gg.F32, gg.F16), (gg.F16, gg.F32), (gg.F16, gg.F16)]
CPY_SHAPES = [((7,), (7,)), ((3, 7), (3, 7)), ((2, 3, 33), (2, 3, 33)),
              ((4, 3), (2, 2, 3)), ((2, 2, 3), (4, 3)), ((2, 3, 4), (6, 4)),
              ((6, 4), (4, 6)), ((3, 5), (15,)), ((2, 1, 3, 7), (3, 14))]


def _cpy_case(rng, ctx, src_shape, dst_shape, types, layout):
    st, dt = types
    x = rand(rng, src_shape)
    a = make_input(ctx, x, layout, st)
    xv = x.astype(np.float16) if st == gg.F16 else x
    want = xv.reshape(dst_shape).astype(np.float16 if dt == gg.F16 else np.float32)
    return a, want


@pytest.mark.parametrize("types", CPY_TYPES, ids=lambda t: f"{t[0].name}-{t[1].name}")
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
@pytest.mark.parametrize("src_shape,dst_shape", CPY_SHAPES,
                         ids=[f"{shape_id(s)}-to-{shape_id(d)}" for s, d in CPY_SHAPES])
def test_cpy(ctx, rng, src_shape, dst_shape, layout, types):
    """cpy copies element k of a (numpy order) to element k of b, converting types."""
    a, want = _cpy_case(rng, ctx, src_shape, dst_shape, types, layout)
    b = ctx.new_tensor(types[1], dst_shape)
    y = gg.cpy(a, b)
    assert y.shape == dst_shape and y.type == types[1]
    got = compute(y)
    assert same_bits(got, want)
    assert same_bits(b.numpy(), want)       # y is b's memory


@pytest.mark.parametrize("types", CPY_TYPES, ids=lambda t: f"{t[0].name}-{t[1].name}")
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
@pytest.mark.parametrize("src_shape,dst_shape", [((3, 7), (3, 7)), ((2, 3, 5), (2, 3, 5)),
                                                 ((4, 6), (3, 8))],
                         ids=["3x7", "2x3x5", "4x6-to-3x8"])
def test_cpy_into_strided_view(ctx, rng, src_shape, dst_shape, layout, types):
    """cpy into a window of a bigger tensor writes the window and nothing else."""
    a, want = _cpy_case(rng, ctx, src_shape, dst_shape, types, layout)
    np_type = np.float16 if types[1] == gg.F16 else np.float32
    big_shape = tuple(d + 1 for d in dst_shape[:-1]) + (dst_shape[-1] + 3,)
    big0 = np.full(big_shape, 42.0, np_type)
    big = ctx.from_numpy(big0)
    window = gg.view(big, dst_shape, big.strides, offset=2 * big.strides[-1])
    y = gg.cpy(a, window)
    got = compute(y)
    assert same_bits(got, want)
    sel = tuple(slice(0, d) for d in dst_shape[:-1]) + (slice(2, 2 + dst_shape[-1]),)
    expect_big = big0.copy()
    expect_big[sel] = want
    assert same_bits(big.numpy(), expect_big)


# ---- f16 conversions, bit for bit against numpy ---------------------------------

def _assert_same_floats(got, want):
    """Bitwise equal, except that any NaN matches any NaN (like ggml, the
    kernels return the canonical quiet NaN where numpy keeps the payload)."""
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    bits = {2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
    g, w = got[~nan].view(bits), want[~nan].view(bits)
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (f"{bad.size} values differ, e.g. input {want[~nan][bad[:5]]}: "
                           f"got bits {[hex(v) for v in g[bad[:5]]]}, "
                           f"numpy {[hex(v) for v in w[bad[:5]]]}")


def test_f16_to_f32_every_value(ctx):
    """All 65536 half-precision bit patterns widen exactly as numpy widens them."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    a = ctx.from_numpy(h.view(np.float16))
    got = compute(gg.cpy(a, ctx.new_tensor(gg.F32, h.shape)), threads=(1, 3))
    _assert_same_floats(got, h.view(np.float16).astype(np.float32))


def _f32_to_f16_inputs(rng):
    # every finite half, the midpoints between neighbours (ties round to even)
    # and the floats just either side of them: this covers normal and subnormal
    # rounding, the overflow threshold (65520 -> inf) and underflow to zero
    h = np.arange(0x7C00 + 1, dtype=np.uint32).astype(np.uint16).view(np.float16)
    h = h.astype(np.float64)
    mid = ((h[:-1] + h[1:]) / 2).astype(np.float32)
    near = np.concatenate([mid, np.nextafter(mid, np.float32(np.inf)),
                           np.nextafter(mid, np.float32(0))])
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 65504.0, 65519.996,
                        65520.0, 1e10, -1e10, 2.0 ** -24, 2.0 ** -25, 2.0 ** -26,
                        3 * 2.0 ** -26, 2.0 ** -14, 2.0 ** -14 - 2.0 ** -25, 1e-30,
                        np.finfo(np.float32).tiny, np.finfo(np.float32).max], np.float32)
    random_bits = rng.integers(0, 1 << 32, 100_000, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([h.astype(np.float32), near, special, random_bits.view(np.float32)])
    return np.concatenate([x, -x])


def test_f32_to_f16_rounding(rng):
    """F32 -> F16 rounds to nearest even like numpy: subnormals, overflow, inf, nan."""
    x = _f32_to_f16_inputs(rng)
    ctx = gg.Context(mem_size=8 * x.nbytes)
    got = compute(gg.cpy(ctx.from_numpy(x), ctx.new_tensor(gg.F16, x.shape)))
    with np.errstate(over="ignore"):            # numpy warns on overflow to inf
        want = x.astype(np.float16)
    _assert_same_floats(got, want)


def test_f32_to_f16_strided_path(rng):
    """The element-by-element copy path (a transposed source) rounds the same way."""
    x = _f32_to_f16_inputs(rng)[:60_000].reshape(300, 200)
    ctx = gg.Context(mem_size=8 * x.nbytes)
    a = make_input(ctx, x, "transposed")
    got = compute(gg.cpy(a, ctx.new_tensor(gg.F16, x.shape)), threads=(1, 2))
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    _assert_same_floats(got, want)


# ---- element-wise binary ------------------------------------------------------

BINARY = {"add": (gg.add, np.add), "sub": (gg.sub, np.subtract),
          "mul": (gg.mul, np.multiply), "div": (gg.div, np.divide)}
BROADCASTS = [((1,), (1,)), ((7,), (7,)), ((3, 7), (7,)), ((3, 7), (1, 7)), ((3, 7), (3, 1)),
              ((4, 6), (2, 3)), ((2, 3, 33), (3, 33)), ((2, 3, 33), (2, 1, 33)),
              ((2, 6, 4, 5), (1, 3, 1, 5)), ((3, 2, 5, 257), (3, 2, 5, 257))]
LAYOUT_PAIRS = [("contiguous", "contiguous"), ("transposed", "contiguous"),
                ("contiguous", "strided"), ("permuted", "transposed"), ("swapped", "swapped"),
                ("strided", "strided")]


def repeat_like(b, shape):
    """ggml's broadcast: b (right-aligned) tiled until it has `shape`."""
    b = b.reshape((1,) * (len(shape) - b.ndim) + b.shape)
    return np.tile(b, tuple(s // d for s, d in zip(shape, b.shape)))


@pytest.mark.parametrize("layouts", LAYOUT_PAIRS, ids=lambda p: f"{p[0]}-{p[1]}")
@pytest.mark.parametrize("a_shape,b_shape", BROADCASTS,
                         ids=[f"{shape_id(a)}-by-{shape_id(b)}" for a, b in BROADCASTS])
@pytest.mark.parametrize("name", BINARY)
def test_binary(ctx, rng, name, a_shape, b_shape, layouts):
    op, ref = BINARY[name]
    x = rand(rng, a_shape)
    w = rand(rng, b_shape, 0.5, 2.0) * rng.choice([-1, 1], b_shape).astype(np.float32)
    y = op(make_input(ctx, x, layouts[0]), make_input(ctx, w, layouts[1]))
    assert y.shape == a_shape
    np.testing.assert_array_equal(compute(y), ref(x, repeat_like(w, a_shape)))


# ---- element-wise unary -------------------------------------------------------

def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * x * (1.0 + 0.044715 * x * x)))


EXACT_UNARY = {  # float32 in numpy is exactly what C computes
    "scale": (lambda a: gg.scale(a, -1.75), lambda x: x * np.float32(-1.75)),
    "neg": (gg.neg, np.negative),
    "sqr": (gg.sqr, np.square),
    "sqrt": (gg.sqrt, np.sqrt),
    "relu": (gg.relu, lambda x: np.maximum(x, np.float32(0))),
}
APPROX_UNARY = {  # transcendental: against float64
    "gelu": (gg.gelu, _gelu),
    "silu": (gg.silu, lambda x: x / (1.0 + np.exp(-x))),
}


@pytest.mark.parametrize("shape,layout", shape_layouts())
@pytest.mark.parametrize("name", list(EXACT_UNARY) + list(APPROX_UNARY))
def test_unary(ctx, rng, name, shape, layout):
    x = rand(rng, shape, -6, 6)
    if name == "sqrt":
        x = np.abs(x)
    op, ref = {**EXACT_UNARY, **APPROX_UNARY}[name]
    y = op(make_input(ctx, x, layout))
    got = compute(y)
    if name in EXACT_UNARY:
        np.testing.assert_array_equal(got, ref(x))
    else:
        assert_close(got, ref(x.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_relu_of_nan_is_zero_as_in_ggml(ctx):
    a = ctx.from_numpy(np.array([np.nan, -np.inf, -1.0, 0.0, 2.0, np.inf], np.float32))
    y = gg.relu(a)
    gg.build_forward(y).compute(n_threads=1)
    np.testing.assert_array_equal(y.numpy(), [0, 0, 0, 0, 2, np.inf])


def test_scale_zero_and_one(ctx, rng):
    x = rand(rng, (3, 7))
    a = ctx.from_numpy(x)
    np.testing.assert_array_equal(compute(gg.scale(a, 1.0)), x)
    np.testing.assert_array_equal(compute(gg.scale(a, 0.0)), np.zeros_like(x))


@pytest.mark.parametrize("shape,layout", shape_layouts())
def test_swiglu(ctx, rng, shape, layout):
    x, g = rand(rng, shape, -6, 6), rand(rng, shape)
    y = gg.swiglu(make_input(ctx, x, layout), make_input(ctx, g, "strided"))
    x64 = x.astype(np.float64)
    assert_close(compute(y), x64 / (1.0 + np.exp(-x64)) * g, rtol=1e-5, atol=1e-6)


# ---- reductions -----------------------------------------------------------------

def _kept_row_shape(shape):
    return shape[:-1] + (1,)


@pytest.mark.parametrize("shape,layout", shape_layouts())
@pytest.mark.parametrize("name", ["sum_rows", "mean"])
def test_sum_rows_mean(ctx, rng, name, shape, layout):
    x = rand(rng, shape)
    op = gg.sum_rows if name == "sum_rows" else gg.mean
    y = op(make_input(ctx, x, layout))
    assert y.shape == _kept_row_shape(shape)
    x64 = x.astype(np.float64)
    want = x64.sum(-1, keepdims=True) if name == "sum_rows" else x64.mean(-1, keepdims=True)
    assert_close(compute(y), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape,layout", shape_layouts())
def test_argmax(ctx, rng, shape, layout):
    """Small integers make ties common: the first maximum wins, as in numpy."""
    x = rng.integers(-3, 4, shape).astype(np.float32)
    y = gg.argmax(make_input(ctx, x, layout))
    assert y.type == gg.I32
    want = np.argmax(x, -1).astype(np.int32).reshape(shape[:-1] or (1,))
    np.testing.assert_array_equal(compute(y), want)


def test_argmax_negative_rows(ctx):
    x = np.array([[-5.0, -1.0, -3.0], [-np.inf, -2.0, -2.0]], np.float32)
    np.testing.assert_array_equal(compute(gg.argmax(ctx.from_numpy(x))), [1, 1])


def test_argmax_of_rows_with_nan_is_numpys():
    ctx = gg.Context(mem_size=1 << 20)
    x = np.array([[np.nan, 1, 2, 0], [1, np.nan, 5, 0], [1, 5, np.nan, np.nan]], np.float32)
    np.testing.assert_array_equal(compute(gg.argmax(ctx.from_numpy(x))), np.argmax(x, -1))


def test_gelu_at_the_ends_is_ggmls(ctx):
    x = np.array([-np.inf, -1e30, -10.0, -9.0, 9.0, 10.0, 1e30, np.inf], np.float32)
    y = compute(gg.gelu(ctx.from_numpy(x)))
    np.testing.assert_array_equal(y[:3], 0.0)
    np.testing.assert_array_equal(y[5:], x[5:])
    assert -1e-10 < y[3] <= 0 and y[4] == pytest.approx(9.0)


def test_float_parameters_beyond_float32_name_the_op(ctx):
    t = ctx.from_numpy(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="scale: s 1e\\+39 is beyond float32's range"):
        gg.scale(t, 1e39)
    with pytest.raises(ValueError, match="soft_max: scale"):
        gg.soft_max(t, scale=-1e39)


def test_a_second_operand_with_leading_ones_broadcasts_as_in_ggml(ctx):
    a, b = np.arange(3, dtype=np.float32), np.ones((1, 3), np.float32)
    y = gg.add(ctx.from_numpy(a), ctx.from_numpy(b))
    assert y.shape == (3,)
    np.testing.assert_array_equal(compute(y), a + 1)
    with pytest.raises(ValueError, match="cannot be broadcast"):
        gg.add(ctx.from_numpy(a), ctx.from_numpy(np.ones((2, 3), np.float32)))


def test_views_of_transposed_tensors_measure_their_real_extent(ctx):
    x = np.arange(60, dtype=np.float32).reshape(6, 10)
    t = gg.transpose(ctx.from_numpy(x))           # (10, 6): rows 4 bytes apart
    assert t.nbytes == 240
    np.testing.assert_array_equal(gg.view(t, (60,)).numpy(), x.ravel())   # all of x's bytes
    small = ctx.new_tensor(gg.F32, (4,))
    stride0 = gg.transpose(gg.view(small, (100, 4), strides=(0, 4)))   # 16 bytes, seen 100 times
    assert stride0.nbytes == 16
    with pytest.raises(ValueError, match="needs 412 bytes"):
        gg.view(stride0, (103,))                   # would write past the 16 bytes


# ---- normalisation ----------------------------------------------------------------

@pytest.mark.parametrize("eps", [1e-6, 0.1])
@pytest.mark.parametrize("shape,layout", shape_layouts())
@pytest.mark.parametrize("name", ["norm", "rms_norm"])
def test_norm(ctx, rng, name, shape, layout, eps):
    x = rand(rng, shape) + np.float32(0.5)
    op = gg.norm if name == "norm" else gg.rms_norm
    y = op(make_input(ctx, x, layout), eps=eps)
    x64 = x.astype(np.float64)
    if name == "norm":
        c = x64 - x64.mean(-1, keepdims=True)
        want = c / np.sqrt((c * c).mean(-1, keepdims=True) + np.float32(eps))
    else:
        want = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + np.float32(eps))
    assert_close(compute(y), want, rtol=2e-5, atol=2e-6)


# ---- soft_max ----------------------------------------------------------------------

def softmax_ref(x, scale=1.0, mask=None):
    z = x.astype(np.float64) * np.float32(scale)
    if mask is not None:
        z = z + mask
    m = z.max(-1, keepdims=True)
    e = np.where(np.isneginf(m), 0.0, np.exp(z - np.where(np.isneginf(m), 0.0, m)))
    s = e.sum(-1, keepdims=True)
    return np.divide(e, s, out=np.zeros_like(e), where=s > 0)


@pytest.mark.parametrize("scale", [1.0, 0.125])
@pytest.mark.parametrize("shape,layout", shape_layouts(
    [(1,), (7,), (1, 1), (3, 7), (2, 3, 33), (2, 4, 5, 257)],
    ["contiguous", "transposed", "swapped", "strided"]))
def test_soft_max_no_mask(ctx, rng, shape, layout, scale):
    x = rand(rng, shape, -8, 8)
    y = gg.soft_max(make_input(ctx, x, layout), scale=scale)
    assert_close(compute(y), softmax_ref(x, scale), rtol=1e-5, atol=1e-7)


# (a shape, mask shape): same rows, padded rows, broadcast over heads and batches
MASK_CASES = [((3, 7), (3, 7)), ((3, 7), (5, 7)), ((4, 3, 7), (3, 7)), ((4, 3, 33), (1, 8, 33)),
              ((2, 4, 5, 9), (1, 1, 5, 9)), ((2, 4, 5, 9), (2, 1, 5, 9)),
              ((2, 4, 5, 9), (2, 4, 6, 9))]


def _mask_values(rng, shape, kind, used_rows):
    if kind == "random":
        return rand(rng, shape, -4, 4)
    # causal: -inf above the diagonal, and the last row a uses fully masked
    rows, n = shape[-2], shape[-1]
    m = np.where(np.arange(n)[None, :] > np.arange(rows)[:, None] + 1, -np.inf, 0.0)
    m = np.broadcast_to(m, shape).astype(np.float32).copy()
    m[..., used_rows - 1, :] = -np.inf
    return m


@pytest.mark.parametrize("kind", ["random", "causal"])
@pytest.mark.parametrize("mask_type", [gg.F32, gg.F16], ids=["f32", "f16"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "swapped"])
@pytest.mark.parametrize("a_shape,m_shape", MASK_CASES,
                         ids=[f"{shape_id(a)}-mask-{shape_id(m)}" for a, m in MASK_CASES])
def test_soft_max_mask(ctx, rng, a_shape, m_shape, layout, mask_type, kind):
    x = rand(rng, a_shape, -8, 8)
    m = _mask_values(rng, m_shape, kind, a_shape[-2])
    mask = make_input(ctx, m, "contiguous", mask_type)
    y = gg.soft_max(make_input(ctx, x, layout), mask, scale=0.5)
    mv = f16(m) if mask_type == gg.F16 else m.astype(np.float64)
    rows = a_shape[-2]
    mv = repeat_like(mv[..., :rows, :], a_shape)     # first rows, broadcast over the rest
    got = compute(y)
    assert_close(got, softmax_ref(x, 0.5, mv), rtol=1e-5, atol=1e-7)
    if kind == "causal":
        np.testing.assert_array_equal(got[..., rows - 1, :], 0.0)   # fully masked rows


def test_soft_max_strided_mask(ctx, rng):
    """A mask that is a window of a wider buffer (rows a gap apart)."""
    x, m = rand(rng, (2, 3, 7)), rand(rng, (3, 7))
    mask = make_input(ctx, m, "strided")
    y = gg.soft_max(ctx.from_numpy(x), mask)
    assert_close(compute(y), softmax_ref(x, 1.0, m), rtol=1e-5, atol=1e-7)


def test_soft_max_all_masked_is_zero(ctx, rng):
    x = rand(rng, (2, 3, 5))
    mask = ctx.from_numpy(np.full((3, 5), -np.inf, np.float32))
    np.testing.assert_array_equal(compute(gg.soft_max(ctx.from_numpy(x), mask)), 0.0)


def test_soft_max_large_values(ctx):
    """Subtracting the row max keeps large logits finite."""
    x = np.array([[1000.0, 999.0, -1000.0], [88.0, 89.0, 90.0]], np.float32)
    assert_close(compute(gg.soft_max(ctx.from_numpy(x))), softmax_ref(x), rtol=1e-5, atol=1e-7)


# ---- mul_mat ---------------------------------------------------------------------------

MUL_MAT_SIZES = [(1, 1, 1), (3, 7, 5), (16, 32, 8), (33, 257, 9), (5, 64, 1), (1, 16, 17),
                 (3, 1500, 4)]   # K > 1024: strided b is gathered in pieces
# (a batch, b batch): a's outer dimensions divide b's (grouped-query attention)
MUL_MAT_BATCHES = [((), ()), ((), (4,)), ((2,), (6,)), ((3,), (3,)), ((1, 2), (3, 2)),
                   ((2, 1), (2, 3))]


def mul_mat_ref(a, b):
    """a (..., N, K), b (..., M, K) -> (..., M, N), a's batch index = b's // ratio."""
    nd = max(a.ndim, b.ndim, 2)
    a = a.reshape((1,) * (nd - a.ndim) + a.shape)
    b = b.reshape((1,) * (nd - b.ndim) + b.shape)
    out = np.zeros(b.shape[:-2] + (b.shape[-2], a.shape[-2]))
    ratio = [bb // aa for aa, bb in zip(a.shape[:-2], b.shape[:-2])]
    for idx in np.ndindex(*b.shape[:-2]):
        ia = tuple(i // r for i, r in zip(idx, ratio))
        out[idx] = b[idx] @ a[ia].T
    return out


@pytest.mark.parametrize("a_type", [gg.F32, gg.F16], ids=["f32", "f16"])
@pytest.mark.parametrize("b_layout", LAYOUTS)
@pytest.mark.parametrize("n,k,m", MUL_MAT_SIZES,
                         ids=[f"N{n}-K{k}-M{m}" for n, k, m in MUL_MAT_SIZES])
def test_mul_mat(ctx, rng, n, k, m, b_layout, a_type):
    x, w = rand(rng, (n, k), -1, 1), rand(rng, (m, k), -1, 1)
    y = gg.mul_mat(make_input(ctx, x, "contiguous", a_type), make_input(ctx, w, b_layout))
    assert y.shape == (m, n) and y.type == gg.F32
    a64, b64 = (f16(x), f16(w)) if a_type == gg.F16 else (x.astype(np.float64), w)
    assert_close(compute(y), mul_mat_ref(a64, b64), rtol=1e-5, atol=2e-6 * k)


@pytest.mark.parametrize("a_type", [gg.F32, gg.F16], ids=["f32", "f16"])
@pytest.mark.parametrize("b_layout", ["contiguous", "permuted", "swapped", "strided"])
@pytest.mark.parametrize("a_batch,b_batch", MUL_MAT_BATCHES,
                         ids=[f"a{shape_id(a) or 1}-b{shape_id(b) or 1}"
                              for a, b in MUL_MAT_BATCHES])
def test_mul_mat_batched(ctx, rng, a_batch, b_batch, b_layout, a_type):
    n, k, m = 5, 19, 3
    x, w = rand(rng, a_batch + (n, k), -1, 1), rand(rng, b_batch + (m, k), -1, 1)
    y = gg.mul_mat(make_input(ctx, x, "contiguous", a_type), make_input(ctx, w, b_layout))
    a64, b64 = (f16(x), f16(w)) if a_type == gg.F16 else (x.astype(np.float64), w)
    want = mul_mat_ref(a64, b64)
    assert y.shape == want.shape
    assert_close(compute(y), want, rtol=1e-5, atol=2e-6 * k)


def test_mul_mat_gqa_heads(ctx, rng):
    """a (2, N, K) over b (6, M, K): b's heads 0-2 use a's head 0, 3-5 head 1."""
    x, w = rand(rng, (2, 4, 8)), rand(rng, (6, 3, 8))
    got = compute(gg.mul_mat(ctx.from_numpy(x), ctx.from_numpy(w)))
    for h in range(6):
        assert_close(got[h], w[h].astype(np.float64) @ x[h // 3].T, rtol=1e-5, atol=1e-5)


def test_mul_mat_a_view_with_offset(ctx, rng):
    """a may be a window of rows (packed rows, any row stride) starting mid-buffer."""
    big, w = rand(rng, (9, 12)), rand(rng, (4, 7))
    t = ctx.from_numpy(big)
    a = gg.view(t, (5, 7), (big.strides[0] * 1, 4), offset=2 * big.strides[0] + 12)
    want = w.astype(np.float64) @ big[2:7, 3:10].T
    assert_close(compute(gg.mul_mat(a, ctx.from_numpy(w))), want, rtol=1e-5, atol=1e-5)


# ---- get_rows / set_rows ------------------------------------------------------------------

GET_ROWS_CASES = [((5, 7), (4,)), ((1, 1), (3,)), ((33, 257), (9,)), ((3, 5, 7), (3, 4)),
                  ((2, 3, 5, 7), (2, 3, 4))]


@pytest.mark.parametrize("ids_layout", ["contiguous", "strided"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
@pytest.mark.parametrize("a_type", [gg.F32, gg.F16], ids=["f32", "f16"])
@pytest.mark.parametrize("a_shape,ids_shape", GET_ROWS_CASES,
                         ids=[f"{shape_id(a)}-ids-{shape_id(i)}" for a, i in GET_ROWS_CASES])
def test_get_rows(ctx, rng, a_shape, ids_shape, a_type, layout, ids_layout):
    x = rand(rng, a_shape)
    ids = rng.integers(0, a_shape[-2], ids_shape).astype(np.int32)   # repeats allowed
    y = gg.get_rows(make_input(ctx, x, layout, a_type), make_input(ctx, ids, ids_layout))
    xv = x.astype(np.float16).astype(np.float32) if a_type == gg.F16 else x
    want = np.take_along_axis(xv, ids.reshape(ids_shape[:-1] + ids_shape[-1:] + (1,)), axis=-2) \
        if len(a_shape) > 2 else xv[ids]
    assert y.shape == want.shape and y.type == gg.F32
    np.testing.assert_array_equal(compute(y), want)


SET_ROWS_CASES = [((5, 7), 3), ((1, 1), 1), ((9, 33), 9), ((2, 6, 5), 4), ((2, 3, 6, 5), 2),
                  ((4, 600), 2)]   # a strided row longer than the kernel's gather buffer


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "swapped", "strided"])
@pytest.mark.parametrize("dst_type", [gg.F32, gg.F16], ids=["f32", "f16"])
@pytest.mark.parametrize("dst_shape,k", SET_ROWS_CASES,
                         ids=[f"{shape_id(d)}-k{k}" for d, k in SET_ROWS_CASES])
def test_set_rows(ctx, rng, dst_shape, k, dst_type, layout):
    np_type = np.float16 if dst_type == gg.F16 else np.float32
    dst0 = rand(rng, dst_shape).astype(np_type)
    src = rand(rng, dst_shape[:-2] + (k, dst_shape[-1]))
    ids = rng.permutation(dst_shape[-2])[:k].astype(np.int32)   # distinct: no write races
    dst = ctx.from_numpy(dst0)
    y = gg.set_rows(dst, make_input(ctx, src, layout), ctx.from_numpy(ids))
    assert y.shape == dst_shape and y.type == dst_type

    def reset():
        dst.numpy()[...] = dst0

    got = compute(y, fill=False, before=reset)
    want = dst0.copy()
    want[..., ids, :] = src.astype(np_type)
    assert same_bits(got, want)


@pytest.mark.parametrize("n_threads", [1, 2, 4])
def test_a_copy_from_memory_it_overwrites_reads_all_of_it_first(ctx, n_threads):
    # as numpy's a[...] = a.T and d[[1, 2]] = d[[0, 1]]: the source is read whole before
    # the destination is written, at every thread count
    a0 = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    a = ctx.from_numpy(a0)
    y = gg.cpy(gg.transpose(a), a)
    assert gg.Op.DUP in [t.op for t in gg.build_forward(y).nodes]
    gg.build_forward(y).compute(n_threads=n_threads)
    assert np.array_equal(a.numpy(), a0.T)

    d0 = np.arange(12, dtype=np.float32).reshape(4, 3)
    d = ctx.from_numpy(d0)
    gg.build_forward(gg.set_rows(d, gg.view(d, (2, 3)), ctx.from_numpy(np.array([1, 2], np.int32)))
                     ).compute(n_threads=n_threads)
    want = d0.copy()
    want[[1, 2]] = d0[[0, 1]]
    assert np.array_equal(d.numpy(), want)

    p0 = np.arange(4 * 64, dtype=np.float32).reshape(4, 64)      # d[ids] = d: a permutation
    p = ctx.from_numpy(p0)
    gg.build_forward(gg.set_rows(p, p, ctx.from_numpy(np.array([1, 0, 3, 2], np.int32)))
                     ).compute(n_threads=n_threads)
    assert np.array_equal(p.numpy(), p0[[1, 0, 3, 2]])


def test_copies_between_disjoint_parts_of_one_tensor_copy_nothing_extra(ctx):
    b0 = np.arange(8, dtype=np.float32)
    b = ctx.from_numpy(b0)
    top, bottom = gg.view(b, (4,)), gg.view(b, (4,), offset=16)
    for y in (gg.cpy(top, bottom), gg.cpy(b, b)):     # apart, or the very same elements
        assert [t.op for t in gg.build_forward(y).nodes if t.op == gg.Op.DUP] == []
    gg.build_forward(gg.cpy(top, bottom)).compute(n_threads=2)
    assert np.array_equal(b.numpy(), np.r_[b0[:4], b0[:4]])


def test_a_row_id_into_no_rows_says_so(ctx):
    ids = ctx.from_numpy(np.array([0], np.int32))
    y = gg.get_rows(ctx.new_tensor(gg.F32, (0, 3)), ids)
    with pytest.raises(ValueError, match=r"^get_rows: row id 0 asks for a row of a \(0, 3\), "
                                         r"which has none \(node 0\)$"):
        gg.build_forward(y).compute(n_threads=1)


def _bad_ids_graph(ctx, which, bad_id):
    x = ctx.from_numpy(np.arange(15, dtype=np.float32).reshape(5, 3))
    ids = ctx.from_numpy(np.array([0, bad_id, 2], np.int32))
    if which == "get_rows":
        y = gg.get_rows(gg.scale(x, 2.0), ids)           # node 1: get_rows
    else:
        src = ctx.from_numpy(np.ones((3, 3), np.float32))
        y = gg.set_rows(x, gg.scale(src, 2.0), ids)        # node 1: set_rows
    return y, ids


@pytest.mark.parametrize("n_threads", [1, 2, 8])
@pytest.mark.parametrize("bad_id", [5, -1, 2 ** 31 - 1])
@pytest.mark.parametrize("which", ["get_rows", "set_rows"])
def test_row_id_out_of_range_raises_at_compute(ctx, which, bad_id, n_threads):
    y, ids = _bad_ids_graph(ctx, which, bad_id)
    graph = gg.build_forward(y)
    # the id, the rows there are and the shapes
    with pytest.raises(ValueError, match=rf"^{which}: row id {bad_id} is outside 0..4 \(a \(5, 3\) "
                                         rf"has 5 rows in each matrix; ids \(3,\)\) \(node 1\)$"):
        graph.compute(n_threads=n_threads)
    ids.numpy()[1] = 1                        # fixed: the same graph (and pool) work again
    graph.compute(n_threads=n_threads)
    if which == "get_rows":
        np.testing.assert_array_equal(y.numpy(), 2 * np.arange(15).reshape(5, 3)[[0, 1, 2]])


# ---- rope ----------------------------------------------------------------------------

def rope_ref(x, pos, n_dims, mode, base, scale, factors):
    """Independent float64 RoPE: theta_i = pos * scale * base^(-2i/n_dims) / factor_i."""
    x = x.astype(np.float64)
    out = x.copy()
    half = n_dims // 2
    i = np.arange(half)
    theta = pos.astype(np.float64)[:, None] * scale * float(base) ** (-2.0 * i / n_dims)
    if factors is not None:
        theta = theta / factors[:half].astype(np.float64)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]    # (tokens, 1, half)
    j0, j1 = (i, i + half) if mode == gg.ROPE_NEOX else (2 * i, 2 * i + 1)
    x0, x1 = x[..., j0], x[..., j1]
    out[..., j0] = x0 * c - x1 * s
    out[..., j1] = x0 * s + x1 * c
    return out


ROPE_SHAPES = [(1, 1, 2), (3, 2, 8), (5, 3, 64), (7, 1, 10), (2, 3, 2, 8)]
ROPE_FREQS = [(10000.0, 1.0, False), (500000.0, 0.25, False), (10000.0, 1.0, True),
              (1e6, 0.5, True)]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("freq", ROPE_FREQS, ids=lambda f: f"base{f[0]:g}-scale{f[1]:g}"
                         f"{'-factors' if f[2] else ''}")
@pytest.mark.parametrize("n_dims_of", ["full", "partial"])
@pytest.mark.parametrize("mode", [gg.ROPE_NORMAL, gg.ROPE_NEOX], ids=["normal", "neox"])
@pytest.mark.parametrize("shape", ROPE_SHAPES, ids=shape_id)
def test_rope(ctx, rng, shape, mode, n_dims_of, freq, layout):
    head_dim = shape[-1]
    n_dims = head_dim if n_dims_of == "full" else max(2, head_dim - 2 * (head_dim // 4))
    base, scale, with_factors = freq
    x = rand(rng, shape)
    pos = rng.integers(0, 100, shape[-3]).astype(np.int32)
    pos[0] = 0
    factors = rng.uniform(1.0, 4.0, n_dims // 2).astype(np.float32) if with_factors else None
    a = make_input(ctx, x, layout)
    ff = ctx.from_numpy(factors) if with_factors else None
    y = gg.rope(a, ctx.from_numpy(pos), n_dims, mode, freq_base=base, freq_scale=scale,
                freq_factors=ff)
    want = rope_ref(x, pos, n_dims, mode, base, scale, factors)
    got = compute(y)
    assert_close(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got[..., n_dims:], x[..., n_dims:])   # tail passes through


def test_rope_position_zero_is_identity(ctx, rng):
    x = rand(rng, (1, 4, 16))
    y = gg.rope(ctx.from_numpy(x), ctx.from_numpy(np.zeros(1, np.int32)), 16, gg.ROPE_NEOX)
    np.testing.assert_array_equal(compute(y), x)


def test_rope_positions_at_offset(ctx, rng):
    """Positions may be a window of a longer I32 tensor."""
    x = rand(rng, (4, 2, 8))
    pos = np.array([3, 0, 7, 1], np.int32)
    y = gg.rope(ctx.from_numpy(x), make_input(ctx, pos, "strided"), 8)
    want = rope_ref(x, pos, 8, gg.ROPE_NORMAL, 10000.0, 1.0, None)
    assert_close(compute(y), want, rtol=1e-4, atol=1e-4)


# ---- concat ---------------------------------------------------------------------------

CONCAT_CASES = [((7,), 0), ((3, 7), 0), ((3, 7), 1), ((2, 3, 5), 0), ((2, 3, 5), 1),
                ((2, 3, 5), 2), ((2, 3, 4, 5), 0), ((2, 3, 4, 5), 1), ((2, 3, 4, 5), 2),
                ((2, 3, 4, 5), 3), ((2, 3, 4, 5), -1)]


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "swapped", "strided"])
@pytest.mark.parametrize("shape,axis", CONCAT_CASES,
                         ids=[f"{shape_id(s)}-axis{ax}" for s, ax in CONCAT_CASES])
def test_concat(ctx, rng, shape, axis, layout):
    x = rand(rng, shape)
    b_shape = list(shape)
    b_shape[axis] = 2
    w = rand(rng, tuple(b_shape))
    y = gg.concat(make_input(ctx, x, layout), make_input(ctx, w, "strided"), axis=axis)
    want = np.concatenate([x, w], axis=axis)
    assert y.shape == want.shape
    np.testing.assert_array_equal(compute(y), want)


# ---- views --------------------------------------------------------------------------------

def test_view_window(ctx, rng):
    x = rand(rng, (4, 6))
    t = ctx.from_numpy(x)
    v = gg.view(t, (3, 5), (24, 4), offset=4)
    assert v.op == gg.Op.VIEW and v.shape == (3, 5) and not v.is_contiguous
    np.testing.assert_array_equal(v.numpy(), x[:3, 1:6])
    np.testing.assert_array_equal(compute(gg.cont(v)), x[:3, 1:6])


def test_view_contiguous_reinterprets(ctx, rng):
    x = rand(rng, (4, 6))
    v = gg.view(ctx.from_numpy(x), (2, 5), offset=8)
    assert v.is_contiguous
    np.testing.assert_array_equal(v.numpy(), x.ravel()[2:12].reshape(2, 5))


def test_view_aliases_data(ctx):
    t = ctx.new_tensor(gg.F32, (3, 4))
    v = gg.view(t, (2, 2), (16, 4), offset=20)
    v.numpy()[...] = 9.0
    assert t.numpy()[1:3, 1:3].tolist() == [[9.0, 9.0], [9.0, 9.0]]
    assert t.numpy().sum() == 36.0


@pytest.mark.parametrize("src,dst", [((2, 3, 4), (6, 4)), ((2, 3, 4), (24,)), ((24,), (2, 3, 4)),
                                     ((2, 3, 4), (4, 3, 2)), ((6, 4), (1, 2, 3, 4))],
                         ids=lambda s: shape_id(s))
def test_reshape(ctx, rng, src, dst):
    x = rand(rng, src)
    r = gg.reshape(ctx.from_numpy(x), dst)
    assert r.op == gg.Op.RESHAPE and r.shape == dst and r.is_contiguous
    np.testing.assert_array_equal(r.numpy(), x.reshape(dst))
    np.testing.assert_array_equal(compute(gg.sqr(r)), np.square(x.reshape(dst)))


PERMS = list(itertools.permutations(range(3))) + [(3, 1, 0, 2), (1, 0, 3, 2), (0, 2, 3, 1),
                                                  (3, 2, 1, 0)]


@pytest.mark.parametrize("axes", PERMS, ids=lambda p: "".join(map(str, p)))
def test_permute(ctx, rng, axes):
    shape = (2, 3, 5, 7)[:len(axes)]
    x = rand(rng, shape)
    p = gg.permute(ctx.from_numpy(x), axes)
    want = np.transpose(x, axes)
    assert p.op == gg.Op.PERMUTE and p.shape == want.shape
    np.testing.assert_array_equal(p.numpy(), want)
    np.testing.assert_array_equal(compute(gg.cont(p)), want)


@pytest.mark.parametrize("shape", [(3, 7), (2, 3, 5), (2, 1, 3, 4)], ids=shape_id)
def test_transpose(ctx, rng, shape):
    x = rand(rng, shape)
    t = gg.transpose(ctx.from_numpy(x))
    want = np.swapaxes(x, -1, -2)
    assert t.op == gg.Op.TRANSPOSE and t.shape == want.shape
    np.testing.assert_array_equal(t.numpy(), want)
    np.testing.assert_array_equal(compute(gg.cont(t)), want)
    np.testing.assert_array_equal(compute(gg.cont(gg.transpose(t))), x)


def test_graph_of_views_only(ctx, rng):
    x = rand(rng, (2, 3))
    v = gg.transpose(gg.reshape(ctx.from_numpy(x), (3, 2)))
    gg.build_forward(v).compute(n_threads=2)
    np.testing.assert_array_equal(v.numpy(), x.reshape(3, 2).T)


# ---- bad input ------------------------------------------------------------------------------

def _t(ctx, shape, type=gg.F32):
    return ctx.new_tensor(type, shape)


BAD_BUILDS = {
    # name: (build(ctx), exception, message regex)
    "add-shapes": (lambda c: gg.add(_t(c, (3, 7)), _t(c, (3, 5))), ValueError,
                   r"^add: a is \(3, 7\) but b is \(3, 5\): b cannot be broadcast"),
    "sub-not-dividing": (lambda c: gg.sub(_t(c, (3, 7)), _t(c, (2, 7))), ValueError,
                         r"^sub: a is \(3, 7\) but b is \(2, 7\)"),
    "mul-more-dims": (lambda c: gg.mul(_t(c, (3, 7)), _t(c, (2, 3, 7))), ValueError,
                      r"^mul: a is \(3, 7\) but b is \(2, 3, 7\)"),
    "div-f16": (lambda c: gg.div(_t(c, (3,), gg.F16), _t(c, (3,))), ValueError,
                r"^div: a is F16, expected F32"),
    "add-i32-b": (lambda c: gg.add(_t(c, (3,)), _t(c, (3,), gg.I32)), ValueError,
                  r"^add: b is I32, expected F32"),
    "add-contexts": (lambda c: gg.add(_t(c, (3,)), _t(gg.Context(1 << 16), (3,))), ValueError,
                     r"^add: tensors belong to different contexts"),
    "add-not-tensor": (lambda c: gg.add(_t(c, (3,)), np.ones(3, np.float32)), TypeError,
                       r"^add: b must be a Tensor, got ndarray"),
    "scale-i32": (lambda c: gg.scale(_t(c, (3,), gg.I32), 2.0), ValueError,
                  r"^scale: a is I32, expected F32"),
    "gelu-f16": (lambda c: gg.gelu(_t(c, (3,), gg.F16)), ValueError, r"^gelu: a is F16"),
    "swiglu-shapes": (lambda c: gg.swiglu(_t(c, (3, 4)), _t(c, (4, 3))), ValueError,
                      r"^swiglu: a is \(3, 4\) but b is \(4, 3\): shapes differ"),
    "sum_rows-f16": (lambda c: gg.sum_rows(_t(c, (3,), gg.F16)), ValueError,
                     r"^sum_rows: a is F16"),
    "mean-i32": (lambda c: gg.mean(_t(c, (3,), gg.I32)), ValueError, r"^mean: a is I32"),
    "argmax-empty": (lambda c: gg.argmax(_t(c, (3, 0))), ValueError,
                     r"^argmax: a is \(3, 0\): rows are empty"),
    "norm-f16": (lambda c: gg.norm(_t(c, (3,), gg.F16)), ValueError, r"^norm: a is F16"),
    "rms_norm-i32": (lambda c: gg.rms_norm(_t(c, (3,), gg.I32)), ValueError,
                     r"^rms_norm: a is I32"),
    "soft_max-mask-width": (lambda c: gg.soft_max(_t(c, (3, 7)), _t(c, (3, 6))), ValueError,
                            r"^soft_max: a is \(3, 7\) but mask is \(3, 6\)"),
    "soft_max-mask-rows": (lambda c: gg.soft_max(_t(c, (3, 7)), _t(c, (2, 7))), ValueError,
                           r"^soft_max: a is \(3, 7\) but mask is \(2, 7\)"),
    "soft_max-mask-heads": (lambda c: gg.soft_max(_t(c, (4, 3, 7)), _t(c, (3, 3, 7))), ValueError,
                            r"^soft_max: a is \(4, 3, 7\) but mask is \(3, 3, 7\)"),
    "soft_max-mask-type": (lambda c: gg.soft_max(_t(c, (3, 7)), _t(c, (3, 7), gg.I32)), ValueError,
                           r"^soft_max: mask is I32, expected F32, F16"),
    "soft_max-mask-transposed": (lambda c: gg.soft_max(_t(c, (3, 3)), gg.transpose(_t(c, (3, 3)))),
                                 ValueError, r"^soft_max: mask \(3, 3\) rows must be contiguous"),
    "mul_mat-inner": (lambda c: gg.mul_mat(_t(c, (4, 3)), _t(c, (2, 5))), ValueError,
                      r"^mul_mat: a is \(4, 3\) but b is \(2, 5\): inner dimensions differ$"),
    "mul_mat-batch": (lambda c: gg.mul_mat(_t(c, (4, 2, 3)), _t(c, (6, 2, 3))), ValueError,
                      r"^mul_mat: a is \(4, 2, 3\) but b is \(6, 2, 3\): a's outer dimensions"),
    "mul_mat-a-batched-b-not": (lambda c: gg.mul_mat(_t(c, (2, 2, 3)), _t(c, (2, 3))), ValueError,
                                r"^mul_mat: a is \(2, 2, 3\) but b is \(2, 3\)"),
    "mul_mat-b-f16": (lambda c: gg.mul_mat(_t(c, (4, 3)), _t(c, (2, 3), gg.F16)), ValueError,
                      r"^mul_mat: b is F16, expected F32"),
    "mul_mat-a-i32": (lambda c: gg.mul_mat(_t(c, (4, 3), gg.I32), _t(c, (2, 3))), ValueError,
                      r"^mul_mat: a is I32, which has no dot product kernel"),
    "mul_mat-a-transposed": (lambda c: gg.mul_mat(gg.transpose(_t(c, (3, 4))), _t(c, (2, 3))),
                             ValueError, r"^mul_mat: a \(4, 3\) must have contiguous rows"),
    "get_rows-ids-f32": (lambda c: gg.get_rows(_t(c, (5, 3)), _t(c, (2,))), ValueError,
                         r"^get_rows: ids is F32, expected I32"),
    "get_rows-batch": (lambda c: gg.get_rows(_t(c, (2, 5, 3)), _t(c, (3, 4), gg.I32)), ValueError,
                       r"^get_rows: a is \(2, 5, 3\) but ids is \(3, 4\)"),
    "get_rows-a-i32": (lambda c: gg.get_rows(_t(c, (5, 3), gg.I32), _t(c, (2,), gg.I32)),
                       ValueError, r"^get_rows: a is I32, which cannot be converted to F32"),
    "set_rows-row-length": (lambda c: gg.set_rows(_t(c, (5, 3)), _t(c, (2, 4)),
                                                  _t(c, (2,), gg.I32)),
                            ValueError, r"^set_rows: dst is \(5, 3\), src is \(2, 4\), "
                                        r"ids is \(2,\)"),
    "set_rows-ids-count": (lambda c: gg.set_rows(_t(c, (5, 3)), _t(c, (2, 3)),
                                                 _t(c, (3,), gg.I32)),
                           ValueError, r"^set_rows: dst is \(5, 3\), src is \(2, 3\), "
                                       r"ids is \(3,\)"),
    "set_rows-dst-i32": (lambda c: gg.set_rows(_t(c, (5, 3), gg.I32), _t(c, (2, 3)),
                                               _t(c, (2,), gg.I32)),
                         ValueError, r"^set_rows: cannot write rows of I32"),
    "set_rows-src-f16": (lambda c: gg.set_rows(_t(c, (5, 3)), _t(c, (2, 3), gg.F16),
                                               _t(c, (2,), gg.I32)),
                         ValueError, r"^set_rows: src is F16, expected F32"),
    "set_rows-dst-transposed": (lambda c: gg.set_rows(gg.transpose(_t(c, (3, 5))), _t(c, (2, 3)),
                                                      _t(c, (2,), gg.I32)),
                                ValueError, r"^set_rows: dst \(5, 3\) must have contiguous rows"),
    "rope-odd-n_dims": (lambda c: gg.rope(_t(c, (2, 1, 8)), _t(c, (2,), gg.I32), 5), ValueError,
                        r"^rope: n_dims=5 must be even and at most the head size 8"),
    "rope-zero-n_dims": (lambda c: gg.rope(_t(c, (2, 1, 8)), _t(c, (2,), gg.I32), 0), ValueError,
                         r"^rope: n_dims=0"),
    "rope-big-n_dims": (lambda c: gg.rope(_t(c, (2, 1, 8)), _t(c, (2,), gg.I32), 10), ValueError,
                        r"^rope: n_dims=10 must be even and at most the head size 8"),
    "rope-mode": (lambda c: gg.rope(_t(c, (2, 1, 8)), _t(c, (2,), gg.I32), 8, mode=1), ValueError,
                  r"^rope: mode must be ROPE_NORMAL \(0\) or ROPE_NEOX \(2\), got 1"),
    "rope-positions": (lambda c: gg.rope(_t(c, (2, 1, 8)), _t(c, (3,), gg.I32), 8), ValueError,
                       r"^rope: a is \(2, 1, 8\) but pos is \(3,\)"),
    "rope-pos-f32": (lambda c: gg.rope(_t(c, (2, 1, 8)), _t(c, (2,)), 8), ValueError,
                     r"^rope: pos is F32, expected I32"),
    "rope-a-f16": (lambda c: gg.rope(_t(c, (2, 1, 8), gg.F16), _t(c, (2,), gg.I32), 8), ValueError,
                   r"^rope: a is F16"),
    "rope-factors-short": (lambda c: gg.rope(_t(c, (2, 1, 8)), _t(c, (2,), gg.I32), 8,
                                             freq_factors=_t(c, (3,))),
                           ValueError, r"^rope: freq_factors needs n_dims/2 = 4 values"),
    "rope-factors-not-tensor": (lambda c: gg.rope(_t(c, (2, 1, 8)), _t(c, (2,), gg.I32), 8,
                                                  freq_factors=np.ones(4, np.float32)),
                                TypeError, r"^rope: freq_factors must be a Tensor"),
    "rope-factors-strided": (lambda c: gg.rope(_t(c, (2, 1, 8)), _t(c, (2,), gg.I32), 8,
                                               freq_factors=gg.transpose(_t(c, (4, 2)))),
                             ValueError, r"^rope: freq_factors \(2, 4\) must be contiguous"),
    "concat-axis": (lambda c: gg.concat(_t(c, (2, 3)), _t(c, (2, 3)), axis=2), ValueError,
                    r"^concat: axis 2 out of range for 2 dimensions"),
    "concat-shapes": (lambda c: gg.concat(_t(c, (2, 3)), _t(c, (3, 4)), axis=0), ValueError,
                      r"^concat: a is \(2, 3\) but b is \(3, 4\): shapes differ outside axis 0"),
    "concat-f16": (lambda c: gg.concat(_t(c, (2, 3), gg.F16), _t(c, (2, 3), gg.F16)), ValueError,
                   r"^concat: a is F16"),
    "view-out-of-bounds": (lambda c: gg.view(_t(c, (2, 3)), (3, 3)), ValueError,
                           r"^view: shape \(3, 3\) at offset 0 needs 36 bytes, a \(2, 3\) has 24"),
    "view-offset": (lambda c: gg.view(_t(c, (2, 3)), (2, 3), offset=4), ValueError,
                    r"^view: shape \(2, 3\) at offset 4 needs 28 bytes"),
    "view-strides-out": (lambda c: gg.view(_t(c, (4, 3)), (2, 3), (40, 4)), ValueError,
                         r"^view: shape \(2, 3\) at offset 0 needs 52 bytes, a \(4, 3\) has 48"),
    "view-negative-offset": (lambda c: gg.view(_t(c, (2, 3)), (1, 3), offset=-4), ValueError,
                             r"^view: negative offset or stride"),
    "view-strides-length": (lambda c: gg.view(_t(c, (2, 3)), (2, 3), (12,)), ValueError,
                            r"^view: shape \(2, 3\) and strides \(12,\) differ in length"),
    "view-last-stride": (lambda c: gg.view(_t(c, (2, 6)), (2, 3), (24, 8)), ValueError,
                         r"^view: the last stride must be the element size 4"),
    "reshape-count": (lambda c: gg.reshape(_t(c, (2, 3)), (4, 2)), ValueError,
                      r"^reshape: cannot reshape \(2, 3\) into \(4, 2\): element counts differ"),
    "reshape-non-contiguous": (lambda c: gg.reshape(gg.transpose(_t(c, (2, 3))), (6,)), ValueError,
                               r"^reshape: a \(3, 2\) is not contiguous \(take cont\(\) first\)"),
    "reshape-strided-view": (lambda c: gg.reshape(gg.view(_t(c, (4, 6)), (3, 5), (24, 4)), (15,)),
                             ValueError, r"^reshape: a \(3, 5\) is not contiguous"),
    "permute-repeat": (lambda c: gg.permute(_t(c, (2, 3, 4)), (0, 0, 1)), ValueError,
                       r"^permute: axes \(0, 0, 1\) are not a permutation of 3 axes"),
    "permute-count": (lambda c: gg.permute(_t(c, (2, 3, 4)), (1, 0)), ValueError,
                      r"^permute: axes \(1, 0\) are not a permutation of 3 axes"),
    "permute-range": (lambda c: gg.permute(_t(c, (2, 3, 4)), (0, 1, 3)), ValueError,
                      r"^permute: axes \(0, 1, 3\) are not a permutation"),
    "transpose-1d": (lambda c: gg.transpose(_t(c, (3,))), ValueError,
                     r"^transpose: a \(3,\) needs at least 2 dimensions"),
    "cpy-count": (lambda c: gg.cpy(_t(c, (2, 3)), _t(c, (7,))), ValueError,
                  r"^cpy: a is \(2, 3\) but b is \(7,\): element counts differ"),
    "cpy-to-i32": (lambda c: gg.cpy(_t(c, (2, 3)), _t(c, (6,), gg.I32)), ValueError,
                   r"^cpy: cannot copy to I32"),
    "cpy-from-i32": (lambda c: gg.cpy(_t(c, (6,), gg.I32), _t(c, (2, 3))), ValueError,
                     r"^cpy: cannot copy from I32"),
    "dup-not-tensor": (lambda c: gg.dup([1.0, 2.0]), TypeError, r"^dup: a must be a Tensor"),
    "add-empty-b": (lambda c: gg.add(_t(c, (3, 4)), _t(c, (0, 4))), ValueError,
                    r"^add: a is \(3, 4\) but b is \(0, 4\)"),
    "soft_max-empty-mask": (lambda c: gg.soft_max(_t(c, (2, 3, 4)), _t(c, (0, 3, 4))), ValueError,
                            r"^soft_max: a is \(2, 3, 4\) but mask is \(0, 3, 4\)"),
    "mul_mat-empty-batch": (lambda c: gg.mul_mat(_t(c, (0, 4, 5)), _t(c, (0, 2, 5))), ValueError,
                            r"^mul_mat: a is \(0, 4, 5\) but b is \(0, 2, 5\)"),
    "tensor-5d": (lambda c: _t(c, (1, 2, 3, 4, 5)), ValueError, r"tensors have 1 to 4 dimensions"),
    "tensor-negative": (lambda c: _t(c, (2, -3)), ValueError, r"^new_tensor: negative dimension"),
    # not integers (numpy refuses a bool too; True was taken as 1)
    "tensor-bool": (lambda c: _t(c, (True, 3)), TypeError, r"^new_tensor: a shape is a sequence of integers"),
    "tensor-float": (lambda c: _t(c, (2.0, 3)), TypeError, r"^new_tensor: a shape is a sequence"),
    "tensor-str": (lambda c: _t(c, "23"), TypeError, r"^new_tensor: a shape is a sequence"),
    "tensor-int": (lambda c: _t(c, 3), TypeError, r"^new_tensor: a shape is a sequence"),
    "reshape-bool": (lambda c: gg.reshape(_t(c, (2, 3)), (6, True)), TypeError, r"^reshape: a shape is"),
    "view-negative": (lambda c: gg.view(_t(c, (2, 3)), (-1,)), ValueError, r"^view: negative dimension"),
    # an empty view still has its offset checked against the data
    "view-empty-past-the-end": (lambda c: gg.view(_t(c, (4,)), (0, 4), strides=(64, 4), offset=20),
                                ValueError, r"^view: shape \(0, 4\) at offset 20 needs 20 bytes"),
    "set_rows-2d-ids": (lambda c: gg.set_rows(_t(c, (4, 8)), _t(c, (2, 8)), _t(c, (1, 2), gg.I32)),
                        ValueError, r"^set_rows: .* ids is \(1, 2\)"),
    "scale-beyond-f32": (lambda c: gg.scale(_t(c, (4,)), 3.5e38), ValueError,
                         r"^scale: s 3.5e\+38 is beyond float32's range"),
    "transpose-q4_0": (lambda c: gg.transpose(_t(c, (32, 32), gg.Q4_0)), ValueError,
                       r"cannot move its row axis"),
    "permute-q4_0": (lambda c: gg.permute(_t(c, (32, 32), gg.Q4_0), (1, 0)), ValueError,
                     r"^permute: a Q4_0 tensor cannot move its row axis"),
    "from_buffer-f64-misaligned": (lambda c: c.from_buffer(_misaligned(32, 4), gg.F64, (4,)), ValueError,
                                   r"^from_buffer: the buffer's address is not a multiple of 8 bytes"),
    "from_buffer-complex": (lambda c: c.from_buffer(np.zeros(2, np.complex64), gg.F32, (4,)),
                            TypeError, r"^from_buffer: a complex64 buffer does not hold F32 values"),
}


def _misaligned(nbytes, misalignment):
    """uint8 bytes whose address is `misalignment` past a multiple of 64."""
    raw = np.empty(nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + misalignment
    return raw[start:start + nbytes]


def test_edge_shapes_that_are_fine(ctx):
    assert ctx.from_numpy(np.float32(3.0)).shape == (1,)          # a 0-d array: one element
    assert gg.view(_t(ctx, (4,)), (3, 0), strides=(16, 4)).shape == (3, 0)   # empty, in range


@pytest.mark.parametrize("case", BAD_BUILDS)
def test_bad_input_raises(ctx, case):
    build, exc, pattern = BAD_BUILDS[case]
    with pytest.raises(exc, match=pattern):
        build(ctx)


def test_cpy_quantized_needs_same_rows(ctx, monkeypatch):
    """Quantized copies must stay on the row-by-row kernel paths."""
    real = core_ops.type_traits

    def with_conversions(t):   # as once the quant kernels fill in the traits
        return {**real(t), "has_to_float": True, "has_from_float": True}

    monkeypatch.setattr(core_ops, "type_traits", with_conversions)
    q = ctx.new_tensor(gg.Q8_0, (2, 64))
    with pytest.raises(ValueError, match=r"^cpy: a is Q8_0 \(2, 64\) but b is F32 \(4, 32\)"):
        gg.cpy(q, ctx.new_tensor(gg.F32, (4, 32)))
    with pytest.raises(ValueError, match=r"^cpy: a is F32 \(64, 2\) but b is Q8_0 \(2, 64\)"):
        gg.cpy(gg.transpose(ctx.new_tensor(gg.F32, (2, 64))), q)
    assert gg.cpy(ctx.new_tensor(gg.F32, (2, 64)), q).shape == (2, 64)


EMPTY = {
    "add": lambda c: gg.add(_t(c, (3, 0)), _t(c, (3, 0))),
    "silu": lambda c: gg.silu(_t(c, (0, 3))),
    "sum_rows": lambda c: gg.sum_rows(_t(c, (0, 3))),
    "soft_max": lambda c: gg.soft_max(_t(c, (3, 0))),
    "mul_mat-K0": lambda c: gg.mul_mat(_t(c, (4, 0)), _t(c, (2, 0))),
    "mul_mat-N0": lambda c: gg.mul_mat(_t(c, (0, 5)), _t(c, (2, 5))),
    "get_rows-no-ids": lambda c: gg.get_rows(_t(c, (3, 4)), _t(c, (0,), gg.I32)),
    "cont": lambda c: gg.cont(gg.transpose(_t(c, (0, 3)))),
    "concat": lambda c: gg.concat(_t(c, (0, 3)), _t(c, (2, 3))),
}


@pytest.mark.parametrize("case", EMPTY)
def test_empty_tensors_compute(ctx, case):
    """Zero-size dimensions build and compute (nothing to do) without a fault."""
    y = EMPTY[case](ctx)
    got = compute(y)
    assert got.shape == y.shape
    if case == "mul_mat-K0":
        np.testing.assert_array_equal(got, 0.0)       # empty dot products



def test_nodes_are_in_ggmls_order(ctx):
    # depth first, a node's first source's subtree before its second's, as ggml_build_forward
    x = ctx.from_numpy(np.ones((4, 4), np.float32), name="x")
    a, b = gg.silu(x), gg.scale(x, 2.0)
    a.name, b.name = "a", "b"
    y = gg.add(a, b)
    y.name = "y"
    assert [t.name for t in gg.build_forward(y).nodes] == ["a", "b", "y"]
    z = gg.add(b, a)     # a and b already built: order from this root's first source
    assert [t.name for t in gg.build_forward(z).nodes][:2] == ["b", "a"]

def test_a_graph_lists_every_node_after_its_sources(ctx):
    a = ctx.from_numpy(np.ones((2, 2), np.float32))
    x = gg.add(a, a)
    y = gg.mul(x, x)
    with pytest.raises(ValueError, match=r"node 0 \(MUL \(2, 2\)\) reads a ADD \(2, 2\) that "
                                         r"comes after it"):
        gg.Graph([y, x])
    with pytest.raises(ValueError, match="reads a ADD .* that is not in the graph"):
        gg.Graph([y])
    g = gg.Graph([a, x, y])
    g.compute(n_threads=1)
    assert np.array_equal(y.numpy(), np.full((2, 2), 4.0, np.float32))


def test_a_shape_may_be_any_iterable_of_integers(ctx):
    a = ctx.from_numpy(np.arange(6, dtype=np.float32))
    for t in (gg.reshape(a, iter([2, 3])), gg.view(a, (d for d in (2, 3))),
              ctx.new_tensor(gg.F32, iter([2, 3])),
              ctx.from_buffer(np.zeros(6, np.float32), gg.F32, iter([2, 3]))):
        assert t.shape == (2, 3) and t.ndim == 2
    assert gg.view(a, (2, 3), iter([12, 4])).strides == (12, 4)


def test_from_numpy_reads_values_in_the_other_byte_order(ctx):
    for dtype, type in ((">f4", gg.F32), (">f2", gg.F16), (">i4", gg.I32)):
        t = ctx.from_numpy(np.arange(5).astype(dtype))
        assert t.type == type and np.array_equal(t.numpy(), np.arange(5))


def test_graphs_are_made_of_tensors_only():
    class LooksLikeANode:
        op = gg.Op.ADD
    for make in (lambda nodes: gg.Graph(nodes), lambda nodes: gg._core.CGraph(nodes)):
        with pytest.raises(TypeError, match="expected [tT]ensors, got LooksLikeANode"):
            make([LooksLikeANode()])     # a compute read it as a tensor struct: SIGSEGV
    with pytest.raises(TypeError, match="build_forward: expected Tensors, got int"):
        gg.build_forward(3)


def test_context_size_is_a_whole_number_of_bytes():
    for bad in (1.5, 4096.9, np.float64(65536.5), "4096", None):
        with pytest.raises(TypeError, match="Context: mem_size must be an integer"):
            gg.Context(mem_size=bad)
    with pytest.raises(ValueError, match="mem_size must be >= 0"):
        gg.Context(-1)
    assert gg.Context(np.int64(4096)).mem_size == 4096 and gg.Context(0).mem_size == 0


def test_context_out_of_memory():
    ctx = gg.Context(mem_size=4096)
    with pytest.raises(MemoryError, match="Context out of memory"):
        ctx.new_tensor(gg.F32, (100, 100))
    with pytest.raises(MemoryError):
        ctx.from_numpy(np.zeros((64, 64), np.float32))
    a = ctx.new_tensor(gg.F32, (16, 16))          # 1 KiB fits ...
    b = ctx.new_tensor(gg.F32, (16, 16))
    with pytest.raises(MemoryError):              # ... but not the results of many ops
        for _ in range(64):
            a = gg.add(a, b)


# ---- task profiles, plans and stats ----------------------------------------------------------

def test_task_profiles_api():
    add = gg.task_profiles(gg.Op.ADD)
    assert len(add) == 1 and add[0].compute.valid and add[0].compute.parallel
    assert not add[0].init.valid and not add[0].finalize.valid
    mm = gg.task_profiles(gg.Op.MUL_MAT, gg.F16, gg.F32)
    assert mm[0].name == "cpu" and mm[0].init.valid and mm[0].compute.valid
    assert gg.task_profiles(gg.Op.VIEW)[0].compute.valid is False


def _profile_graph(ctx, rng):
    x, w = rand(rng, (33, 40)), rand(rng, (9, 40))
    mm = gg.mul_mat(ctx.from_numpy(x, type=gg.F16), ctx.from_numpy(w))    # (9, 33)
    s = gg.add(mm, ctx.from_numpy(rand(rng, (33,))))
    y = gg.soft_max(s, scale=0.3)
    return mm, s, y


@pytest.mark.parametrize("node_name", ["mul_mat", "add", "soft_max"])
def test_single_thread_profile_same_result(ctx, rng, node_name):
    mm, s, y = _profile_graph(ctx, rng)
    want = compute(y)
    node = {"mul_mat": mm, "add": s, "soft_max": y}[node_name]
    assert node.profile == node.profiles()[0]
    p = node.profile.with_stage("compute", parallel=False)
    if node_name == "mul_mat":
        p = p.with_stage("init", parallel=False, wait=True)
    node.profile = p
    assert node.profile == p and not node.profile.compute.parallel
    assert same_bits(compute(y), want)


def test_unrelated_profile_rejected(ctx, rng):
    mm, s, y = _profile_graph(ctx, rng)
    bogus = gg.TaskProfile(7, "bogus", compute=gg.StageFlags(True, True))
    with pytest.raises(ValueError, match=r"^add: profile 'bogus' \(id 7\) does not match"):
        s.profile = bogus
    with pytest.raises(ValueError, match=r"^add: profile 'cpu'"):
        s.profile = mm.profile                      # init stage valid: another code path
    with pytest.raises(ValueError, match=r"^mul_mat: profile"):
        mm.profile = mm.profile.with_stage("init", valid=False)
    with pytest.raises(TypeError, match="profile must be a TaskProfile"):
        s.profile = "compute"
    with pytest.raises(ValueError, match="unknown stage"):
        s.profile.with_stage("setup", parallel=False)


def test_plan_rows_and_work_sizes(ctx, rng):
    mm, s, y = _profile_graph(ctx, rng)
    graph = gg.build_forward(y)
    plan = graph.plan(2)
    assert plan.n_threads == 2 and [r.op for r in plan.rows] == [gg.Op.MUL_MAT, gg.Op.ADD,
                                                                  gg.Op.SOFT_MAX]
    sizes = {r.op: r.work_size for r in plan.rows}
    assert sizes[gg.Op.MUL_MAT] == gg.row_bytes(gg.F16, 40) * 9     # b converted to f16
    assert sizes[gg.Op.ADD] == 0
    assert sizes[gg.Op.SOFT_MAX] == 2 * (4 * 33 + 64)               # a scratch row per thread
    assert plan.work_size >= max(sizes.values())
    assert plan.rows[0].profile == mm.profile and plan.rows[2].shape == (9, 33)
    text = str(plan)
    assert "MUL_MAT" in text and "SOFT_MAX" in text and "3 nodes" in text
    assert graph.plan(3).rows[2].work_size == 3 * (4 * 33 + 64)


def test_plan_runs_small_stages_on_one_thread(rng):
    # a decode step: one activation row, so only the products are worth a second thread
    ctx = gg.Context(mem_size=16 << 20)
    x = ctx.from_numpy(rand(rng, (1, 256)))
    h = gg.rms_norm(x, eps=1e-6)                                   # one row: one thread
    small = gg.mul_mat(ctx.from_numpy(rand(rng, (64, 256))), h)    # 16 K multiply-adds
    big = gg.mul_mat(ctx.from_numpy(rand(rng, (4096, 256))), h)    # 1 M: worth waking workers
    mid = gg.mul_mat(ctx.from_numpy(rand(rng, (1024, 256))), h)    # 256 K: worth it once awake
    wide = gg.add(ctx.from_numpy(rand(rng, (64, 256))), ctx.from_numpy(rand(rng, (256,))))
    graph = gg.build_forward(small, big, mid, wide)
    rows = {id(node): row for node, row in zip(graph.nodes, graph.plan(2).rows)}
    norm, sm, bg, md, wd = (rows[id(t)].profile for t in (h, small, big, mid, wide))
    assert not norm.compute.parallel
    assert not sm.init.parallel and not sm.compute.parallel
    assert not bg.init.parallel and bg.compute.parallel            # one row to convert
    assert md.compute.parallel and wd.compute.parallel             # right after big's
    want = [compute(t) for t in (small, big, mid, wide)]           # 1 and 2 threads, same bits
    graph.compute(n_threads=2)
    assert all(same_bits(t.numpy(), w) for t, w in zip((small, big, mid, wide), want))
    # the same product first in its graph: the workers asleep, too small to wake them
    alone = gg.mul_mat(ctx.from_numpy(rand(rng, (1024, 256))), x)
    assert not gg.build_forward(alone).plan(2).rows[-1].profile.compute.parallel
    # one thread: the flags are back to each node's own
    graph.plan(1)
    assert all(t.profile == t.default_profile() for t in graph.nodes)
    h.profile = h.profile.with_stage("compute", parallel=True)    # by hand: kept
    assert graph.plan(2).rows[graph.nodes.index(h)].profile.compute.parallel


def test_compute_profile_stats(ctx, rng):
    mm, s, y = _profile_graph(ctx, rng)
    graph = gg.build_forward(y)
    with pytest.raises(ValueError, match="no profiled compute"):
        graph.stats()
    graph.compute(n_threads=2, profile=True)
    graph.compute(n_threads=2, profile=True)
    stats = graph.stats()
    assert len(stats) == len(graph.nodes) == 3
    assert [r.op for r in stats] == [gg.Op.MUL_MAT, gg.Op.ADD, gg.Op.SOFT_MAX]
    assert stats[0].profile == "cpu" and stats[0].init_us > 0 and stats[0].compute_us > 0
    assert all(r.total_us >= 0 and r.finalize_us == 0 for r in stats)
    text = str(stats)
    assert "MUL_MAT" in text and "total:" in text
    graph.reset_stats()
    assert all(r.total_us == 0 for r in graph.stats())
    assert str(graph.stats()).endswith("total: 0.0 us")     # nothing measured: no made-up total
    graph.compute(n_threads=2, profile=True)
    # times under another profile are not summed under the new one's name
    mm.profile = next(p for p in mm.profiles() if p.name == "blas")
    assert all(r.total_us == 0 for r in graph.stats())       # not cpu's times under its name
    graph.compute(n_threads=2, profile=True)
    stats = graph.stats()
    assert stats[0].profile == "blas" and stats[0].init_us == 0 and stats[0].compute_us > 0


def test_types_by_name_and_what_is_not_a_type():
    ctx = gg.Context(1 << 16)
    assert ctx.new_tensor("f32", (3,)).type == gg.F32 and ctx.new_tensor(1, (3,)).type == gg.F16
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    np.testing.assert_array_equal(gg.quantize(x, "q8_0"), gg.quantize(x, gg.Q8_0))
    assert gg.type_traits("Q4_K")["blck_size"] == 256 and gg.row_bytes("q4_0", 64) == 36
    assert gg.task_profiles(gg.Op.MUL_MAT, "q4_0") == gg.task_profiles(gg.Op.MUL_MAT, gg.Q4_0)
    assert str(gg.Op.MUL_MAT) == "MUL_MAT" and f"{gg.F16}" == "F16" and int(gg.F16) == 1
    assert f"{gg.Q8_0:>6}|{gg.Op.ADD:<4}|" == "  Q8_0|ADD |" and "%d" % gg.Q8_0 == "8"
    assert f"{gg.Q8_0:d}|{gg.Op.ADD:03d}|{gg.BF16:x}" == "8|004|1e"
    for call, error, match in [
            (lambda: ctx.new_tensor(None, (3,)), TypeError, "new_tensor: type must be a Type"),
            (lambda: ctx.new_tensor(True, (3,)), TypeError, "new_tensor: type must be a Type"),
            (lambda: ctx.from_numpy(x, "f8"), ValueError, "from_numpy: unknown type 'f8'"),
            (lambda: ctx.new_tensor(99, (3,)), ValueError, "new_tensor: unknown type 99"),
            (lambda: gg.dequantize(x, "nope", (64,)), ValueError, "dequantize: unknown type"),
            (lambda: gg.Context(2 ** 62), MemoryError, "Context: cannot allocate an arena")]:
        with pytest.raises(error, match=match):
            call()


# ---- sizes past int64, read-only buffers, copies of the core objects -------------------------

@pytest.mark.parametrize("build", [
    lambda c: c.new_tensor(gg.F32, (2 ** 31, 2 ** 31, 2 ** 31)),        # elements past int64
    lambda c: c.new_tensor(gg.F32, (2 ** 62,)),                          # bytes past int64
    lambda c: c.new_tensor(gg.Q4_0, (2 ** 62, 2 ** 10)),
    lambda c: c.from_buffer(np.zeros(16, np.uint8), gg.F32, (2 ** 32, 2 ** 32)),
    lambda c: gg.view(c.new_tensor(gg.F32, (4,)), (2 ** 40, 2 ** 40)),
    # an op whose result is too large: (2^40, 2^40) F32 from empty rows
    lambda c: gg.mul_mat(c.new_tensor(gg.F32, (2 ** 40, 0)), c.new_tensor(gg.F32, (2 ** 40, 0))),
], ids=["elements", "bytes", "q4_0-bytes", "from_buffer", "view", "mul_mat-result"])
def test_sizes_past_int64_are_refused(ctx, build):
    """Such shapes used to wrap to a small byte size, pass the arena check and crash."""
    with pytest.raises(ValueError, match="int64"):
        build(ctx)


def test_large_but_valid_sizes_raise_memory_error(ctx):
    with pytest.raises(MemoryError, match="Context out of memory"):
        ctx.new_tensor(gg.F32, (2 ** 20, 2 ** 20))
    assert ctx.new_tensor(gg.F32, (2 ** 40, 0)).nbytes == 0
    assert ctx.new_tensor(gg.F32, (0, 2 ** 40)).nbytes == 0


@pytest.mark.parametrize("n", [-32, -1])
def test_row_bytes_of_a_negative_size(n):
    with pytest.raises(ValueError, match="negative"):
        gg.row_bytes(gg.Q4_0 if n % 32 == 0 else gg.F32, n)


def test_read_only_buffer_is_never_written(ctx):
    raw = bytes(16)
    t = ctx.from_buffer(np.frombuffer(raw, np.uint8), gg.F32, (4,))
    assert t.read_only and not t.numpy().flags.writeable
    src = ctx.from_numpy(np.arange(4, dtype=np.float32))
    with pytest.raises(ValueError, match=r"^cpy: b \(4,\) is read-only"):
        gg.cpy(src, t)
    with pytest.raises(ValueError, match=r"^cpy: b \(2, 2\) is read-only"):
        gg.cpy(gg.reshape(src, (2, 2)), gg.transpose(gg.reshape(t, (2, 2))))   # views inherit
    with pytest.raises(ValueError, match=r"^set_rows: dst \(1, 4\) is read-only"):
        gg.set_rows(gg.reshape(t, (1, 4)), gg.reshape(src, (1, 4)),
                    ctx.from_numpy(np.zeros(1, np.int32)))
    assert raw == bytes(16)
    # reading it is fine (weights are mapped read-only)
    w = np.arange(8, dtype=np.float32).reshape(2, 4)
    w.flags.writeable = False
    a = ctx.from_buffer(w, gg.F32, (2, 4))
    np.testing.assert_array_equal(compute(gg.mul_mat(a, gg.reshape(src, (1, 4)))),
                                  (np.arange(4.0) @ w.T)[None])


def test_writable_buffer_is_written_in_place(ctx):
    buf = np.zeros(4, np.float32)
    t = ctx.from_buffer(buf, gg.F32, (4,))
    assert not t.read_only
    compute(gg.cpy(ctx.from_numpy(np.arange(4, dtype=np.float32)), t), fill=False)
    np.testing.assert_array_equal(buf, np.arange(4))


@pytest.mark.parametrize("make", [lambda c: c, lambda c: c.new_tensor(gg.F32, (3,)),
                                  lambda c: gg.neg(c.new_tensor(gg.F32, (3,)))],
                         ids=["context", "tensor", "result"])
def test_core_objects_cannot_be_copied_or_pickled(ctx, make):
    import copy
    import pickle
    obj = make(ctx)
    for dup in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="cannot be copied or pickled"):
            dup(obj)


def test_tensors_are_not_constructed_directly():
    for cls in (gg.Tensor, core_tensor._core.TensorBase):
        with pytest.raises(TypeError, match="cannot be created directly"):
            cls()
        with pytest.raises(TypeError, match="cannot be created directly"):
            cls.__new__(cls)


def test_name_is_cut_on_a_character_boundary(ctx):
    t = ctx.new_tensor(gg.F32, (3,))
    t.name = "é" * 30                       # 60 bytes of UTF-8, 47 fit
    assert t.name == "é" * 23 and "é" in repr(t)
    t.name = "a" + "€" * 20                 # 3-byte characters
    assert t.name == "a" + "€" * 15
    t.name = "x" * 100
    assert t.name == "x" * 47


@pytest.mark.parametrize("type, dtype", [(gg.I8, np.int8), (gg.I16, np.int16), (gg.I32, np.int32),
                                         (gg.I64, np.int64), (gg.F64, np.float64)],
                         ids=["i8", "i16", "i32", "i64", "f64"])
@pytest.mark.parametrize("layout", ["transposed", "permuted", "strided"])
@pytest.mark.parametrize("op", ["dup", "cont", "cpy", "cpy-reshaped"])
def test_copies_of_other_types_move_bits(ctx, rng, op, layout, type, dtype):
    """Strided copies of 1- and 8-byte types used to give zeros (only 2/4 bytes were moved)."""
    x = rng.integers(-100, 100, (2, 3, 5)).astype(dtype)
    a = make_input(ctx, x, layout)
    assert a.type == type
    if op in ("dup", "cont"):
        y = getattr(gg, op)(a)
        want = x
    else:
        shape = x.shape if op == "cpy" else (5, 6)
        y = gg.cpy(a, ctx.new_tensor(type, shape))
        want = x.reshape(shape)
    np.testing.assert_array_equal(compute(y), want)


def test_cpy_between_types_without_conversion_is_refused(ctx):
    for a_type, b_type in ((gg.I32, gg.I64), (gg.F64, gg.F32), (gg.F32, gg.I8)):
        with pytest.raises(ValueError, match="^cpy: cannot copy"):
            gg.cpy(ctx.new_tensor(a_type, (3,)), ctx.new_tensor(b_type, (3,)))


# ---- soft_max NaN, parameter checks, profiles of refused types ------------------------------

def test_soft_max_nan_fills_the_row(ctx):
    x = np.array([[np.nan, 1, 2], [1, 2, 3], [np.inf, 1, 2], [np.nan, -np.inf, -np.inf]],
                 np.float32)
    got = compute(gg.soft_max(ctx.from_numpy(x)), fill=False)
    assert np.isnan(got[[0, 2, 3]]).all(), got
    assert_close(got[1], softmax_ref(x[1:2])[0], rtol=1e-5, atol=1e-7)
    # masked: a NaN under the mask too; a fully masked row stays zeros
    mask = np.array([[0, 0, 0], [-np.inf] * 3, [0, 0, 0], [0, 0, 0]], np.float32)
    got = compute(gg.soft_max(ctx.from_numpy(x), ctx.from_numpy(mask)), fill=False)
    assert np.isnan(got[0]).all() and (got[1] == 0).all()


@pytest.mark.parametrize("build, pattern", [
    (lambda c: gg.rms_norm(_t(c, (3,)), eps=-1e-6), r"^rms_norm: eps must be"),
    (lambda c: gg.norm(_t(c, (3,)), eps=-1.0), r"^norm: eps must be"),
    (lambda c: gg.norm(_t(c, (3,)), eps=float("nan")), r"^norm: eps must be"),
    (lambda c: gg.rope(_t(c, (2, 1, 8)), _t(c, (2,), gg.I32), 8, freq_base=0.0),
     r"^rope: freq_base must be"),
    (lambda c: gg.rope(_t(c, (2, 1, 8)), _t(c, (2,), gg.I32), 8, freq_base=-10000.0),
     r"^rope: freq_base must be"),
    (lambda c: gg.rope(_t(c, (2, 1, 8)), _t(c, (2,), gg.I32), 8, freq_scale=float("inf")),
     r"^rope: freq_scale must be a finite number > 0, got inf"),
    (lambda c: gg.rope(_t(c, (2, 1, 8)), _t(c, (2,), gg.I32), 8, freq_scale=float("nan")),
     r"^rope: freq_scale must be"),
    (lambda c: gg.rope(_t(c, (2, 1, 8)), _t(c, (2,), gg.I32), 8, freq_scale=0.0),
     r"^rope: freq_scale must be"),
], ids=["rms_norm-eps", "norm-eps", "norm-eps-nan", "rope-base-0", "rope-base-negative",
        "rope-scale-inf", "rope-scale-nan", "rope-scale-0"])
def test_bad_op_parameters(ctx, build, pattern):
    with pytest.raises(ValueError, match=pattern):
        build(ctx)
    assert gg.rms_norm(_t(ctx, (3,)), eps=0.0).op == gg.Op.RMS_NORM   # eps 0 is fine


@pytest.mark.parametrize("build, pattern", [
    (lambda c: gg.view(_t(c, (2, 3, 4)), (2, 2), strides=(8.5, 4)), r"^view: a stride must be an integer, got 8.5"),
    (lambda c: gg.view(_t(c, (2, 3, 4)), (2,), offset=4.5), r"^view: offset must be an integer"),
    (lambda c: gg.permute(_t(c, (2, 3, 4)), (0.0, 1.9, 2)), r"^permute: an axis must be an integer"),
    (lambda c: gg.rope(_t(c, (2, 1, 8)), _t(c, (2,), gg.I32), 8.0), r"^rope: n_dims must be an integer"),
    (lambda c: gg.rope(_t(c, (2, 1, 8)), _t(c, (2,), gg.I32), "8"), r"^rope: n_dims must be an integer"),
    (lambda c: gg.rope(_t(c, (2, 1, 8)), _t(c, (2,), gg.I32), 8, mode=2.0), r"^rope: mode must be an integer"),
    (lambda c: gg.scale(_t(c, (3,)), "2"), r"^scale: s must be a number, got '2'"),
    (lambda c: gg.norm(_t(c, (3,)), eps="1e-5"), r"^norm: eps must be a number"),
    (lambda c: gg.concat(_t(c, (2, 3)), _t(c, (2, 3)), 1.0), r"^concat: axis must be an integer"),
    # a bool is no axis, offset or size (numpy refuses them too; True was taken as 1)
    (lambda c: gg.concat(_t(c, (2, 3)), _t(c, (2, 3)), True), r"^concat: axis must be an integer"),
    (lambda c: gg.permute(_t(c, (2, 3)), (True, False)), r"^permute: an axis must be an integer"),
    (lambda c: gg.view(_t(c, (4,), gg.I8), (2,), offset=True), r"^view: offset must be an integer"),
    (lambda c: gg.rope(_t(c, (2, 1, 8)), _t(c, (2,), gg.I32), 8, mode=False),
     r"^rope: mode must be an integer"),
], ids=["view-stride", "view-offset", "permute-axes", "rope-n_dims-float", "rope-n_dims-str",
        "rope-mode", "scale-str", "norm-eps-str", "concat-axis-float", "concat-axis-bool",
        "permute-axes-bool", "view-offset-bool", "rope-mode-bool"])
def test_arguments_are_never_truncated_or_parsed(ctx, build, pattern):
    # int() would have taken 8.5 as 8 and "2" as 2 without a word
    with pytest.raises(TypeError, match=pattern):
        build(ctx)


def test_a_concat_axis_out_of_range_is_named_as_given(ctx):
    with pytest.raises(ValueError, match=r"^concat: axis -4 out of range for 3 dimensions"):
        gg.concat(_t(ctx, (2, 3, 4)), _t(ctx, (2, 3, 4)), -4)
    assert gg.concat(_t(ctx, (2, 3, 4)), _t(ctx, (2, 3, 4)), np.int64(-1)).shape == (2, 3, 8)


def test_from_buffer_refuses_values_it_would_misread(ctx):
    with pytest.raises(ValueError, match="other byte order"):
        ctx.from_buffer(np.arange(4, dtype=">f4"), gg.F32, (4,))
    with pytest.raises(TypeError, match="a float64 buffer does not hold F32 values"):
        ctx.from_buffer(np.arange(2, dtype=np.float64), gg.F32, (4,))
    with pytest.raises(TypeError, match="a float32 buffer does not hold Q8_0 values"):
        ctx.from_buffer(np.zeros(8, np.float32), gg.Q8_0, (32,))
    # raw bytes hold any type; a buffer of the tensor's own dtype is taken as it is
    raw = gg.quantize(np.ones((1, 32), np.float32), gg.Q8_0).reshape(-1)
    assert ctx.from_buffer(raw, gg.Q8_0, (32,)).type == gg.Q8_0
    np.testing.assert_array_equal(ctx.from_buffer(np.arange(4, dtype=np.float16), gg.F16, (4,)).numpy(),
                                  np.arange(4))


def test_data_the_kernels_would_read_misaligned_is_refused(ctx):
    # the kernels read elements and blocks through typed pointers
    x = ctx.from_numpy(np.arange(16, dtype=np.float32))
    with pytest.raises(ValueError, match="must be multiples of 4 bytes, where F32 data starts"):
        gg.view(x, (3,), offset=1)
    with pytest.raises(ValueError, match="multiples of 4 bytes"):
        gg.view(x, (2, 2), strides=(6, 4))
    assert gg.view(x, (3,), offset=8).shape == (3,)
    raw = np.zeros(4 * 4 + 1, np.uint8)[1:]
    with pytest.raises(ValueError, match="address is not a multiple of 4 bytes"):
        ctx.from_buffer(raw, gg.F32, (4,))
    q = np.zeros(18 * 2 + 1, np.uint8)[1:]      # Q4_0 blocks: 2-byte scales
    with pytest.raises(ValueError, match="not a multiple of 2 bytes, which Q4_0"):
        ctx.from_buffer(q, gg.Q4_0, (64,))
    assert ctx.from_buffer(np.zeros(18 * 3, np.uint8)[18:], gg.Q4_0, (64,)).type == gg.Q4_0


def test_a_second_init_leaves_the_context_as_it_was(ctx):
    # the arena is made once: a second __init__ must not free the memory of the
    # tensor structs that live in it
    c = gg.Context(1 << 16)
    t = c.from_buffer(np.arange(4, dtype=np.float32), gg.F32, (4,))
    c.__init__(16)
    assert c.mem_size == 1 << 16 and c.used > 0          # the same arena, its tensors still in it
    u = c.from_numpy(np.arange(4, dtype=np.float32) + 10)
    assert t.type == gg.F32 and t.shape == (4,)
    np.testing.assert_array_equal(t.numpy(), np.arange(4))
    np.testing.assert_array_equal(u.numpy(), np.arange(4) + 10)


def test_task_profiles_agree_with_mul_mat(ctx):
    for src0, src1 in ((gg.Q8_K, gg.F32), (gg.Q8_1, gg.F32), (gg.I32, gg.F32), (gg.F32, gg.F16)):
        assert gg.task_profiles(gg.Op.MUL_MAT, src0, src1) == []
        with pytest.raises(ValueError, match="^mul_mat"):
            gg.mul_mat(_t(ctx, (4, 256), src0), _t(ctx, (2, 256), src1))
    assert [p.name for p in gg.task_profiles(gg.Op.MUL_MAT, gg.Q4_0)][0] == "cpu"
    with pytest.raises(ValueError):
        gg.task_profiles(gg.Op.ADD, 99)


def test_stage_flags_print_as_the_plan_shows_them():
    flags = [gg.StageFlags(True, parallel, wait) for parallel in (False, True) for wait in (False, True)]
    assert [str(f) for f in flags] == ["single", "single wait", "parallel", "parallel wait"]
