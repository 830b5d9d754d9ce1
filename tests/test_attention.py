"""gg.attention (one node: scores, softmax and the weighted sum of V over each token's
own slot list) against a float64 numpy reference; its batch invariance (a token's
result is bitwise the same whatever else is in the batch); bad input."""
import numpy as np
import pytest

import ggml_py as gg
from conftest import compute, same_bits

pytestmark = pytest.mark.kernels


def make_index(lists):
    """kv_index of per-token slot lists: the (start, count) pairs, then the lists."""
    T = len(lists)
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


def run(q, k, v, lists, scale, type=gg.F32, threads=(1, 2, 3)):
    ctx = gg.Context(mem_size=64 << 20)
    index = make_index(lists)
    out = gg.attention(ctx.from_numpy(q), ctx.from_numpy(k, type=type),
                       ctx.from_numpy(v, type=type), ctx.from_numpy(index), scale)
    assert out.shape == q.shape and out.type == gg.F32
    return compute(out, threads=threads)


@pytest.mark.parametrize("type", [gg.F32, gg.F16, gg.Q8_0], ids=["f32", "f16", "q8_0"])
@pytest.mark.parametrize("H,Hkv,D", [(4, 4, 32), (8, 2, 64), (6, 1, 32)])
def test_attention_matches_reference(rng, type, H, Hkv, D):
    slots, T = 40, 5
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    k = rng.standard_normal((slots, Hkv * D)).astype(np.float32)
    v = rng.standard_normal((slots, Hkv * D)).astype(np.float32)
    # two sequences on scattered slots (pages), causal; a token with no slots
    seq_a, seq_b = [3, 17, 4, 30, 31, 8], [0, 39, 12]
    lists = [seq_a[:4], seq_a[:5], seq_a, seq_b, []]
    got = run(q, k, v, lists, 0.3, type)
    stored = {gg.F32: np.float32, gg.F16: np.float16}
    if type in stored:
        kk, vv = k.astype(stored[type]), v.astype(stored[type])
        tol = 1e-5 if type == gg.F32 else 3e-3      # F16 cache: q is rounded to F16 too
    else:     # Q8_0 rows: compare with the values the blocks hold
        kk, vv = (gg.dequantize(gg.quantize(x, gg.Q8_0), gg.Q8_0, x.shape) for x in (k, v))
        tol = 3e-2                                  # and q rounded to Q8_0 blocks
    np.testing.assert_allclose(got, reference(q, kk, vv, lists, 0.3), atol=tol, rtol=tol)
    assert not got[4].any()


def test_a_token_is_the_same_whatever_else_is_in_the_batch(rng):
    """Bitwise: a token alone, then among others with other lists, at other rows."""
    H, Hkv, D, slots = 8, 2, 64, 300
    k = rng.standard_normal((slots, Hkv * D)).astype(np.float32)
    v = rng.standard_normal((slots, Hkv * D)).astype(np.float32)
    q = rng.standard_normal((6, H, D)).astype(np.float32)
    mine = list(rng.permutation(slots)[:173])
    alone = run(q[:1], k, v, [mine], 0.125, gg.F16)
    others = [list(rng.permutation(slots)[:n]) for n in (5, 250, 1, 90)]
    batch = run(q[[1, 2, 0, 3, 4]], k, v, others[:2] + [mine] + others[2:], 0.125, gg.F16)
    assert same_bits(alone[0], batch[2])


def test_bad_input_is_refused(rng):
    ctx = gg.Context(mem_size=1 << 20)
    q = ctx.from_numpy(np.zeros((2, 4, 8), np.float32))
    k = ctx.from_numpy(np.zeros((10, 16), np.float32))
    index = ctx.from_numpy(make_index([[0], [1, 2]]))
    with pytest.raises(ValueError, match="Hkv dividing"):
        gg.attention(q, ctx.from_numpy(np.zeros((10, 24), np.float32)),
                     ctx.from_numpy(np.zeros((10, 24), np.float32)), index, 1.0)
    with pytest.raises(ValueError, match="at least 2"):
        gg.attention(q, k, k, ctx.from_numpy(np.zeros(3, np.int32)), 1.0)
    with pytest.raises(ValueError, match="I32"):
        gg.attention(q, k, k, ctx.from_numpy(np.zeros(6, np.float32)), 1.0)
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
