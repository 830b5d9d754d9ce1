"""gg.attention (one node: scores, softmax and the weighted sum of V over each token's
own slot list) against a float64 numpy reference, for every KV cache type (F32, F16, Q8_0,
Q4_0, I8 with a scale per row and head) and both profiles (slim, flash); its batch
invariance (a token's result is bitwise the same whatever else is in the batch); the
SIMD kernels against their scalar twins (bit for bit); set_rows into I8; bad input."""
import itertools

import numpy as np
import pytest
from conftest import compute, same_bits

import ggml_py as gg
from ggml_py import _core
from ggml_py.core import system

pytestmark = pytest.mark.kernels

TYPES = [gg.F32, gg.F16, gg.Q8_0, gg.Q4_0, gg.I8]
PROFILES = ["auto", "slim", "flash"]


def make_index(lists, shared=False):
    """kv_index of per-token slot lists: the (start, count) pairs, then the lists.
    shared: the lists are prefixes of the longest, stored once and read by every token
    (as the tokens of one sequence read its page table)."""
    T = len(lists)
    if shared:
        longest = max(lists, key=len)
        assert all(list(longest[:len(s)]) == list(s) for s in lists)
        return np.array([x for s in lists for x in (2 * T, len(s))] + list(longest), np.int32)
    pairs, flat = [], []
    for slots in lists:
        pairs += [2 * T + len(flat), len(slots)]
        flat += list(slots)
    return np.array(pairs + flat, np.int32)


def reference(q, k, v, lists, scale):
    """(T, H, D) float64: softmax(scale * q.k) v per token over its slots."""
    T, H, D = q.shape
    Hkv = k.shape[1] // D
    out = np.zeros((T, H, D))
    for t, slots in enumerate(lists):
        if not len(slots):
            continue
        for h in range(H):
            g = h // (H // Hkv)
            keys = k[slots, g * D:(g + 1) * D].astype(np.float64)
            values = v[slots, g * D:(g + 1) * D].astype(np.float64)
            s = scale * keys @ q[t, h].astype(np.float64)
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ values
    return out


def i8_rows(x, D):
    """numpy's twin of set_rows into I8: (int8 rows, scales (rows, heads)), symmetric."""
    heads = x.reshape(x.shape[0], -1, D)
    scale = (np.abs(heads).max(axis=2) / np.float32(127)).astype(np.float32)
    inv = np.divide(np.float32(1), scale, out=np.zeros_like(scale), where=scale != 0)
    return np.rint(heads * inv[:, :, None]).astype(np.int8).reshape(x.shape), scale


def pool(ctx, x, type, D, head_major=False):
    """A cache pool of x (slots, Hkv*D) in type, its scales (I8) and the values it holds;
    head_major: the pool (Hkv, slots, D) and its scales (Hkv, slots, 1), as the model's."""
    if type == gg.I8:
        rows, scales = i8_rows(x, D)
        held = (rows.reshape(len(x), -1, D) * scales[:, :, None]).reshape(x.shape)
        if head_major:
            rows = rows.reshape(len(x), -1, D).transpose(1, 0, 2).copy()
            scales = scales.T[:, :, None].copy()
        return ctx.from_numpy(rows), ctx.from_numpy(scales), held
    if type in (gg.Q8_0, gg.Q4_0):
        held = gg.dequantize(gg.quantize(x, type), type, x.shape)
    else:
        held = x.astype({gg.F32: np.float32, gg.F16: np.float16}[type]).astype(np.float32)
    if head_major:
        x = x.reshape(len(x), -1, D).transpose(1, 0, 2).copy()
    return ctx.from_numpy(x, type=type), None, held


def attention_node(q, k, v, lists, scale, type, profile, type_v=None, head_major=False, shared=False):
    """The attention node over pools of k, v, its profile set; and the values they hold."""
    ctx = gg.Context(mem_size=64 << 20)
    D = q.shape[2]
    kp, ks, k_held = pool(ctx, k, type, D, head_major)
    vp, vs, v_held = pool(ctx, v, type if type_v is None else type_v, D, head_major)
    index = ctx.from_numpy(make_index(lists, shared))
    out = gg.attention(ctx.from_numpy(q), kp, vp, index, scale, ks, vs)
    assert out.shape == q.shape and out.type == gg.F32
    assert [p.name for p in out.profiles()] == PROFILES
    out.profile = next(p for p in out.profiles() if p.name == profile)
    return out, k_held, v_held


def run(q, k, v, lists, scale, type=gg.F32, profile="slim", threads=(1, 2, 3), type_v=None):
    out, _, _ = attention_node(q, k, v, lists, scale, type, profile, type_v)
    return compute(out, threads=threads)


def with_twins(fn):
    """fn() with the scalar twins forced, then with the SIMD kernels: both results."""
    try:
        _core.select_kernels(True)
        twin = fn()
    finally:
        _core.select_kernels(system.FORCE_REF)
    return twin, fn()


def query_held(q, k_type):
    """The query as the K kernel reads it: F16 K rounds q to F16, Q8_0 / Q4_0 K to Q8_0
    blocks, I8 K to int8 with a scale per row (the cache's quantizer)."""
    T, H, D = q.shape
    if k_type == gg.F16:
        return q.astype(np.float16).astype(np.float32)
    if k_type in (gg.Q8_0, gg.Q4_0):
        return gg.dequantize(gg.quantize(q, gg.Q8_0), gg.Q8_0, q.shape)
    if k_type == gg.I8:
        rows, scales = i8_rows(q.reshape(T * H, D), D)
        return (rows * scales).reshape(q.shape)
    return q


TOLERANCE = 2e-5    # float32 sums of a reference in float64 over the values the kernels read


def atol_for(v_type, v_held):
    """TOLERANCE, plus for I8 values their weights' rounding to int16 (attn.h): at most half
    of 1/32767 of a block's largest weight, on each of a block's 64 keys; the blocks'
    largest weights add up to at most 1 (the probabilities' sum)."""
    if v_type != gg.I8:
        return TOLERANCE
    return TOLERANCE + 0.5 / 32767 * 64 * np.abs(v_held).max()


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("type", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("H,Hkv,D", [(4, 4, 32), (8, 2, 64), (6, 1, 32), (4, 2, 96), (2, 1, 40)])
@pytest.mark.parametrize("head_major", [False, True], ids=["by_slot", "by_head"])
def test_attention_matches_reference(rng, type, profile, H, Hkv, D, head_major):
    if D % 32 and type in (gg.Q8_0, gg.Q4_0):
        pytest.skip("blocks of 32")
    slots, T = 300, 8
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    k = rng.standard_normal((slots, Hkv * D)).astype(np.float32)
    v = rng.standard_normal((slots, Hkv * D)).astype(np.float32)
    # two sequences on scattered slots (pages), causal, lists longer than a tile of 64
    # keys; a token with no slots (a fully masked row) in the middle of a sequence's run
    seq_a, seq_b = list(rng.permutation(slots)[:200]), [0, 299, 12]
    lists = [seq_a[:4], seq_a[:5], seq_a[:130], seq_a[:200], [], seq_b, seq_b[:2], seq_a[:65]]
    out, k_held, v_held = attention_node(q, k, v, lists, 0.3, type, profile, head_major=head_major)
    got = compute(out, threads=(1, 2, 3))
    want = reference(query_held(q, type), k_held, v_held, lists, 0.3)
    np.testing.assert_allclose(got, want, atol=atol_for(type, v_held), rtol=TOLERANCE)
    assert not got[4].any()


@pytest.mark.parametrize("type", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("H,Hkv,D", [(12, 3, 64), (8, 2, 128), (40, 1, 32), (35, 1, 128)])
def test_the_simd_kernels_give_their_twins_bits(rng, type, H, Hkv, D):
    # head sizes 64 and 128 run loops specialised on them; 35 and 40 query heads of one kv
    # head are more rows than an I8 block of weights holds (35: then 3, by 1-row tiles)
    slots = 150
    q = rng.standard_normal((9, H, D)).astype(np.float32)
    k = rng.standard_normal((slots, Hkv * D)).astype(np.float32)
    v = 3 * rng.standard_normal((slots, Hkv * D)).astype(np.float32)
    lists = [list(rng.permutation(slots)[:n]) for n in (1, 7, 64, 65, 149, 3, 100, 0, 33)]
    for profile in PROFILES:
        out, _, _ = attention_node(q, k, v, lists, 0.2, type, profile)
        graph = gg.build_forward(out)
        twin, simd = with_twins(lambda out=out, graph=graph: compute(out, threads=(2,), graph=graph))
        assert same_bits(twin, simd), f"{type.name} {profile}"


def test_odd_head_sizes_give_their_twins_bits(rng):
    # the D % 8 last elements go one by one, after the eight lanes (attn.h): in the tiles of
    # two rows and in an odd last row (G = 3), over last key groups of 1, 2 and 3 keys, and
    # in the values' tiles of 8 rows (G = 8, I8); each token on its own list (G rows a run),
    # then the five on one list (a run of 5G rows)
    for D in (8, 12, 36, 77):
        for G in (2, 3, 8):
            q = rng.standard_normal((5, 2 * G, D)).astype(np.float32)
            k = rng.standard_normal((70, 2 * D)).astype(np.float32)
            lists = [list(range(n)) for n in (1, 3, 67, 69, 70)]
            for shared, type in itertools.product((False, True), (gg.F32, gg.F16, gg.I8)):
                out, k_held, v_held = attention_node(q, k, k, lists, 0.5, type, "slim", shared=shared)
                graph = gg.build_forward(out)
                twin, simd = with_twins(lambda out=out, graph=graph: compute(out, threads=(1,), graph=graph))
                assert same_bits(twin, simd), (D, G, shared, type.name)
                np.testing.assert_allclose(simd, reference(query_held(q, type), k_held, v_held, lists, 0.5),
                                           atol=atol_for(type, v_held), rtol=TOLERANCE)


def test_k_and_v_of_different_types(rng):
    H, Hkv, D = 4, 2, 32
    q = rng.standard_normal((3, H, D)).astype(np.float32)
    k = rng.standard_normal((40, Hkv * D)).astype(np.float32)
    v = rng.standard_normal((40, Hkv * D)).astype(np.float32)
    lists = [list(range(n)) for n in (5, 39, 40)]
    for kt, vt in ((gg.Q8_0, gg.F16), (gg.F16, gg.I8), (gg.I8, gg.Q4_0), (gg.Q4_0, gg.Q8_0)):
        out, k_held, v_held = attention_node(q, k, v, lists, 0.25, kt, "flash", type_v=vt)
        got = compute(out, threads=(1, 2))
        np.testing.assert_allclose(got, reference(query_held(q, kt), k_held, v_held, lists, 0.25),
                                   atol=atol_for(vt, v_held), rtol=TOLERANCE)


@pytest.mark.parametrize("type_v", TYPES, ids=lambda t: t.name)
def test_a_nan_in_a_float_query_gives_nan_for_its_head_only(rng, type_v):
    # its scores and probabilities are NaN; I8 values must not round them to numbers
    # (a block with a weight that is not finite gives NaN, attn.h)
    q = rng.standard_normal((3, 4, 64)).astype(np.float32)
    q[1, 0, 5] = np.nan
    k = rng.standard_normal((100, 2 * 64)).astype(np.float32)
    lists = [list(range(n)) for n in (30, 70, 100)]
    for profile in PROFILES:
        out, _, _ = attention_node(q, k, k, lists, 0.3, gg.F16, profile, type_v=type_v)
        for got in with_twins(lambda out=out: compute(out, threads=(1, 2))):
            assert np.isnan(got[1, 0]).all(), profile
            assert not np.isnan(got[1, 1:]).any() and not np.isnan(got[[0, 2]]).any(), profile


def test_an_i8_value_block_of_weights_too_small_to_scale_adds_nothing_on_every_path():
    # keys 0..63 score -80 below keys 64..127: the first block's largest weight (~1.8e-35)
    # is under 32767 / FLT_MAX, where 32767 / m overflows (attn.h: such a block is zeros)
    D, n = 8, 128
    q = np.zeros((1, 1, D), np.float32)
    q[0, 0, 0] = 1
    k = np.zeros((n, D), np.float32)
    k[:64, 0] = -80
    v = np.ones((n, D), np.float32)
    v[64:, 2] = 0                     # element 2: only the faint block holds it
    for profile in PROFILES:
        out, _, _ = attention_node(q, k, v, [list(range(n))], 1.0, gg.F32, profile, type_v=gg.I8)
        twin, simd = with_twins(lambda out=out: compute(out, threads=(1, 2)))
        assert same_bits(twin, simd) and twin[0, 0, 0] == 1, profile
        assert abs(twin[0, 0, 2]) < 1e-30, profile   # (flash's running max keeps it: 1.8e-35)


def test_other_types_are_read_through_their_traits(rng):
    # a type without kernels of its own (BF16, Q5_0): its vec_dot and to_float
    q = rng.standard_normal((2, 4, 32)).astype(np.float32)
    k = rng.standard_normal((20, 64)).astype(np.float32)
    lists = [list(range(7)), list(range(20))]
    for type in (gg.BF16, gg.Q5_0):
        ctx = gg.Context(mem_size=1 << 20)
        kp = ctx.from_numpy(k, type=type)
        out = gg.attention(ctx.from_numpy(q), kp, kp, ctx.from_numpy(make_index(lists)), 0.3)
        held = ggml_bf16(k) if type == gg.BF16 else gg.dequantize(gg.quantize(k, type), type, k.shape)
        np.testing.assert_allclose(compute(out, threads=(1, 2)), reference(q, held, held, lists, 0.3),
                                   atol=3e-2, rtol=3e-2)


def ggml_bf16(x):
    """float32 rounded to bfloat16 (nearest even) and back."""
    u = x.astype(np.float32).view(np.uint32)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return u.view(np.float32)


def test_slim_and_flash_agree(rng):
    q = rng.standard_normal((4, 8, 64)).astype(np.float32)
    k = 2 * rng.standard_normal((500, 128)).astype(np.float32)
    lists = [list(range(n)) for n in (1, 64, 129, 500)]
    slim, flash = (run(q, k, k, lists, 0.2, gg.F16, p) for p in ("slim", "flash"))
    np.testing.assert_allclose(slim, flash, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("type", TYPES, ids=lambda t: t.name)
def test_a_token_is_the_same_whatever_else_is_in_the_batch(rng, type, profile):
    """Bitwise: a token alone, then among others with other lists, at other rows (tokens
    of its sequence in the same work item, with longer and shorter lists)."""
    H, Hkv, D, slots = 8, 2, 64, 300
    k = rng.standard_normal((slots, Hkv * D)).astype(np.float32)
    v = rng.standard_normal((slots, Hkv * D)).astype(np.float32)
    q = rng.standard_normal((8, H, D)).astype(np.float32)
    mine = list(rng.permutation(slots)[:173])
    alone = run(q[:1], k, v, [mine], 0.125, type, profile)
    others = [list(rng.permutation(slots)[:n]) for n in (5, 250, 1, 90)]
    batch = run(q[[1, 2, 0, 3, 4]], k, v, others[:2] + [mine] + others[2:], 0.125, type, profile)
    assert same_bits(alone[0], batch[2])
    # the same sequence's list: the token among its neighbours (one work item, one run)
    run_of = [mine[:170], mine[:171], mine[:172], mine, mine[:10], mine[:300]]
    seq = run(q[[5, 6, 7, 0, 1, 2]], k, v, run_of, 0.125, type, profile)
    assert same_bits(alone[0], seq[3])


@pytest.mark.parametrize("limit", [0, 100, -1])
def test_auto_takes_slim_or_flash_by_each_tokens_own_list(rng, limit):
    """auto: a token's result is slim's up to the limit (0: the built-in one, 8192 keys for
    32 rows of scores in 1 MiB; -1: none) and flash's past it, whatever the rest of the node
    holds."""
    H, Hkv, D, slots = 8, 2, 32, 9000
    k = rng.standard_normal((slots, Hkv * D)).astype(np.float32)
    v = rng.standard_normal((slots, Hkv * D)).astype(np.float32)
    q = rng.standard_normal((6, H, D)).astype(np.float32)
    order = list(rng.permutation(slots))
    lists = [order[:n] for n in (99, 100, 101, 40, 8192, 8193)]

    def computed(profile, tokens):
        out, _, _ = attention_node(q[tokens], k, v, [lists[t] for t in tokens], 0.125, gg.F16, profile)
        if profile == "auto":
            out._set_op_param_i32(1, limit)
        return compute(out, threads=(1, 2))
    whole = computed("auto", range(6))
    slim, flash = computed("slim", range(6)), computed("flash", range(6))
    edge = {0: 8192, -1: 0}.get(limit, limit)
    for t, slots_of in enumerate(lists):
        assert same_bits(whole[t], (slim if len(slots_of) <= edge else flash)[t]), t
        assert same_bits(whole[t], computed("auto", [t])[0]), t       # alone: the same bits
    assert not same_bits(slim[5], flash[5])     # (the two ways do differ in the last bits)


def test_set_rows_into_i8_writes_int8_and_a_scale_per_group(rng):
    ctx = gg.Context(mem_size=1 << 20)
    x = rng.standard_normal((5, 3 * 40)).astype(np.float32)
    x[2, 40:80] = 0                                     # a zero head: scale 0, values 0
    rows = ctx.new_tensor(gg.I8, (9, 120))
    scales = ctx.new_tensor(gg.F32, (9, 3))
    rows.numpy()[:] = 7
    scales.numpy()[:] = -1
    ids = np.array([8, 0, 3, 4, 6], np.int32)
    out = gg.set_rows(rows, ctx.from_numpy(x), ctx.from_numpy(ids), scales)
    gg.build_forward(out).compute(n_threads=2)
    want_rows, want_scales = i8_rows(x, 40)
    np.testing.assert_array_equal(rows.numpy()[ids], want_rows)
    np.testing.assert_array_equal(scales.numpy()[ids], want_scales)
    assert (rows.numpy()[[1, 2, 5, 7]] == 7).all() and (scales.numpy()[[1, 2, 5, 7]] == -1).all()
    assert scales.numpy()[3, 1] == 0 and not rows.numpy()[3, 40:80].any()
    # the error of a value is at most half a step of its head's scale
    held = rows.numpy()[ids].reshape(5, 3, 40) * scales.numpy()[ids][:, :, None]
    assert (np.abs(held - x.reshape(5, 3, 40)) <= 0.5001 * scales.numpy()[ids][:, :, None]).all()
    # head-major, as the model's caches: (heads, rows, 40) from a view of x by head
    planes, plane_scales = ctx.new_tensor(gg.I8, (3, 9, 40)), ctx.new_tensor(gg.F32, (3, 9, 1))
    by_head = gg.permute(gg.reshape(ctx.from_numpy(x), (5, 3, 40)), (1, 0, 2))
    gg.build_forward(gg.set_rows(planes, by_head, ctx.from_numpy(ids), plane_scales)).compute(n_threads=2)
    np.testing.assert_array_equal(planes.numpy()[:, ids], want_rows.reshape(5, 3, 40).transpose(1, 0, 2))
    np.testing.assert_array_equal(plane_scales.numpy()[:, ids, 0], want_scales.T)


def test_bad_input_is_refused(rng):
    ctx = gg.Context(mem_size=1 << 20)
    q = ctx.from_numpy(np.zeros((2, 4, 8), np.float32))
    k = ctx.from_numpy(np.zeros((10, 16), np.float32))
    index = ctx.from_numpy(make_index([[0], [1, 2]]))
    for shape in ((1, 0, 8), (1, 2, 0)):           # no heads, or heads of no values
        with pytest.raises(ValueError, match=r"must have heads \(H > 0\) of values"):
            gg.attention(ctx.from_numpy(np.ones(shape, np.float32)), k, k, index, 1.0)
    with pytest.raises(ValueError, match="Hkv dividing"):
        gg.attention(q, ctx.from_numpy(np.zeros((10, 24), np.float32)),
                     ctx.from_numpy(np.zeros((10, 24), np.float32)), index, 1.0)
    with pytest.raises(ValueError, match="at least 2"):
        gg.attention(q, k, k, ctx.from_numpy(np.zeros(3, np.int32)), 1.0)
    for shape in ((2, 10, 16), (3, 10, 8), (0, 10, 8)):    # head-major: rows of D, Hkv | H
        pool = ctx.from_numpy(np.zeros(shape, np.float32))
        with pytest.raises(ValueError, match=r"must be \(Hkv, slots, 8\) or \(slots, Hkv\*8\)"):
            gg.attention(q, pool, pool, index, 1.0)
    with pytest.raises(ValueError, match="I32"):
        gg.attention(q, k, k, ctx.from_numpy(np.zeros(6, np.float32)), 1.0)
    # I8 pools and their scales
    k8 = ctx.new_tensor(gg.I8, (10, 16))
    scales = ctx.new_tensor(gg.F32, (10, 2))
    with pytest.raises(ValueError, match="an I8 k needs k_scales"):
        gg.attention(q, k8, k, index, 1.0)
    with pytest.raises(ValueError, match="v_scales go with an I8 v, not F32"):
        gg.attention(q, k8, k, index, 1.0, scales, scales)
    with pytest.raises(ValueError, match=r"k_scales \(10, 3\) must be \(10, 2\) \(one per head and slot\)"):
        gg.attention(q, k8, k, index, 1.0, ctx.new_tensor(gg.F32, (10, 3)))
    with pytest.raises(ValueError, match="Q8_0 cannot be read in heads of 8"):
        kq = ctx.new_tensor(gg.Q8_0, (10, 32))
        gg.attention(q, kq, kq, index, 1.0)
    with pytest.raises(ValueError, match="needs scales"):
        gg.set_rows(k8, ctx.from_numpy(np.zeros((2, 16), np.float32)),
                    ctx.from_numpy(np.zeros(2, np.int32)))
    with pytest.raises(ValueError, match="groups dividing 16"):
        gg.set_rows(k8, ctx.from_numpy(np.zeros((2, 16), np.float32)),
                    ctx.from_numpy(np.zeros(2, np.int32)), ctx.new_tensor(gg.F32, (10, 3)))
    with pytest.raises(ValueError, match="scales are written only with an I8 dst"):
        gg.set_rows(k, ctx.from_numpy(np.zeros((2, 16), np.float32)),
                    ctx.from_numpy(np.zeros(2, np.int32)), scales)
    # an index naming a slot past the pool: an error at compute, never a read outside
    bad = make_index([[0], [1, 10]])
    out = gg.attention(q, k, k, ctx.from_numpy(bad), 1.0)
    with pytest.raises(ValueError, match="outside"):
        gg.build_forward(out).compute(n_threads=1)
    bad = make_index([[0], [1, 2]])
    bad[2] = 2 * 2 + 40                # a list past the end
    out = gg.attention(q, k, k, ctx.from_numpy(bad), 1.0)
    with pytest.raises(ValueError, match="outside"):
        gg.build_forward(out).compute(n_threads=1)
    # one list shared by both tokens (a sequence's): the bad slot only in the second's
    # longer part, after the first token's shorter part was found good
    bad = make_index([[0], [0, 10]], shared=True)
    out = gg.attention(q, k, k, ctx.from_numpy(bad), 1.0)
    with pytest.raises(ValueError, match="outside"):
        gg.build_forward(out).compute(n_threads=1)


@pytest.mark.parametrize("head_major", [False, True], ids=["by_slot", "by_head"])
@pytest.mark.parametrize("Hkv,parallel", [(4, True), (1, False)])
def test_the_planner_splits_a_decode_tokens_heads_over_threads(rng, head_major, Hkv, parallel):
    # one query token: the items are its KV heads, worth threads when there are two or more
    # (the planner reads Hkv and the slots from either layout of the pools)
    from ggml_py.core.profiles import STAGES
    ctx = gg.Context(mem_size=16 << 20)
    k, _, _ = pool(ctx, rng.standard_normal((2048, Hkv * 64)).astype(np.float32), gg.F16, 64,
                   head_major)
    q = ctx.from_numpy(rng.standard_normal((1, 8, 64)).astype(np.float32))
    out = gg.attention(q, k, k, ctx.from_numpy(make_index([list(range(2048))])), 0.125)
    gg.build_forward(out).plan(n_threads=2)
    assert dict(zip(STAGES, out.profile.stages))["compute"].parallel == parallel
