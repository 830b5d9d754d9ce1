"""The KV cache on its own, and the model reaching it only through its interface."""
import numpy as np
import pytest

from llama_models import model_path

import ggml_py as gg
from ggml_py.core import ops
from ggml_py.model.kv_cache import KVCache
from ggml_py.model.llama import default_cache
from ggml_py.core.graph import build_forward
from ggml_py.core.tensor import Context
from ggml_py.core.types import Type

# what kv_cache's docstring lists: a cache of another kind provides these and nothing more
INTERFACE = {"begin", "rollback", "window", "fill_mask", "store_and_load", "fill_index", "store",
             "n_past", "clear", "truncate", "cut_by_fork"}


def state(cache):
    return cache.n_past, cache.slot_pos.copy()


def test_rollback_undoes_the_last_begin_exactly():
    cache = KVCache(1, 16, 2, 4, type=Type.F32)
    cache.begin(np.arange(10, dtype=np.int32))
    cache.truncate(5)
    before = state(cache)
    slots = cache.begin(np.array([5, 6, 7], np.int32))       # over slots held before truncate
    np.testing.assert_array_equal(slots, [5, 6, 7])
    assert cache.n_past == 8 and list(cache.slot_pos[5:8]) == [5, 6, 7]
    cache.rollback()
    assert state(cache)[0] == before[0] and np.array_equal(state(cache)[1], before[1])
    cache.rollback()                                           # nothing more to undo
    assert cache.n_past == 5


def test_rollback_forgets_a_position_begun_again_and_every_later_one():
    # a failed compute may have overwritten the row of a position the cache held
    cache = KVCache(1, 16, 2, 4)
    cache.begin(np.arange(6, dtype=np.int32))
    cache.begin(np.array([2, 3], np.int32))
    cache.rollback()
    assert cache.n_past == 2 and list(cache.slot_pos[:7]) == [0, 1, -1, -1, -1, -1, -1]


def test_begin_below_the_end_keeps_the_sequences_length():
    cache = KVCache(1, 16, 2, 4)
    cache.begin(np.arange(10, dtype=np.int32))
    cache.begin(np.array([3], np.int32))                  # a position again, inside
    assert cache.n_past == 10


def test_truncate_past_the_end_changes_nothing():
    cache = KVCache(1, 16, 2, 4)
    cache.begin(np.arange(5, dtype=np.int32))
    cache.truncate(100)
    assert cache.n_past == 5 and (cache.slot_pos[5:] == -1).all()


def test_truncate_below_zero_empties_the_cache():
    cache = KVCache(1, 16, 2, 4)
    cache.begin(np.arange(5, dtype=np.int32))
    cache.truncate(-1)
    assert cache.n_past == 0 and (cache.slot_pos == -1).all()


def test_truncate_takes_an_integer():
    cache = KVCache(1, 16, 2, 4)
    cache.begin(np.arange(5, dtype=np.int32))
    for bad in (2.5, True, None, "3"):
        with pytest.raises(TypeError, match="truncate: n must be an integer"):
            cache.truncate(bad)
    assert cache.n_past == 5
    cache.truncate(np.int64(3))
    assert cache.n_past == 3 and type(cache.n_past) is int


def test_clear_leaves_nothing_for_rollback():
    cache = KVCache(1, 16, 2, 4)
    cache.begin(np.array([0, 1], np.int32))
    cache.begin(np.array([2, 3], np.int32))
    cache.clear()
    cache.rollback()
    assert cache.n_past == 0 and (cache.slot_pos == -1).all()


def test_truncate_leaves_nothing_for_rollback():
    cache = KVCache(1, 16, 2, 4)
    cache.begin(np.arange(8, dtype=np.int32))
    cache.truncate(4)
    cache.rollback()                                      # not the begin before the truncate
    assert cache.n_past == 4 and list(cache.slot_pos[:9]) == [0, 1, 2, 3] + [-1] * 5


def test_begin_refuses_positions_outside_the_context_and_changes_nothing():
    cache = KVCache(1, 16, 2, 4)
    cache.begin(np.arange(3, dtype=np.int32))
    for positions in ([15, 16], [-1, 3]):
        with pytest.raises(ValueError, match="context of 16"):
            cache.begin(np.array(positions, np.int32))
        assert cache.n_past == 3 and (cache.slot_pos[3:] == -1).all()
        cache.rollback()          # a refused begin leaves nothing to undo: not the first one
        assert cache.n_past == 3 and list(cache.slot_pos[:3]) == [0, 1, 2]


@pytest.mark.parametrize("args, error, message", [
    ((1, 16, 64, Type.F32), TypeError, "head_dim must be an integer, got .*type=Type.F32"),
    ((1, 16, 64, Type.F16), TypeError, "the type is a keyword"),  # the argument order before
    ((1, 16, 0, 4), ValueError, "n_head_kv must be at least 1, got 0"),
    ((1, 16, 2, 4.0), TypeError, "head_dim must be an integer, got 4.0"),
    ((1, True, 2, 4), TypeError, "n_ctx must be an integer, got True")])
def test_bad_sizes_are_refused(args, error, message):
    with pytest.raises(error, match=f"^KVCache: .*{message}"):
        KVCache(*args)


def test_sizes_may_be_numpy_integers():
    cache = KVCache(np.int64(1), np.int32(16), 2, np.uint8(4))
    assert cache.n_ctx == 16 and type(cache.n_ctx) is int and cache.k[0].shape == (2, 16, 4)   # (Hkv, slots, D)


def test_window_and_mask():
    cache = KVCache(1, 20, 1, 4)
    assert cache.window(8) == 8                               # at least one step, empty
    cache.begin(np.arange(9, dtype=np.int32))
    assert cache.window(8) == 16 and cache.window(64) == 20  # rounded up, at most n_ctx
    mask = np.empty((2, 16), np.float32)
    cache.fill_mask(mask, np.array([3, 8], np.int32))
    np.testing.assert_array_equal(mask[0] == 0, np.arange(16) <= 3)
    np.testing.assert_array_equal(mask[1] == 0, np.arange(16) <= 8)
    assert np.isneginf(mask[mask != 0]).all()


@pytest.mark.parametrize("type", [Type.F32, Type.F16])
def test_store_and_load_writes_the_rows_and_reads_the_window(type):
    n_ctx, Hkv, D, K = 12, 2, 4, 8
    cache = KVCache(2, n_ctx, Hkv, D, type=type)
    rng = np.random.default_rng(7)
    old_k, old_v = (rng.standard_normal((n_ctx, Hkv * D)) for _ in range(2))
    for rows, old in ((cache.k[1], old_k), (cache.v[1], old_v)):
        rows[:] = old.reshape(n_ctx, Hkv, D).transpose(1, 0, 2)   # head-major
    ctx = Context(mem_size=1 << 20)
    k = ctx.new_tensor(Type.F32, (3, Hkv * D))
    v = ctx.new_tensor(Type.F32, (3, Hkv * D))
    slots = ctx.new_tensor(Type.I32, (3,))
    keys, values = cache.store_and_load(ctx, 1, k, v, slots, K)
    assert keys.shape == values.shape == (Hkv, K, D)
    k.numpy()[:], v.numpy()[:] = (rng.standard_normal((3, Hkv * D)) for _ in range(2))
    slots.numpy()[:] = [6, 1, 4]
    keys, values = ops.cont(keys), ops.cont(values)
    build_forward(keys, values).compute(n_threads=1)
    dtype = cache.k[1].dtype
    for new, old, rows, read in ((k, old_k, cache.k[1], keys), (v, old_v, cache.v[1], values)):
        expected = old.astype(dtype)
        expected[[6, 1, 4]] = new.numpy().astype(dtype)
        np.testing.assert_array_equal(rows, expected.reshape(n_ctx, Hkv, D).transpose(1, 0, 2))
        window = expected[:K].astype(np.float32).reshape(K, Hkv, D).transpose(1, 0, 2)
        np.testing.assert_array_equal(read.numpy(), window)    # (Hkv, K, D)
    np.testing.assert_array_equal(cache.k[0], 0)               # other layers untouched


class InterfaceOnly:
    """A cache that lets its user reach the interface's members and nothing else."""

    def __init__(self, inner):
        object.__setattr__(self, "_inner", inner)

    def __getattr__(self, name):
        if name not in INTERFACE:
            raise AssertionError(f"cache.{name} is not in the cache's interface")
        return getattr(self._inner, name)

    def __setattr__(self, name, value):
        if name not in INTERFACE:
            raise AssertionError(f"cache.{name} is not in the cache's interface")
        setattr(self._inner, name, value)


def test_the_model_and_llama_use_only_the_caches_interface():
    plain = gg.Llama(model_path("f32"), n_ctx=64, n_threads=1, n_batch=5, kv_type="f32")
    llm = gg.Llama(model_path("f32"), n_ctx=64, n_threads=1, n_batch=5, kv_type="f32",
                   make_cache=lambda *args: InterfaceOnly(default_cache(*args)))
    ids = plain.tokenize("the model reaches its cache through a few members")
    for which in (plain, llm):
        which.eval(ids[:7])
    np.testing.assert_array_equal(llm.eval(ids[7:]), plain.eval(ids[7:]))
    texts = [which.generate("the", max_tokens=6, temperature=0) for which in (plain, llm)]
    assert list(texts[0]) == list(texts[1])
    assert llm.perplexity(ids * 4, n_ctx=16).ppl == plain.perplexity(ids * 4, n_ctx=16).ppl
    llm.reset()
    assert llm.n_tokens == 0
    # a forward that fails undoes its begin through the interface too
    for which in (plain, llm):
        which.eval(ids[:5])
        build = which.model.graph
        which.model.graph = lambda *args: (_ for _ in ()).throw(MemoryError("no graph"))
        with pytest.raises(MemoryError):
            which.eval(ids[5:7])
        which.model.graph = build
    assert llm.n_tokens == 5 and llm.model.cache.n_past == 5
    np.testing.assert_array_equal(llm.eval(ids[5:]), plain.eval(ids[5:]))


class BackToFront(KVCache):
    """A cache whose slots are not its positions: each block of 32 slots filled back to
    front (slot = 32 * (p // 32) + 31 - p % 32)."""

    def begin(self, positions):
        slots = (positions // 32 * 32 + 31 - positions % 32).astype(np.int32)
        self._undo = (self.n_past, slots, self.slot_pos[slots].copy())
        self.slot_pos[slots] = positions
        self.n_past = max(self.n_past, int(positions.max()) + 1)
        return slots

    def rollback(self):
        if self._undo is not None:
            self.n_past, slots, held = self._undo
            self.slot_pos[slots], self._undo = held, None


def test_a_cache_whose_slots_are_not_its_positions_takes_the_place_of_the_stock_one():
    plain = gg.Llama(model_path("f32"), n_ctx=64, n_threads=1, n_batch=7, kv_type="f32")
    made = []

    def make_cache(config, n_ctx, kv_type):
        made.append(BackToFront(config.n_layer, n_ctx, config.n_head_kv, config.head_dim,
                                type=kv_type))
        return InterfaceOnly(made[-1])
    llm = gg.Llama(model_path("f32"), n_ctx=64, n_threads=1, n_batch=7, kv_type="f32",
                   make_cache=make_cache)
    cache = made[0]
    ids = plain.tokenize("each block of thirty-two slots is filled from its end to its start, "
                         "and the model does not know")[:40]
    assert len(ids) > 32
    np.testing.assert_allclose(llm.eval(ids), plain.eval(ids), atol=1e-5, rtol=0)
    assert list(cache.slot_pos[:3]) == [31, 30, 29]     # the first positions sit at the end
    texts = ["".join(which.generate("the", max_tokens=8, temperature=0)) for which in (plain, llm)]
    assert texts[0] == texts[1]
