"""Quantized formats against independent oracles.

- legacy reference quantizers: bytes equal gguf.quants.quantize (numpy, written
  from ggml's reference code) on random and adversarial rows;
- de-quantization equals gguf.quants.dequantize exactly for every type gguf has;
- K-quants: round-trip and dot-product errors within ggml's test-quantize-fns
  limits on its synthetic data;
- SIMD kernels equal their scalar twins bit for bit.
"""
import numpy as np
import pytest
from gguf import quants as gq

import ggml_py as gg
from ggml_py.core import quants as Q

pytestmark = [pytest.mark.kernels,
              pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")]

LEGACY = [gg.Q4_0, gg.Q4_1, gg.Q5_0, gg.Q5_1, gg.Q8_0]
KQUANTS = [gg.Q2_K, gg.Q3_K, gg.Q4_K, gg.Q5_K, gg.Q6_K]
DOT_TYPES = LEGACY + KQUANTS


def gguf_type(t):
    return getattr(gq.GGMLQuantizationType, t.name)


def adversarial_rows(n):
    """Rows that stress scale choice and rounding (no NaN/inf)."""
    rng = np.random.default_rng(7)
    i = np.arange(n, dtype=np.float32)
    rows = [
        np.zeros(n), np.full(n, 1.0), np.full(n, -3.5), np.full(n, 1e-30),
        rng.standard_normal(n) * 1e4, rng.standard_normal(n) * 1e-6,
        rng.standard_normal(n) * 3e37, np.where(i % 2 == 0, 1.0, -1.0),
        np.where(i % 32 == 5, -7.0, 0.25), np.where(i % 32 == 5, 7.0, -0.25),
        rng.integers(-8, 8, n).astype(np.float64),          # exact quantization levels
        rng.integers(-8, 8, n) + 0.5,                        # ties
        np.linspace(-1, 1, n), 0.1 + 2 * np.cos(i),
        rng.uniform(0, 1, n), -rng.uniform(0, 1, n),
        rng.standard_normal(n) * np.exp(rng.uniform(-20, 20, n)),
    ]
    return np.array(rows, dtype=np.float32)


@pytest.mark.parametrize("t", LEGACY, ids=lambda t: t.name)
@pytest.mark.parametrize("kind", ["random", "adversarial"])
def test_reference_quantizer_matches_gguf(t, kind):
    if kind == "random":
        x = np.random.default_rng(int(t)).standard_normal((64, 256)).astype(np.float32)
    else:
        x = adversarial_rows(256)
    ours = gg.quantize(x, t)
    theirs = gq.quantize(x, gguf_type(t))
    assert ours.shape == theirs.shape
    bad = np.nonzero((ours != theirs).any(axis=1))[0]
    assert bad.size == 0, f"rows {bad.tolist()} differ"


@pytest.mark.parametrize("t", LEGACY + KQUANTS + [gg.BF16], ids=lambda t: t.name)
def test_dequantize_matches_gguf(t):
    x = np.concatenate([np.random.default_rng(3).standard_normal((16, 512)).astype(np.float32),
                        adversarial_rows(512)])
    if t == gg.BF16:
        buf = gq.quantize(x, gguf_type(t))
        ours = gg.dequantize(buf, t, x.shape)
    else:
        buf = gg.quantize(x, t)
        ours = gg.dequantize(buf, t, x.shape)
    theirs = gq.dequantize(buf, gguf_type(t))
    np.testing.assert_array_equal(ours, theirs)


def synthetic(n, offset):
    """ggml test-quantize-fns data: 0.1 + 2 cos(i + offset)."""
    return (0.1 + 2 * np.cos(np.arange(n, dtype=np.float32) + np.float32(offset))).astype(np.float32)


N_TEST = 32 * 128
RMSE_LIMIT = {gg.Q2_K: 0.0075, gg.Q3_K: 0.0040}
DOT_LIMIT = {gg.Q2_K: 0.04, gg.Q3_K: 0.04}


def test_empty_arrays_quantize_to_empty_blocks():
    x = np.ones((3, 64), np.float32)
    assert gg.quantize(x[:0], gg.Q4_0).shape == (0, 36)
    assert gg.quantize(x[:, :0], gg.Q4_0).shape == (3, 0)
    assert gg.dequantize(gg.quantize(x[:, :0], gg.Q4_0), gg.Q4_0, (3, 0)).shape == (3, 0)


@pytest.mark.parametrize("t", DOT_TYPES, ids=lambda t: t.name)
def test_round_trip_error(t):
    x = synthetic(N_TEST, 0.0)
    y = gg.dequantize(gg.quantize(x, t), t, x.shape)
    err = np.sqrt(np.sum((x.astype(np.float64) - y) ** 2)) / N_TEST   # ggml's array_rmse
    assert err < RMSE_LIMIT.get(t, 0.002)


@pytest.mark.parametrize("t", DOT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("simd", [False, True])
def test_vec_dot_error(t, simd):
    if simd and not Q.kernel_variants(t)["vec_dot"][1]:
        pytest.skip("no SIMD kernel in this build")
    x, y = synthetic(N_TEST, 0.0), synthetic(N_TEST, 1.0)
    qx = gg.quantize(x, t)
    qy = Q.quantize_row_variant(y, Q.vec_dot_type(t), simd)
    got = Q.vec_dot_variant(t, N_TEST, qx, qy, simd)
    ref = float(np.dot(x.astype(np.float64), y))
    assert abs(got - ref) / N_TEST < DOT_LIMIT.get(t, 0.02)


@pytest.mark.parametrize("t", DOT_TYPES + [gg.F16, gg.F32], ids=lambda t: t.name)
@pytest.mark.parametrize("n_blocks", [1, 3, 8, 17])
def test_simd_dot_equals_scalar_twin(t, n_blocks):
    ref_ok, simd_ok = Q.kernel_variants(t)["vec_dot"]
    if not simd_ok:
        pytest.skip("no SIMD kernel in this build")
    n = n_blocks * (16 if t in (gg.F16, gg.F32) else gg.type_traits(t)["blck_size"]) + (t == gg.F32)
    rng = np.random.default_rng(n_blocks)
    vt = Q.vec_dot_type(t)
    for scale in (1.0, 1e-3, 1e3):
        x = (rng.standard_normal(n) * scale).astype(np.float32)
        y = rng.standard_normal(n).astype(np.float32)
        qx, qy = gg.quantize(x, t), gg.quantize(y, vt)
        a = Q.vec_dot_variant(t, n, qx, qy, False)
        b = Q.vec_dot_variant(t, n, qx, qy, True)
        if t in (gg.F16, gg.F32):   # twins in double (F16) or eight lanes (F32); the SIMD
            # kernels in FMA lanes of their own: within float rounding of the sum's terms
            assert b == pytest.approx(a, rel=1e-5, abs=1e-5 * n * scale)
        else:
            assert a == b   # same integer sums, same float steps: bitwise


# where each K-quant block keeps its fp16 scales (d, and dmin where it has one)
K_QUANT_HALVES = {gg.Q2_K: slice(80, 84), gg.Q3_K: slice(108, 110), gg.Q4_K: slice(0, 4),
                  gg.Q5_K: slice(0, 4), gg.Q6_K: slice(208, 210)}


@pytest.mark.parametrize("t", list(K_QUANT_HALVES), ids=lambda t: t.name)
def test_simd_dot_equals_scalar_twin_on_raw_scale_bytes(t):
    """The K-quants pack their scales (and mins) in bytes the SIMD kernels unpack with
    vector words and shuffles (Q4_K / Q5_K: 8 six-bit scales and 8 mins in 12 bytes).
    Random bytes (every bit pattern a file may hold, not only what our quantizer writes;
    d and dmin kept finite) give the scalar twin's bits."""
    block, y_block = gg.type_traits(t)["type_size"], gg.type_traits(gg.Q8_K)["type_size"]
    rng = np.random.default_rng(7)
    n_blocks = 64
    qx = rng.integers(0, 256, n_blocks * block, dtype=np.uint8)
    halves = qx.reshape(n_blocks, block)[:, K_QUANT_HALVES[t]].view(np.float16)   # d (, dmin)
    halves[...] = rng.uniform(-2, 2, halves.shape).astype(np.float16)
    y = rng.standard_normal(n_blocks * 256).astype(np.float32)
    qy = gg.quantize(y, gg.Q8_K)
    n = n_blocks * 256
    assert Q.vec_dot_variant(t, n, qx, qy, True) == Q.vec_dot_variant(t, n, qx, qy, False)
    for b in range(n_blocks):   # block by block too: no sum to hide a wrong term
        one_x = qx[b * block:(b + 1) * block]
        one_y = qy[b * y_block:(b + 1) * y_block]
        assert Q.vec_dot_variant(t, 256, one_x, one_y, True) == Q.vec_dot_variant(t, 256, one_x, one_y, False)


@pytest.mark.parametrize("t", [gg.Q8_0, gg.Q8_1, gg.Q8_K], ids=lambda t: t.name)
def test_simd_quantizer_equals_reference(t):
    if not Q.kernel_variants(t)["from_float"][1]:
        pytest.skip("no SIMD quantizer in this build")
    rows = np.concatenate([adversarial_rows(512),
                           np.random.default_rng(5).standard_normal((8, 512)).astype(np.float32)])
    for row in rows:
        ref = Q.quantize_row_variant(row, t, False)
        simd = Q.quantize_row_variant(row, t, True)
        np.testing.assert_array_equal(ref, simd)


@pytest.mark.parametrize("t", [gg.Q8_0, gg.Q8_1], ids=lambda t: t.name)
def test_activation_quantizers_round_as_llama_cpp_on_x86(t):
    # activations (and CPY) are quantized as llama.cpp's CPU backend does on x86:
    # x * (127 / amax), ties to even; files keep ggml's reference (x / d, roundf)
    row = np.zeros(32, np.float32)
    row[:4] = [127.0, 74.5, -74.5, 73.5]               # amax 127: the scale is 1 either way
    ties_even, ties_away = [127, 74, -74, 74], [127, 75, -75, 74]
    qs = slice(2, 34) if t == gg.Q8_0 else slice(4, 36)   # after the fp16 scale (and sum)
    for simd in (False, True) if Q.kernel_variants(t)["from_float"][1] else (False,):
        block = Q.quantize_row_variant(row, t, simd)
        assert block[qs].view(np.int8)[:4].tolist() == ties_even
    if t == gg.Q8_0:
        assert gg.quantize(row, t)[qs].view(np.int8)[:4].tolist() == ties_away
    # a scale where 1 / d and 127 / amax part: x / d = -35.499996 but x * 127 / amax = -35.5
    rng = np.random.default_rng(11)
    parted = 0
    for row in rng.standard_normal((4000, 32)).astype(np.float32):
        amax = np.abs(row).max()
        expect = np.rint(row * (np.float32(127) / amax)).astype(np.int8)
        got = Q.quantize_row_variant(row, t, False)[qs].view(np.int8)
        np.testing.assert_array_equal(got, expect)
        parted += not np.array_equal(expect, gg.quantize(row, gg.Q8_0)[2:34].view(np.int8))
    assert parted >= 1       # the file quantizer rounds some blocks the other way


@pytest.mark.parametrize("t", [gg.Q4_0, gg.Q4_1, gg.Q5_0, gg.Q5_1, gg.Q8_0, gg.Q8_1], ids=lambda t: t.name)
def test_reference_quantizers_are_defined_on_nan_and_inf(t):
    # a NaN reaching a float-to-int cast was undefined behaviour in C (UBSan's float-cast-
    # overflow; not observable here); the cast is now x86's: the NaN's quant reads 0, the
    # other block is untouched, and the NaN's own block stays finite where its scale ignores
    # the NaN (types with a min: the min is NaN-free too, as min_max skips NaN comparisons)
    def reference(r):     # the only quantizer of the 4- and 5-bit types is the reference one
        return Q.quantize_row_variant(r, t, False) if Q.kernel_variants(t)["from_float"][1] \
            else gg.quantize(r, t)

    rng = np.random.default_rng(3)
    row = rng.standard_normal(64).astype(np.float32)
    bad = row.copy()
    bad[3] = np.nan                                   # in the first of the two blocks
    plain, with_nan = reference(row), reference(bad)
    block = plain.size // 2
    np.testing.assert_array_equal(with_nan[block:], plain[block:])   # the other block: as ever
    if t != gg.Q8_1:                                  # (no dequantizer: an activation type)
        values = gg.dequantize(with_nan, t, (64,))
        assert np.isfinite(values).all()
        kept = np.delete(np.arange(32), 3)            # the NaN's neighbours keep their values
        np.testing.assert_array_equal(values[kept], gg.dequantize(plain, t, (64,))[kept])
    inf = row.copy()
    inf[40] = np.inf                                  # in the second block
    np.testing.assert_array_equal(reference(inf)[:block], plain[:block])


def test_quantize_api_shapes_and_errors():
    x = np.ones((2, 3, 64), np.float32)
    q = gg.quantize(x, gg.Q4_0)
    assert q.dtype == np.uint8 and q.shape == (2, 3, 2 * 18)
    assert gg.dequantize(q, gg.Q4_0, x.shape).shape == x.shape
    with pytest.raises(ValueError, match="multiple of 32"):
        gg.quantize(np.ones((2, 33), np.float32), gg.Q4_0)
    with pytest.raises(ValueError, match="needs"):
        gg.dequantize(q[:, :, :10], gg.Q4_0, x.shape)
    with pytest.raises(ValueError, match=r"dequantize: Q4_0 \(2, 32\) needs 36 bytes, buffer has 41"):
        gg.dequantize(np.zeros(41, np.uint8), gg.Q4_0, (2, 32))        # too many bytes too
    # (a negative dimension asked for "-144 bytes"; 2.5 was read as 2)
    with pytest.raises(ValueError, match=r"dequantize: negative dimension in shape \(-1, 256\)"):
        gg.dequantize(np.zeros(0, np.uint8), gg.Q4_0, (-1, 256))
    for shape in ((2, 3, 64.0), 64, (True, 64)):
        with pytest.raises(TypeError, match="dequantize: a shape is a sequence of integers"):
            gg.dequantize(q, gg.Q4_0, shape)
    assert gg.type_traits(gg.Q4_K)["vec_dot_type"] == gg.Q8_K
    assert gg.type_traits(gg.Q4_1)["type_size"] == 20


@pytest.mark.parametrize("t", [gg.F16, gg.BF16, gg.Q4_0, gg.Q6_K], ids=lambda t: t.name)
def test_tensor_get_rows_and_cpy(t):
    rng = np.random.default_rng(11)
    w = rng.standard_normal((6, 256)).astype(np.float32)
    ctx = gg.Context(mem_size=4 << 20)
    a = ctx.from_numpy(w, type=t)
    ids = ctx.from_numpy(np.array([4, 0, 4], np.int32))
    rows = gg.get_rows(a, ids)
    g = gg.build_forward(rows)
    g.compute(n_threads=2)
    if t == gg.F16:
        expect = w.astype(np.float16).astype(np.float32)
    elif t == gg.BF16:
        expect = gq.dequantize(gq.quantize(w, gq.GGMLQuantizationType.BF16), gq.GGMLQuantizationType.BF16)
    else:
        expect = gg.dequantize(gg.quantize(w, t), t, w.shape)
    np.testing.assert_array_equal(rows.numpy(), expect[[4, 0, 4]])
    if t in (gg.F16, gg.BF16):   # cpy to and from f32
        back = ctx.new_tensor(gg.F32, w.shape)
        g = gg.build_forward(gg.cpy(a, back))
        g.compute(n_threads=1)
        np.testing.assert_array_equal(back.numpy(), expect)
