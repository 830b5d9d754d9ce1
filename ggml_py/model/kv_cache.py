"""The KV cache: every layer's K and V rows, kept between forward calls.

The model reaches a cache through these members only, so that another kind of
cache (pages from a pool, int8 rows with a scale per token and head) can take
this one's place without a change to the model:

    begin(positions) -> slots        place a batch's tokens, all or none of them
    rollback()                       undo the begin of a forward that failed
    window(pad) -> K                 how many slots the next graph attends to
    fill_index(index, positions)     the attention op's kv_index: which of those slots
                                     each token sees, in position order
    store(ctx, il, k, v, slots) -> AttentionKV
                                     graph ops: write the batch's rows (the pools the
                                     attention op reads)
    n_past, clear(), truncate(n)     the sequence held
    cut_by_fork                      True: a fork cut a forward short, contents unknown

and, for the three-node attention (attention="graph"; F16 and F32 caches):

    fill_mask(mask, positions)       which of the window's slots each token may see
    store_and_load(ctx, il, k, v, slots, K) -> (keys, values)
                                     graph ops: write the batch's rows, read the window

`LlamaModel(..., make_cache=f)` (and `Llama`) builds its cache with
f(config, n_ctx, kv_type), or f(config, n_ctx, kv_type, kv_type_v) when V's type differs
from K's. A cache without fill_index and store gets the three-node attention. The model
sizes its buffers for windows of up to n_ctx slots, so store_and_load must take any K up to
n_ctx. Keys and values come back as F32 or F16 views or tensors (the model permutes the
values). `shift(keep, n_discard, rerope)` is used by generate's context shift only. Many
sequences in one cache, in pages: the paged cache of batches (kv_paged.py).

Shapes are numpy order: T = tokens in the batch, K = slots attended to,
Hkv = n_head_kv, D = head_dim.
"""
import numpy as np

from ggml_py.core import ops
from ggml_py.core.types import Type, checked_int
from ggml_py.model.kv_rows import GRAPH_KV_TYPES, KVRows, kv_type


class KVCache:
    """K and V rows of every layer, one row per head and cache slot: k[l], v[l] (Hkv,
    n_ctx, D) in the cache's types (kv_rows.py: F16, F32, Q8_0, Q4_0 or int8 with
    k_scales / v_scales). One sequence, slot = position."""

    def __init__(self, n_layer, n_ctx, n_head_kv, head_dim, *, type=Type.F16, type_v=None):
        sizes = {"n_layer": n_layer, "n_ctx": n_ctx, "n_head_kv": n_head_kv, "head_dim": head_dim}
        for name, value in sizes.items():
            if isinstance(value, Type):      # the argument order before the type was a keyword
                raise TypeError(f"KVCache: {name} must be an integer, got Type.{value.name} "
                                f"(the type is a keyword: type=Type.{value.name})")
        n_layer, n_ctx, n_head_kv, head_dim = (checked_int(f"KVCache: {name}", value, low=1)
                                               for name, value in sizes.items())
        self.type = kv_type(type, "KVCache: type")
        self.type_v = self.type if type_v is None else kv_type(type_v, "KVCache: type_v")
        self.n_ctx = n_ctx
        self.n_head_kv, self.head_dim = n_head_kv, head_dim
        self.rows = KVRows(n_layer, n_ctx, n_head_kv, head_dim, self.type, self.type_v,
                           f"the KV cache for n_ctx={n_ctx}")
        self.k, self.v = self.rows.k, self.rows.v
        self.slot_pos = np.full(n_ctx, -1, np.int32)   # position held by each slot, -1: empty
        self.n_past = 0                                  # positions 0..n_past-1 are cached
        self.cut_by_fork = False   # a forward was half-way in another thread at a fork: unknown
        self._undo = None          # (n_past, positions, their slots' old positions) of begin

    @property
    def nbytes(self):
        """Bytes of all K and V rows (and int8 scales): n_ctx * bytes_per_token."""
        return self.rows.nbytes

    @property
    def bytes_per_token(self):
        """Bytes one token holds over all layers, K and V."""
        return self.rows.bytes_per_token()

    def clear(self):
        """Forget every position (the rows stay; empty slots are masked out)."""
        self.slot_pos[:] = -1
        self.n_past = 0
        self.cut_by_fork = False
        self._undo = None

    def truncate(self, n):
        """Forget positions >= n (keep a prefix to continue from); n an integer (below 0
        forgets all, past n_past nothing)."""
        n = max(0, min(checked_int("truncate: n", n), self.n_past))
        self.slot_pos[self.slot_pos >= n] = -1
        self.n_past = n
        self._undo = None

    def begin(self, positions):
        """Slot ids for a batch's tokens at `positions` (int32 (T,), distinct), marked as
        held from now on; rollback() undoes this until the next begin. A refused begin
        (ValueError) changes nothing, and leaves nothing for rollback() to undo."""
        self._undo = None
        if positions.size and (positions.min() < 0 or positions.max() >= self.n_ctx):
            raise ValueError(f"positions {positions.min()}..{positions.max()} do not fit a "
                             f"context of {self.n_ctx} tokens")
        self._undo = (self.n_past, positions.copy(), self.slot_pos[positions].copy())
        self.slot_pos[positions] = positions
        self.n_past = max(self.n_past, int(positions.max()) + 1 if positions.size else 0)
        return positions

    def rollback(self):
        """Undo the last begin, whose forward failed: its slots are empty again, or
        hold what they held before. A position held before and begun again may have
        had its row overwritten part-way: it is forgotten, with every later one."""
        if self._undo is not None:
            n_past, positions, held = self._undo
            self._undo = None
            self.slot_pos[positions] = held
            self.n_past = n_past
            rewritten = positions[held == positions]
            if rewritten.size:
                self.truncate(int(rewritten.min()))

    def shift(self, keep, n_discard, rerope):
        """Context shift: forget positions keep..keep+n_discard-1 and move the later ones
        down by n_discard (rows copied, K rotated by rerope(k_rows, -n_discard) for its
        new positions)."""
        n = self.n_past
        if not (0 <= keep and n_discard > 0 and keep + n_discard <= n):
            raise ValueError(f"shift: cannot drop {n_discard} positions after {keep} of {n}")
        src, dst = np.arange(keep + n_discard, n), np.arange(keep, n - n_discard)
        for il in range(len(self.k)):
            rows = self.rows.keys_f32(il, src)
            rerope(rows, -n_discard)
            self.rows.set_keys(il, dst, rows)
            self.rows.move(il, src, dst)
        self.truncate(n - n_discard)

    def window(self, pad):
        """Slots the next graph must attend to: the used ones, rounded up to pad."""
        return min(self.n_ctx, -(-max(self.n_past, 1) // pad) * pad)

    def fill_mask(self, mask, positions):
        """mask (T, K) F32: 0 where token t may see slot s (held position <= its own), else -inf."""
        n_kv = mask.shape[1]
        held = self.slot_pos[:n_kv]
        visible = (held[None, :] >= 0) & (held[None, :] <= positions[:, None])
        mask[...] = np.where(visible, np.float32(0), np.float32(-np.inf))

    def fill_index(self, index, positions):
        """index int32 (2T + K,), the attention op's kv_index: each token's (start, count)
        pair, then the held slots of the window in position order; token t sees the
        first count of them, those at positions <= its own."""
        T = positions.size
        K = index.size - 2 * T
        held = self.slot_pos[:K]
        slots = np.flatnonzero(held >= 0)
        order = held[slots]
        if order.size > 1 and (order[1:] < order[:-1]).any():   # slots not in position order
            slots = slots[np.argsort(order, kind="stable")]
            order = held[slots]
        index[2 * T:2 * T + slots.size] = slots
        index[2 * T + slots.size:] = 0
        index[0:2 * T:2] = 2 * T
        index[1:2 * T:2] = np.searchsorted(order, positions, side="right")

    def store(self, ctx, il, k, v, slots):
        """Graph ops of layer il: write k, v (T, Hkv*D) F32 into the rows at `slots`
        (I32 (T,)); the written pools as a kv_rows.AttentionKV for the attention op."""
        return self.rows.store(ctx, il, k, v, slots, "cache")

    def store_and_load(self, ctx, il, k, v, slots, K):
        """Graph ops of layer il: write k, v (T, Hkv*D) into the rows at `slots` (I32 (T,)),
        then read the first K slots back as keys, values (Hkv, K, D) — views of the
        written tensors, so that the reads come after the writes."""
        D = self.head_dim
        if self.type not in GRAPH_KV_TYPES or self.type_v not in GRAPH_KV_TYPES:
            raise ValueError(f"the three-node attention reads F16 and F32 caches, not "
                             f"{self.type.name} / {self.type_v.name} (use the attention op)")
        kv = self.store(ctx, il, k, v, slots)                             # (Hkv, n_ctx, D)
        keys = ops.view(kv.k, (self.n_head_kv, K, D), kv.k.strides)      # (Hkv, K, D)
        values = ops.view(kv.v, (self.n_head_kv, K, D), kv.v.strides)    # (Hkv, K, D)
        return keys, values
