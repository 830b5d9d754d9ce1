"""MUL_MAT for every weight type, batch size and profile, against float64 numpy.

The reference multiplies by the weights as stored (de-quantized), so what is
measured is the kernel's own error (activation quantization, float sums):
normalized MSE <= 5e-4, ggml test-backend-ops' bound. Every profile (cpu, blas,
blas-split) at 1 and 2 threads must meet it and agree with the others.
"""
import numpy as np
import pytest
from gguf import quants as gq

import ggml_py as gg
from conftest import compute

pytestmark = pytest.mark.kernels

NMSE_MAX = 5e-4
WEIGHT_TYPES = [gg.F32, gg.F16, gg.BF16, gg.Q4_0, gg.Q4_1, gg.Q5_0, gg.Q5_1, gg.Q8_0,
                gg.Q2_K, gg.Q3_K, gg.Q4_K, gg.Q5_K, gg.Q6_K]
M_VALUES = [1, 2, 7, 32, 512]


def stored_weights(w, t):
    """The float values a tensor of type t holds for w."""
    if t == gg.F32:
        return w
    if t == gg.F16:
        return w.astype(np.float16).astype(np.float32)
    if t == gg.BF16:
        bf = gq.GGMLQuantizationType.BF16
        return gq.dequantize(gq.quantize(w, bf), bf)
    return gg.dequantize(gg.quantize(w, t), t, w.shape)


def nmse(out, ref):
    return float(np.mean((out - ref) ** 2) / np.mean(ref ** 2))


def shape_for(t, m):
    blck = gg.type_traits(t)["blck_size"]
    k = 3 * 256 if blck == 256 else (7 * 32 if blck == 32 else 97)   # odd multiples
    n = 9 if m == 512 else 37
    return n, k


@pytest.mark.parametrize("m", M_VALUES)
@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_mul_mat_all_profiles(t, m):
    n, k = shape_for(t, m)
    rng = np.random.default_rng(1000 * int(t) + m)
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    ctx = gg.Context(mem_size=16 << 20)
    a = ctx.from_numpy(w, type=t)
    b = ctx.from_numpy(x)
    y = gg.mul_mat(a, b)
    graph = gg.build_forward(y)
    ref = x.astype(np.float64) @ stored_weights(w, t).astype(np.float64).T
    profiles = y.profiles()
    names = [p.name for p in profiles]
    assert names[0] == "cpu" and "blas" in names
    results = {}
    for p in profiles:
        y.profile = p
        for n_threads in (1, 2):
            graph.compute(n_threads=n_threads)
            out = y.numpy().copy()
            assert out.shape == (m, n)
            err = nmse(out, ref)
            assert err <= NMSE_MAX, f"{p.name} at {n_threads} threads: nmse {err:.2e}"
            results[(p.name, n_threads)] = out
    base = results[("cpu", 1)]
    for key, out in results.items():
        assert nmse(out, base) <= NMSE_MAX, key
        if key[0] == "cpu":   # the CPU kernels do not depend on the thread count
            np.testing.assert_array_equal(out, base)


@pytest.mark.parametrize("t", [gg.Q4_0, gg.Q8_0, gg.Q2_K, gg.Q3_K, gg.Q4_K, gg.Q5_K, gg.Q6_K, gg.F16],
                         ids=lambda t: t.name)
def test_blocked_tiles_equal_vec_dot(t):
    """Rows computed by the 4x2 tiles (M > 1) equal those of the 4x1 ones (M = 1) bit for bit."""
    n, k = 13, 512
    rng = np.random.default_rng(int(t))
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((1, k)).astype(np.float32)
    ctx = gg.Context(mem_size=4 << 20)
    a = ctx.from_numpy(w, type=t)
    y1 = gg.mul_mat(a, ctx.from_numpy(x))
    y5 = gg.mul_mat(a, ctx.from_numpy(np.repeat(x, 5, axis=0)))
    for y in (y1, y5):
        y.profile = y.profiles()[0]
    gg.build_forward(y1, y5).compute(n_threads=2)
    # (F16 runs its tile at M = 1 too: its tile and vec_dot sum in different orders)
    np.testing.assert_array_equal(y5.numpy(), np.repeat(y1.numpy(), 5, axis=0))


def assert_cpu_equals_vec_dot(t, w, x_batches, ms, rng):
    """The CPU profile of mul_mat(w, x), w of shape (w_batches, n, k) broadcast over
    x_batches, and random x of each M in ms: every output equals vec_dot of its row
    and column (the kernels this build runs: SIMD where it has them) bit for bit, at
    1, 2 and 3 threads."""
    from ggml_py.core import quants as Q
    w_batches, n, k = w.shape
    vt = Q.vec_dot_type(t)
    simd, simd_quantizer = Q.kernel_variants(t)["vec_dot"][1], Q.kernel_variants(vt)["from_float"][1]
    qw = [[gg.quantize(w[b, i], t) for i in range(n)] for b in range(w_batches)]
    for m in ms:
        x = rng.standard_normal((x_batches, m, k)).astype(np.float32)
        ctx = gg.Context(mem_size=8 << 20)
        y = gg.mul_mat(ctx.from_numpy(w, type=t), ctx.from_numpy(x))
        y.profile = y.profiles()[0]
        graph = gg.build_forward(y)
        expect = np.empty((x_batches, m, n), np.float32)
        for b in range(x_batches):
            for j in range(m):
                qx = Q.quantize_row_variant(x[b, j], vt, simd_quantizer)
                for i in range(n):
                    expect[b, j, i] = Q.vec_dot_variant(t, k, qw[b * w_batches // x_batches][i], qx, simd)
        for n_threads in (1, 2, 3):
            y.numpy()[...] = np.nan
            graph.compute(n_threads=n_threads)
            np.testing.assert_array_equal(y.numpy(), expect, err_msg=f"M = {m}, {n_threads} threads")


K_QUANTS = [gg.Q2_K, gg.Q3_K, gg.Q4_K, gg.Q5_K, gg.Q6_K]


@pytest.mark.parametrize("t", [gg.Q4_0, gg.Q8_0] + K_QUANTS, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 13, 33])
def test_cpu_products_equal_vec_dot(t, n):
    """The CPU profile runs groups of four far-apart weight rows (r, r + q, r + 2q, r + 3q;
    fewer at the end) against blocks of src1 rows, through blocked kernels where the type
    has them (Q4_0, Q8_0 below M = 8: eight far-apart rows against up to four src1 rows, the
    rows' scales and sums in one vector's lanes; from M = 8: panels of eight neighbouring
    rows, tested below): every
    output equals vec_dot of its row and column bit for bit, for any N, M (one, a few,
    more than a block of 32), thread count and batch."""
    k = 2 * gg.type_traits(t)["blck_size"] * (1 if t in K_QUANTS else 5)
    rng = np.random.default_rng(n)
    w = rng.standard_normal((2, n, k)).astype(np.float32)
    assert_cpu_equals_vec_dot(t, w, 4, (1, 3, 5, 35), rng)


def assert_cpu_equals_scalar_twin_on_raw_bytes(t, raw, m, rng, rows8=False, x=None):
    """The CPU profile of mul_mat(raw blocks of type t, shaped (n rows, n_blocks, block
    bytes); rows8: given their rows interleaved by eight too) against m activation rows
    (x, or random): every output equals the scalar twin's vec_dot of its row and the
    SIMD-quantized activation row, bit for bit, at 1 and 2 threads."""
    from ggml_py.core import quants as Q
    n, n_blocks = raw.shape[:2]
    k = gg.type_traits(t)["blck_size"] * n_blocks
    vt = Q.vec_dot_type(t)
    if x is None:
        x = rng.standard_normal((m, k)).astype(np.float32)
    ctx = gg.Context(mem_size=4 << 20)
    interleaved = gg.interleave_rows8(raw.reshape(n, -1), t) if rows8 else None
    y = gg.mul_mat(ctx.from_buffer(raw.reshape(-1), t, (n, k), rows8=interleaved), ctx.from_numpy(x))
    y.profile = y.profiles()[0]
    graph = gg.build_forward(y)
    simd_quantizer = Q.kernel_variants(vt)["from_float"][1]
    expect = np.empty((m, n), np.float32)
    for j in range(m):
        qx = Q.quantize_row_variant(x[j], vt, simd_quantizer)
        for i in range(n):
            expect[j, i] = Q.vec_dot_variant(t, k, raw[i], qx, False)
    for n_threads in (1, 2):
        graph.compute(n_threads=n_threads)
        np.testing.assert_array_equal(y.numpy(), expect, err_msg=f"{n_threads} threads")


# where each K-quant block keeps its fp16 scales (d, and dmin where it has one)
K_QUANT_HALVES = {gg.Q2_K: slice(80, 84), gg.Q3_K: slice(108, 110), gg.Q4_K: slice(0, 4),
                  gg.Q5_K: slice(0, 4), gg.Q6_K: slice(208, 210)}


@pytest.mark.parametrize("t", K_QUANTS, ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 2, 5, 8, 33])
def test_k_quant_tiles_equal_scalar_twin_on_raw_bytes(t, m):
    """The K-quants' tiles (four far-apart rows, M = 1 included) and panels (eight
    neighbouring rows, from M = 8 where the type has them) unpack scales and mins with
    vector words and shuffles and take the float step of four or eight rows at once. On
    random block bytes (every scale and min bit pattern; d and dmin kept finite) every
    output equals the scalar twin's vec_dot bit for bit."""
    n, n_blocks = 13, 3
    block = gg.type_traits(t)["type_size"]
    rng = np.random.default_rng(m)
    raw = rng.integers(0, 256, (n, n_blocks, block), dtype=np.uint8)
    halves = raw[..., K_QUANT_HALVES[t]]
    halves.view(np.float16)[...] = rng.uniform(-2, 2, halves.shape[:-1] + (halves.shape[-1] // 2,))
    assert_cpu_equals_scalar_twin_on_raw_bytes(t, raw, m, rng)


@pytest.mark.parametrize("t", [gg.Q4_0, gg.Q8_0], ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 3, 5, 8, 33])
def test_legacy_kernels_equal_scalar_twin_on_raw_bytes(t, m):
    """Q4_0's and Q8_0's wide tiles (M < 8) and panels (from M = 8) on random block bytes —
    every quant value, Q8_0's -128 included (a file may hold it; the quantizer never
    writes it), d kept finite, rows of two panel chunks — equal the scalar twin's vec_dot
    bit for bit."""
    n, n_blocks = 13, 70
    block = gg.type_traits(t)["type_size"]
    rng = np.random.default_rng(m)
    raw = rng.integers(0, 256, (n, n_blocks, block), dtype=np.uint8)
    raw[..., 0:2].view(np.float16)[...] = rng.uniform(-2, 2, (n, n_blocks, 1))
    if t == gg.Q8_0:
        raw[0, :, 2:] = 0x80                 # a row of -128 only
    assert_cpu_equals_scalar_twin_on_raw_bytes(t, raw, m, rng)


def q4_0_raw(n, n_blocks, rng):
    """Random Q4_0 block bytes (n rows, n_blocks, 18): every nibble, d finite."""
    raw = rng.integers(0, 256, (n, n_blocks, 18), dtype=np.uint8)
    raw[..., 0:2].view(np.float16)[...] = rng.uniform(-2, 2, (n, n_blocks, 1))
    return raw


def interleave_rows8_reference(raw):
    """numpy's own reading of the rows8 layout (include/ggml_py_quants.h): per group of
    eight rows and block, the eight scales, then for j = 0..3 the eight rows' bytes
    qs[4j .. 4j + 3]."""
    n, n_blocks = raw.shape[:2]
    groups = raw.reshape(n // 8, 8, n_blocks, 18).transpose(0, 2, 1, 3)    # (g, b, r, bytes)
    scales = groups[..., :2].reshape(n // 8, n_blocks, 16)
    values = groups[..., 2:].reshape(n // 8, n_blocks, 8, 4, 4).transpose(0, 1, 3, 2, 4)
    return np.concatenate([scales, values.reshape(n // 8, n_blocks, 128)], axis=2).reshape(n, -1)


def interleave_k_rows8_reference(raw):
    """The same for Q4_K and Q5_K super-blocks: the eight d, the eight dmin, then each
    later 32-bit word of the block for the eight rows."""
    n, n_blocks, size = raw.shape
    groups = raw.reshape(n // 8, 8, n_blocks, size).transpose(0, 2, 1, 3)   # (g, b, r, bytes)
    words = groups[..., 4:].reshape(n // 8, n_blocks, 8, size // 4 - 1, 4).transpose(0, 1, 3, 2, 4)
    parts = [groups[..., 0:2].reshape(n // 8, n_blocks, 16), groups[..., 2:4].reshape(n // 8, n_blocks, 16),
             words.reshape(n // 8, n_blocks, -1)]
    return np.concatenate(parts, axis=2).reshape(n, -1)


def interleave_q6_K_rows8_reference(raw):
    """Q6_K's, byte by byte: the eight rows' scale words, their d, then per half h and
    j < 8 the words ql[64h + 4j], ql[64h + 32 + 4j] and qh[32h + 4j] of the eight rows."""
    n, n_blocks, _ = raw.shape
    out = np.zeros((n // 8, n_blocks, 1680), np.uint8)
    for g, b, r in np.ndindex(n // 8, n_blocks, 8):
        block, o = raw[8 * g + r, b], out[g, b]
        ql, qh, scales, d = block[:128], block[128:192], block[192:208], block[208:210]
        for k in range(4):
            o[32 * k + 4 * r:32 * k + 4 * r + 4] = scales[4 * k:4 * k + 4]
        o[128 + 2 * r:130 + 2 * r] = d
        for h, j in np.ndindex(2, 8):
            at = 144 + 96 * (8 * h + j) + 4 * r
            for i, word in enumerate((ql[64 * h + 4 * j:], ql[64 * h + 32 + 4 * j:], qh[32 * h + 4 * j:])):
                o[at + 32 * i:at + 32 * i + 4] = word[:4]
    return out.reshape(n, -1)


# the K-quants with a rows8 layout: block bytes, numpy's reading of the layout
K_ROWS8 = {gg.Q4_K: (144, interleave_k_rows8_reference), gg.Q5_K: (176, interleave_k_rows8_reference),
           gg.Q6_K: (210, interleave_q6_K_rows8_reference)}


def test_interleave_rows8_layout():
    raw = q4_0_raw(24, 5, np.random.default_rng(0))
    got = gg.interleave_rows8(raw.reshape(24, -1), gg.Q4_0)
    assert got.shape == (24, 5 * 18) and got.dtype == np.uint8
    np.testing.assert_array_equal(got, interleave_rows8_reference(raw))
    for t, (size, reference) in K_ROWS8.items():
        raw_k = np.random.default_rng(1).integers(0, 256, (16, 3, size), dtype=np.uint8)
        np.testing.assert_array_equal(gg.interleave_rows8(raw_k.reshape(16, -1), t), reference(raw_k),
                                      err_msg=t.name)
    with pytest.raises(ValueError, match="multiple of 8"):
        gg.interleave_rows8(raw.reshape(24, -1)[:12], gg.Q4_0)
    with pytest.raises(ValueError, match="Q8_0 has no interleaved layout"):
        gg.interleave_rows8(raw.reshape(24, -1), gg.Q8_0)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 33, 70])
def test_q4_0_rows8_equal_scalar_twin_on_raw_bytes(m):
    """Q4_0 weights given with their rows interleaved by eight (rows8) run one kernel
    over that copy at every M: registers only below M = 8 (up to four activation rows
    per pass), the panels' chunks from M = 8, and where the build has AVX-512 VNNI an
    item's two groups in one 512-bit register from M = 4 (groups 0 and 2 here; group 1
    alone). Passes of four rows, and a last one of the rest (M = 5, 7, 9 - 11, 33, 70).
    On random block bytes, rows of three groups and of 70 blocks (chunks of 64 blocks in
    the 256-bit panels, of 8 in the 512-bit ones: a short last chunk either way), every
    output equals the scalar twin's vec_dot bit for bit."""
    rng = np.random.default_rng(m)
    assert_cpu_equals_scalar_twin_on_raw_bytes(gg.Q4_0, q4_0_raw(24, 70, rng), m, rng, rows8=True)


@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 9, 10, 11, 33])
@pytest.mark.parametrize("t", list(K_ROWS8), ids=lambda t: t.name)
def test_k_quant_rows8_equal_scalar_twin_on_raw_bytes(t, m):
    """The K-quants the same way (below M = 8 up to two activation rows a pass; from M = 8
    an item's two groups in one 512-bit register where the build has AVX-512 VNNI: groups
    0 and 2 here; group 1 alone): on random super-block bytes (every scale, min and value
    bit pattern, d and dmin finite), rows of three groups and of 17 super-blocks (chunks of
    eight in the 256-bit panels, a short last one; one at a time in the 512-bit ones), every output equals the scalar twin's vec_dot bit for bit."""
    rng = np.random.default_rng(m)
    raw = rng.integers(0, 256, (24, 17, K_ROWS8[t][0]), dtype=np.uint8)
    halves = raw[..., K_QUANT_HALVES[t]]
    halves.view(np.float16)[...] = rng.uniform(-2, 2, halves.shape[:-1] + (halves.shape[-1] // 2,))
    assert_cpu_equals_scalar_twin_on_raw_bytes(t, raw, m, rng, rows8=True)


@pytest.mark.parametrize("m", [1, 9])
@pytest.mark.parametrize("t", [gg.Q4_0, *K_ROWS8], ids=lambda t: t.name)
def test_rows8_at_the_int16_bounds(t, m):
    """Every value and scale bit set against activations of -1 (quantized to -127, whose
    block sums take Q4_0's and Q6_K's offsets and the mins): the products the kernels sum
    in int16 come nearest 2^15 there, and a sum over one group too many would wrap."""
    rng = np.random.default_rng(m)
    traits = gg.type_traits(t)
    raw = np.full((24, 3, traits["type_size"]), 0xFF, np.uint8)
    halves = raw[..., {gg.Q4_0: slice(0, 2), **K_QUANT_HALVES}[t]]
    halves.view(np.float16)[...] = rng.uniform(0.5, 2, halves.shape[:-1] + (halves.shape[-1] // 2,))
    x = -np.ones((m, 3 * traits["blck_size"]), np.float32)
    assert_cpu_equals_scalar_twin_on_raw_bytes(t, raw, m, rng, rows8=True, x=x)


@pytest.mark.parametrize("m", [1, 9])
@pytest.mark.parametrize("t", [gg.Q4_0, *K_ROWS8], ids=lambda t: t.name)
def test_rows8_is_what_the_simd_kernels_read(t, m):
    """A rows8 copy that lies (zeros) shows which bytes a product read: the SIMD kernels
    read rows8, the scalar twins (and every other op) the weights themselves."""
    rng = np.random.default_rng(5)
    raw = gg.quantize(rng.standard_normal((16, 256)).astype(np.float32), t)
    x = rng.standard_normal((m, 256)).astype(np.float32)
    ctx = gg.Context(mem_size=1 << 20)
    w = ctx.from_buffer(raw, t, (16, 256), rows8=np.zeros_like(raw))
    y = gg.mul_mat(w, ctx.from_numpy(x))
    rows = gg.get_rows(w, ctx.from_numpy(np.array([3], np.int32)))
    gg.build_forward(y).compute(n_threads=1)
    gg.build_forward(rows).compute(n_threads=1)
    np.testing.assert_array_equal(rows.numpy()[0], gg.dequantize(raw[3], t, (256,)))
    if gg.kernels() == "scalar reference":
        assert np.abs(y.numpy()).max() > 0
    else:
        assert not y.numpy().any()


@pytest.mark.parametrize("m", [1, 9])
@pytest.mark.parametrize("t", [gg.Q4_0, *K_ROWS8], ids=lambda t: t.name)
def test_rows8_of_some_columns_of_a_wider_matrix(t, m):
    """A view of some columns of a wider matrix (a process's share of a matrix split by its
    input columns) given those columns packed and interleaved (set_rows8) multiplies as the
    view without them, bit for bit; rows8 is read at the view's own row size."""
    rng = np.random.default_rng(m)
    block = gg.type_traits(t)["blck_size"]
    k_whole, k0, k = 6 * block, 2 * block, 3 * block
    w = gg.quantize(rng.standard_normal((16, k_whole)).astype(np.float32), t)
    x = rng.standard_normal((m, k)).astype(np.float32)
    columns = np.ascontiguousarray(w[:, gg.row_bytes(t, k0):gg.row_bytes(t, k0 + k)])
    ctx = gg.Context(mem_size=1 << 20)
    whole = ctx.from_buffer(w, t, (16, k_whole))
    plain = gg.view(whole, (16, k), whole.strides, offset=gg.row_bytes(t, k0))
    packed = gg.view(whole, (16, k), whole.strides, offset=gg.row_bytes(t, k0))
    packed.set_rows8(gg.interleave_rows8(columns, t))
    xt = ctx.from_numpy(x)
    y_plain, y_packed = gg.mul_mat(plain, xt), gg.mul_mat(packed, xt)
    for n_threads in (1, 2):
        gg.build_forward(y_plain).compute(n_threads=n_threads)
        gg.build_forward(y_packed).compute(n_threads=n_threads)
        np.testing.assert_array_equal(y_packed.numpy(), y_plain.numpy())
    with pytest.raises(ValueError, match="set_rows8: rows8 must be the contiguous uint8 array"):
        plain.set_rows8(gg.interleave_rows8(w, t))   # the whole rows, not the view's


def test_rows8_checked():
    raw = q4_0_raw(16, 4, np.random.default_rng(6)).reshape(16, -1)
    ctx = gg.Context(mem_size=1 << 20)
    with pytest.raises(ValueError, match="rows8 is for a Q4_0, Q4_K, Q5_K or Q6_K matrix of a multiple of 8"):
        ctx.from_buffer(raw[:12], gg.Q4_0, (12, 128), rows8=gg.interleave_rows8(raw, gg.Q4_0)[:12])
    with pytest.raises(ValueError, match="rows8 is for a Q4_0, Q4_K, Q5_K or Q6_K matrix"):
        ctx.from_buffer(np.zeros((16, 136), np.uint8), gg.Q8_0, (16, 128), rows8=np.zeros((16, 136), np.uint8))
    with pytest.raises(ValueError, match="rows8 must be the contiguous uint8 array"):
        ctx.from_buffer(raw, gg.Q4_0, (16, 128), rows8=gg.interleave_rows8(raw, gg.Q4_0)[:, :36])


PANEL_TYPES = [gg.Q4_0, gg.Q8_0, gg.Q4_K, gg.Q5_K, gg.Q6_K]
# blocks per row: several of a panel's chunks (Q4_0, Q8_0: 64 blocks, K-quants: 8 super-blocks)
PANEL_BLOCKS = {gg.Q4_0: 130, gg.Q8_0: 130, gg.Q4_K: 17, gg.Q5_K: 17, gg.Q6_K: 17}


@pytest.mark.parametrize("t", PANEL_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 7, 8, 9, 17])
def test_panels_equal_vec_dot(t, n):
    """From M = 8 the CPU profile runs these types in panels: eight neighbouring weight
    rows (fewer at the end) unpacked and interleaved a chunk of blocks at a time, against
    up to 32 src1 rows, four at a time (Q4_0 with each src1 row's block sums from the INIT
    stage). Over rows of several such chunks (the last one short), every output equals
    vec_dot bit for bit, at any M from the threshold on and any thread count."""
    rng = np.random.default_rng(n)
    k = gg.type_traits(t)["blck_size"] * PANEL_BLOCKS[t]
    w = rng.standard_normal((1, n, k)).astype(np.float32)
    assert_cpu_equals_vec_dot(t, w, 1, (8, 9, 33, 130), rng)


@pytest.mark.parametrize("profile", ["cpu", "blas-split", "blas-mt"])
def test_work_chunks_cover_every_output_once(profile):
    """The threads take work in chunks from a shared counter (several per
    thread, the last one short): over 1, 2, 3 and 8 threads every output is
    written (the output is poisoned first), with the same bits (blas-mt: values;
    its sgemm is split by OpenBLAS), and right."""
    n, k, m, batch = 1000, 64, 20, 2       # cpu: 63 x 3 tiles per batch, 378 items
    rng = np.random.default_rng(7)
    w = rng.standard_normal((batch, n, k)).astype(np.float32)
    x = rng.standard_normal((batch, m, k)).astype(np.float32)
    ctx = gg.Context(mem_size=16 << 20)
    y = gg.mul_mat(ctx.from_numpy(w, type=gg.Q8_0), ctx.from_numpy(x))
    y.profile = next(p for p in y.profiles() if p.name == profile)
    out = compute(y, exact=profile != "blas-mt")
    stored = stored_weights(w.reshape(-1, k), gg.Q8_0).reshape(w.shape)
    ref = x.astype(np.float64) @ stored.transpose(0, 2, 1)
    assert nmse(out, ref) <= NMSE_MAX


def test_default_profile_follows_the_built_in_rule():
    ctx = gg.Context(mem_size=64 << 20)
    simd = gg.kernels() != "scalar reference"     # the measured rule is for the SIMD kernels

    def default(type, m, n=64, k=64):
        w = ctx.from_numpy(np.ones((n, k), np.float32), type=type)
        return gg.mul_mat(w, ctx.new_tensor(gg.F32, (m, k))).profile.name

    # ggml's rule: BLAS (blas-mt) once M, N and K are all 32 or more
    for type in (gg.F32, gg.F16, gg.Q2_K) + (() if simd else (gg.Q4_0, gg.Q8_0, gg.Q4_K)):
        assert (default(type, 31, k=256), default(type, 32, k=256)) == ("cpu", "blas-mt")
    if simd:   # `cpu` up to the M where BLAS overtook it (never for the panel types), then blas-split
        for type in (gg.Q4_0, gg.Q8_0, gg.Q4_K, gg.Q5_K, gg.Q6_K):
            assert default(type, 4096, k=256) == "cpu"
    wf = ctx.from_numpy(np.ones((64, 64), np.float32))
    assert [p.name for p in gg.mul_mat(wf, ctx.new_tensor(gg.F32, (32, 64))).profiles()] == ["cpu", "blas", "blas-mt"]
    # N or K under 32: the CPU kernels at any M
    assert default(gg.Q8_0, 512, n=16) == "cpu"
    for k, name in ((16, "cpu"), (32, "blas-mt")):
        short = ctx.from_numpy(np.ones((64, k), np.float32))
        assert gg.mul_mat(short, ctx.new_tensor(gg.F32, (64, k))).profile.name == name


def test_blas_profiles_stage_flags():
    ctx = gg.Context(mem_size=4 << 20)
    y = gg.mul_mat(ctx.new_tensor(gg.Q4_K, (32, 256)), ctx.new_tensor(gg.F32, (32, 256)))
    p = {q.name: q for q in y.profiles()}
    assert p["cpu"].init.parallel and p["cpu"].compute.parallel
    assert not p["blas"].init.valid and p["blas"].compute.valid
    assert not p["blas"].compute.parallel and p["blas"].compute.wait
    assert p["blas-split"].init.parallel and p["blas-split"].compute.wait


@pytest.mark.parametrize("flags", [dict(parallel=True), dict(parallel=True, wait=False)])
@pytest.mark.parametrize("profile", ["blas", "blas-split", "blas-mt"])
def test_any_stage_flags_compute_the_same_numbers(profile, flags):
    """The parallel and wait flags are free (README): a BLAS COMPUTE flagged
    parallel by hand still runs one sgemm, not one per thread into the same
    output (or the same de-quantized batch)."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((2, 300, 64)).astype(np.float32)
    x = rng.standard_normal((2, 40, 64)).astype(np.float32)
    ctx = gg.Context(mem_size=16 << 20)
    y = gg.mul_mat(ctx.from_numpy(w, type=gg.Q4_0), ctx.from_numpy(x))
    y.profile = next(p for p in y.profiles() if p.name == profile).with_stage("compute", **flags)
    stored = stored_weights(w.reshape(-1, 64), gg.Q4_0).reshape(w.shape)
    ref = x.astype(np.float64) @ stored.transpose(0, 2, 1)
    for _ in range(20):   # a race shows only now and then
        assert nmse(compute(y, threads=(2, 3)), ref) <= NMSE_MAX


@pytest.mark.parametrize("t", [gg.F32, gg.Q4_0, gg.Q4_K], ids=lambda t: t.name)
def test_non_contiguous_src1_is_cpu_only(t):
    rng = np.random.default_rng(2)
    k = 256
    w = rng.standard_normal((33, k)).astype(np.float32)
    xt = rng.standard_normal((k, 40)).astype(np.float32)   # stored transposed
    ctx = gg.Context(mem_size=8 << 20)
    a = ctx.from_numpy(w, type=t)
    b = gg.transpose(ctx.from_numpy(xt))                    # (40, k), strided rows
    y = gg.mul_mat(a, b)
    assert [p.name for p in y.profiles()] == ["cpu"] and y.profile.name == "cpu"
    gg.build_forward(y).compute(n_threads=2)
    ref = xt.T.astype(np.float64) @ stored_weights(w, t).astype(np.float64).T
    assert nmse(y.numpy(), ref) <= NMSE_MAX


@pytest.mark.parametrize("t", [gg.F32, gg.F16, gg.Q8_0, gg.Q4_K], ids=lambda t: t.name)
def test_columns_of_a_wider_src0_take_every_profile(t):
    """src0 some columns of a wider matrix (its rows packed, further apart: one process's
    share of a matrix split by its input columns) is read in place by every profile."""
    rng = np.random.default_rng(6)
    k, start = 512, 256                   # the second half of each row (whole K-quant blocks)
    w = rng.standard_normal((40, 2 * k)).astype(np.float32)
    x = rng.standard_normal((33, k)).astype(np.float32)
    ctx = gg.Context(mem_size=16 << 20)
    whole = ctx.from_numpy(w, type=t)
    a = gg.view(whole, (40, k), whole.strides, offset=gg.row_bytes(t, start))
    y = gg.mul_mat(a, ctx.from_numpy(x))
    names = [p.name for p in y.profiles()]
    # the built-in rule: ggml's (BLAS from M = 32) but where the SIMD kernels win at 33 rows
    cpu_wins = t in (gg.Q8_0, gg.Q4_K) and gg.kernels() != "scalar reference"
    assert "blas" in names and y.profile.name == ("cpu" if cpu_wins else "blas-mt")
    ref = x.astype(np.float64) @ stored_weights(w, t)[:, start:start + k].astype(np.float64).T
    for p in y.profiles():
        y.profile = p
        out = compute(y, threads=(1, 2), exact=p.name != "blas-mt")
        assert nmse(out, ref) <= NMSE_MAX, p.name


@pytest.mark.parametrize("profile", ["cpu", "blas", "blas-split", "blas-mt"])
def test_batched_broadcast(profile):
    """src0 (2, N, K) broadcast over src1 (4, M, K), as grouped-query attention does."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((2, 35, 64)).astype(np.float32)
    x = rng.standard_normal((4, 33, 64)).astype(np.float32)
    ctx = gg.Context(mem_size=8 << 20)
    a = ctx.from_numpy(w, type=gg.Q8_0)
    y = gg.mul_mat(a, ctx.from_numpy(x))
    y.profile = {p.name: p for p in y.profiles()}[profile]
    gg.build_forward(y).compute(n_threads=2)
    wd = stored_weights(w.reshape(-1, 64), gg.Q8_0).reshape(w.shape).astype(np.float64)
    ref = np.stack([x[i].astype(np.float64) @ wd[i // 2].T for i in range(4)])
    assert nmse(y.numpy(), ref) <= NMSE_MAX


@pytest.mark.parametrize("row_stride", [0, 4])
@pytest.mark.parametrize("type", [gg.F32, gg.Q8_0])
def test_one_row_src1_with_any_row_stride(type, row_stride):
    """src1 of one row per batch is contiguous whatever its row stride (a dimension of one
    has no stride); every profile must read it as packed rows, not by that stride."""
    rng = np.random.default_rng(5)
    k, n, batches = 64, 48, 3
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((batches, k)).astype(np.float32)
    ctx = gg.Context(mem_size=8 << 20)
    a = ctx.from_numpy(w, type=type)
    b = gg.view(ctx.from_numpy(x), (batches, 1, k), strides=(k * 4, row_stride, 4))
    assert b.is_contiguous
    y = gg.mul_mat(a, b)
    graph = gg.build_forward(y)
    wd = stored_weights(w, type).astype(np.float64)
    ref = (x.astype(np.float64) @ wd.T)[:, None, :]
    for profile in y.profiles():
        y.profile = profile
        y.numpy()[...] = 12345.0
        graph.compute(n_threads=2)
        assert nmse(y.numpy(), ref) <= NMSE_MAX, profile.name


def test_blas_mt_leaves_no_thread_spinning():
    """OpenBLAS's threads, lent to blas-mt, must go to sleep after the call
    instead of busy-waiting (they would steal the pool's cores from the nodes
    that follow). CPU time, not wall time: a property, not a speed."""
    import threading
    import time

    import psutil
    rng = np.random.default_rng(0)
    ctx = gg.Context(mem_size=16 << 20)
    w = ctx.from_numpy(rng.standard_normal((512, 512)).astype(np.float32))
    x = ctx.from_numpy(rng.standard_normal((512, 512)).astype(np.float32))
    graph = gg.build_forward(gg.mul_mat(w, x))
    blas_mt = [p for p in graph.nodes[-1].profiles() if p.name == "blas-mt"]
    if not blas_mt:
        pytest.skip("built without BLAS")
    graph.nodes[-1].profile = blas_mt[0]
    proc, me = psutil.Process(), threading.get_native_id()

    def others():
        return sum(t.user_time + t.system_time for t in proc.threads() if t.id != me)

    time.sleep(0.3)   # numpy's own BLAS threads, if an earlier test woke them, settle first
    with gg.ThreadPool(2) as pool:
        for _ in range(3):
            graph.compute(pool=pool)
        c0, t0 = others(), time.perf_counter()
        time.sleep(0.3)
        used = (others() - c0) / (time.perf_counter() - t0)
    assert used < 0.1, f"threads kept running after blas-mt: {100 * used:.0f} % of a core"
