"""Row kernels (softmax's exp-and-sum, SwiGLU, RMS_NORM's sum of squares): the SIMD
twin against the scalar reference and both against float64 numpy."""
import numpy as np
import pytest

from ggml_py import _core

pytestmark = pytest.mark.kernels


def variants():
    try:
        _core.exp_sum_variant(np.zeros(1, np.float32), 0.0, np.zeros(1, np.float32), True)
        return [False, True]
    except ValueError:   # a build without SIMD kernels
        return [False]


@pytest.mark.parametrize("simd", variants(), ids=["ref", "simd"][:len(variants())])
@pytest.mark.parametrize("n", [1, 7, 8, 9, 64, 1000, 4099])
def test_exp_sum_matches_float64(simd, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 20).astype(np.float32)
    x[::5] = -np.inf                  # masked positions
    x[1::7] = -90.0                   # below float's normal range after exp
    x[0] = 3.0
    mx = float(x.max())
    y = np.empty_like(x)
    s = _core.exp_sum_variant(x, mx, y, simd)
    ref = np.exp((x - np.float32(mx)).astype(np.float64))   # the difference is a float
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=2e-38)
    assert y[x == -np.inf].tolist() == [0.0] * int((x == -np.inf).sum())
    assert s == pytest.approx(ref.sum(), rel=1e-6)


@pytest.mark.parametrize("simd", variants(), ids=["ref", "simd"][:len(variants())])
def test_exp_sum_of_a_fully_masked_row_is_zero(simd):
    x = np.full(19, -np.inf, np.float32)
    y = np.ones_like(x)
    assert _core.exp_sum_variant(x, -np.inf, y, simd) == 0.0
    assert not y.any()


@pytest.mark.parametrize("simd", variants(), ids=["ref", "simd"][:len(variants())])
def test_exp_sum_keeps_nan(simd):
    x = np.zeros(16, np.float32)
    x[3] = np.nan
    y = np.empty_like(x)
    assert np.isnan(_core.exp_sum_variant(x, 0.0, y, simd))
    assert np.isnan(y[3]) and (y[np.arange(16) != 3] == 1.0).all()


@pytest.mark.parametrize("simd", variants(), ids=["ref", "simd"][:len(variants())])
@pytest.mark.parametrize("n", [1, 8, 13, 5632])
def test_swiglu_matches_float64(simd, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 6).astype(np.float32)
    x[:4] = [-100.0, 100.0, 0.0, -0.0][:min(4, n)]
    g = rng.standard_normal(n).astype(np.float32)
    y = np.empty_like(x)
    _core.swiglu_variant(x, g, y, simd)
    x64 = x.astype(np.float64)
    ref = x64 / (1.0 + np.exp(-x64)) * g
    np.testing.assert_allclose(y, ref, rtol=2e-6, atol=1e-30)


def test_simd_twins_agree_with_the_references():
    if len(variants()) < 2:
        pytest.skip("no SIMD row kernels in this build")
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(777) * 10).astype(np.float32)
    g = rng.standard_normal(777).astype(np.float32)
    y0, y1 = np.empty_like(x), np.empty_like(x)
    s0 = _core.exp_sum_variant(x, float(x.max()), y0, False)
    s1 = _core.exp_sum_variant(x, float(x.max()), y1, True)
    np.testing.assert_allclose(y1, y0, rtol=1e-6, atol=1e-38)
    assert s1 == pytest.approx(s0, rel=1e-6)
    _core.swiglu_variant(x, g, y0, False)
    _core.swiglu_variant(x, g, y1, True)
    np.testing.assert_allclose(y1, y0, rtol=2e-6, atol=1e-30)


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="x, g and y need one equal, non-zero size"):
        _core.swiglu_variant(np.zeros(3, np.float32), np.zeros(2, np.float32), np.zeros(3, np.float32), False)
    with pytest.raises(ValueError, match="y has the wrong size"):
        _core.exp_sum_variant(np.zeros(3, np.float32), 0.0, np.zeros(2, np.float32), False)


@pytest.mark.parametrize("simd", variants(), ids=["ref", "simd"][:len(variants())])
def test_swiglu_far_below_zero_and_at_infinity(simd):
    """silu(x) -> -0 as x -> -inf (exp(-x) overflows to inf), silu(-inf) is NaN (-inf / inf),
    as expf gives: the 8-wide part and the scalar tail agree."""
    x = np.array([-np.inf, -3e38, -1e38, -1e35, -100.0, -88.5, 88.5, np.inf] * 2, np.float32)
    g = np.ones_like(x)
    y = np.empty_like(x)
    _core.swiglu_variant(x, g, y, simd)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = x / (np.float32(1) + np.exp(-x))
    np.testing.assert_allclose(y, ref, rtol=2e-6, atol=1e-37)
    assert np.isnan(y[0]) and y[1:4].tolist() == [0.0] * 3 and y[7] == np.inf


@pytest.mark.parametrize("simd", variants(), ids=["ref", "simd"][:len(variants())])
def test_exp_sum_near_the_top_of_float_range(simd):
    """exp of 88 .. 88.72 is up to FLT_MAX (no exponent overflow inside the kernel)."""
    x = np.array([88.0, 88.3, 88.5, 88.72, 0.0, -1.0, -50.0, -87.0, 88.1], np.float32)
    y = np.empty_like(x)
    _core.exp_sum_variant(x, 0.0, y, simd)
    np.testing.assert_allclose(y, np.exp(x.astype(np.float64)), rtol=1e-6)


def sum_sq_lanes(x, simd, pieces=()):
    """The sixteen lanes sum_sq leaves for x, given whole or cut at `pieces`."""
    lanes = np.zeros(16)
    for part in np.split(x, list(pieces)):
        _core.sum_sq_variant(np.ascontiguousarray(part), lanes, simd)
    return lanes


@pytest.mark.parametrize("simd", variants(), ids=["ref", "simd"][:len(variants())])
@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 2048, 4099])
def test_sum_sq_lane_k_holds_the_squares_of_elements_k_mod_16(simd, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    lanes = sum_sq_lanes(x, simd)
    squares = (x * x).astype(np.float64)            # each square rounded to float first
    want = [squares[k::16].sum() for k in range(16)]
    np.testing.assert_allclose(lanes, want, rtol=1e-13, atol=0)


def test_sum_sq_twins_agree_bit_for_bit_whole_and_in_pieces():
    """The lanes' order of additions is fixed, so the twins and a row given in pieces of a
    multiple of 16 elements (a strided row, gathered a chunk at a time) give the same bits."""
    x = (np.random.default_rng(5).standard_normal(4099) * 50).astype(np.float32)
    ref = sum_sq_lanes(x, False)
    for simd in variants():
        assert sum_sq_lanes(x, simd).tolist() == ref.tolist()
        assert sum_sq_lanes(x, simd, pieces=(1024, 2048, 3072)).tolist() == ref.tolist()


def test_sum_sq_needs_sixteen_lanes():
    with pytest.raises(ValueError, match="lanes must hold 16 doubles"):
        _core.sum_sq_variant(np.zeros(3, np.float32), np.zeros(8), False)
