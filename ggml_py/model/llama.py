"""LlamaModel: weights, KV cache and the forward graphs it has built; forward(tokens,
positions) -> logits (the llama architecture itself: config.py, weights.py, forward.py).

A forward graph is built once per (T, K, n_out) and cached; a call only writes the input
tensors (token ids, positions, KV slot ids, attention mask) through numpy views and runs
the graph. The K window grows in steps of `kv_pad` slots, slots past the sequence hidden by
the mask, so decoding a long sequence builds only a handful of graphs.
"""
import os
import threading
import time
import weakref
from collections import OrderedDict

import numpy as np

from ggml_py.core.graph import aligned_bytes, check_tune, default_threads, shared_pool, thread_count
from ggml_py.core.types import Op, Type
from ggml_py.files.gguf_reader import GGUFModelFile
from ggml_py.model.config import LlamaConfig, context_size
from ggml_py.model.forward import build_forward_graph, build_step_graph, forward_graph_bytes
from ggml_py.model.kv_cache import KVCache
from ggml_py.model.kv_rows import GRAPH_KV_TYPES
from ggml_py.model.weights import LlamaWeights, with_rows8

KV_PAD = 256          # the attention window grows in steps of this many slots
MIN_GRAPHS = 16       # built graphs kept, at least (least recently used dropped) ...
MAX_GRAPHS = 64       # ... and at most
RESERVE_SPARE = 4     # the shared buffer of intermediates is reserved with need / this to spare
# how attention is computed (docs/attention.md): "graph" the three nodes mul_mat, soft_max,
# mul_mat (F16 / F32 caches, the single sequence only); "slim" / "flash" the attention op
# with that profile; "auto" the attention op's auto profile (each token slim or flash by its
# own list's length, the limit set by the planner)
ATTENTION_MODES = ("auto", "graph", "slim", "flash")


_live_models = weakref.WeakSet()


def _free_locks_after_fork():
    # A fork child has only the thread that forked: a forward lock another thread
    # held stays held for good, over a cache and graphs that forward left half-way
    # (a position marked held whose row was never written, nodes marked as being
    # computed). Such a model gets a free lock and graphs built again, and refuses
    # to run until its cache is cleared (what it holds is unknown).
    for model in list(_live_models):
        if model._lock.acquire(blocking=False):    # free, or held by the forking thread
            model._lock.release()
        else:
            model._lock = threading.RLock()
            model._cache.cut_by_fork = True
            model._drop_graphs()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_free_locks_after_fork)


def default_cache(config, n_ctx, kv_type, kv_type_v=None):
    """The stock KV cache for a model of `config`: n_ctx slots of kv_type (K) and kv_type_v
    (V; None: as K), any of kv_rows.KV_TYPES."""
    return KVCache(config.n_layer, n_ctx, config.n_head_kv, config.head_dim, type=kv_type,
                   type_v=kv_type_v)


def check_attention(mode, where):
    """mode if it is one of ATTENTION_MODES, else ValueError naming `where`."""
    if mode not in ATTENTION_MODES:
        raise ValueError(f"{where}: attention must be one of {', '.join(ATTENTION_MODES)}, "
                         f"got {mode!r:.40}")
    return mode


def check_attention_cache(mode, kv_type, kv_type_v=None):
    """ValueError when mode is 'graph' and the cache's K or V type (kv_type_v None: K's)
    is one the three-node path cannot read."""
    kv_type_v = kv_type if kv_type_v is None else kv_type_v
    if mode == "graph" and not {kv_type, kv_type_v} <= set(GRAPH_KV_TYPES):
        raise ValueError(f"attention='graph' reads F16 and F32 caches, not "
                         f"{Type(kv_type).name} / {Type(kv_type_v).name}: "
                         f"quantized caches are read by the attention op (slim, flash)")


def pin_attention(graph, mode):
    """Pin every ATTENTION node of graph to the profile named mode ('slim' or 'flash');
    other modes leave them to the planner."""
    if mode in ("slim", "flash"):
        for t in graph.nodes:
            if t.op == Op.ATTENTION:
                t.profile = next(p for p in t.profiles() if p.name == mode)


def pin_row_invariant(graph):
    """Pin every MUL_MAT of graph to the CPU profile (id 0): row by row dot products
    (and the panel and tile kernels that give the same bits), never BLAS."""
    for t in graph.nodes:
        if t.op == Op.MUL_MAT:
            t.profile = next(p for p in t.profiles() if p.id == 0)


class LlamaModel:
    """Weights + KV cache + cached forward graphs; forward(tokens, positions) -> logits.

    make_cache(config, n_ctx, kv_type) builds the KV cache (default_cache: a KVCache);
    another kind of cache, reached through kv_cache's interface only, takes its place.
    """

    def __init__(self, path, n_ctx=None, kv_type=Type.F16, n_threads=None, kv_pad=KV_PAD,
                 packed=True, make_cache=default_cache, use_mmap=True, clock=time.perf_counter,
                 kv_type_v=None, attention="auto", repack=True):
        """path: the GGUF file, or a GGUFModelFile already open; n_ctx: see context_size;
        clock: what build_s is timed with (seconds); kv_type_v: V's cache type (None:
        kv_type); attention: one of ATTENTION_MODES; repack: Q4_0, Q4_K, Q5_K and Q6_K
        matrices also held with their rows interleaved for MUL_MAT (weights.with_rows8)."""
        self.attention = check_attention(attention, "LlamaModel")
        self.file = path if isinstance(path, GGUFModelFile) else GGUFModelFile(path, use_mmap=use_mmap)
        self.config, self.weights = self._load(self.file)
        self._threads = thread_count(n_threads or None, "LlamaModel")
        if repack:
            self.weights = with_rows8(self.weights, release=self.file.release_pages,
                                      n_threads=self._threads)
        self.n_ctx = context_size(n_ctx, self.config.n_ctx_train, self.file)
        check_attention_cache(attention, kv_type, kv_type_v)
        if kv_type_v is None or kv_type_v == kv_type:
            self._cache = make_cache(self.config, self.n_ctx, kv_type)
        else:
            self._cache = make_cache(self.config, self.n_ctx, kv_type, kv_type_v)
        self.kv_pad = kv_pad
        self.packed = packed
        self.tune = None           # TuneData: MUL_MAT profiles from measurements
        self.replans = 0           # times the cached graphs were planned again (threads, tune)
        # None, or reduce(partial) -> the whole: what ends each attention and feed-forward
        # block of a model split over processes (ggml_py/dist: an all-reduce), whose
        # blocks give this process's share of the sum
        self.reduce = None
        self._graphs = OrderedDict()
        # enough for a sequence's every window twice (a prompt's batches and the tokens
        # generated after them; a perplexity chunk's batches), so that none is rebuilt,
        # up to MAX_GRAPHS (each holds its tensor structs, ~32 KB a layer)
        self.max_graphs = min(MAX_GRAPHS, max(MIN_GRAPHS, 2 * -(-self.n_ctx // kv_pad) + 8))
        # the graphs run one at a time: one buffer of intermediates, one of masks and
        # one work buffer serve them all (as ggml's compute buffer)
        self._intermediates = None   # uint8 array on a cache line (graph.aligned_bytes)
        self._masks = None           # float32 array: the running graph's (T, K) mask
        self._reserved_for = set()   # batch sizes T whose largest graph the buffers fit
        self._work_donor = None      # the graph whose work buffer the next ones share
        self._work_bytes = 0
        self.build_s, self.n_built = 0.0, 0    # time spent building graphs, and how many
        self.clock = clock
        self._lock = threading.RLock()         # one forward at a time: shared buffers and cache
        _live_models.add(self)

    def _load(self, f):
        """(config, weights) the graphs are built from: the file's (a process of a split
        model takes its share of them: ggml_py/dist)."""
        config = LlamaConfig.from_gguf(f)
        return config, LlamaWeights.from_gguf(f, config)

    @property
    def cache(self):
        """The KV cache. The graphs are built over its buffers, so it is not replaced
        (assigning another one made the cached graphs compute on the old one)."""
        return self._cache

    @property
    def n_threads(self):
        """Threads of each compute (1..256)."""
        return self._threads

    @n_threads.setter
    def n_threads(self, n):
        # the cached graphs are planned again: a plan is made for one thread count
        # (which stages are worth threads, the work buffer's size), and a plan for
        # one thread run on two dispatches every small stage
        n = thread_count(n, "n_threads")
        with self._lock:            # never under a compute: replanning may move the work buffer
            if n != self._threads:
                self._threads = n
                self._plan_graphs()

    def set_tune(self, data):
        """Plan every MUL_MAT with this TuneData (None: ggml's fallback rule)."""
        self.tune = check_tune(data, "set_tune")
        with self._lock:
            self._plan_graphs()

    def _plan_graphs(self):
        """Plan every cached graph again, for n_threads and the tune data (rows computed
        before and after may round differently: attention's slim / flash limit comes from
        the tune data at the thread count)."""
        self.replans += 1
        for g in self._graphs.values():
            g.graph.plan(self.n_threads, tune=self.tune)
            self._share_work(g.graph)

    def fused(self, T):
        """Whether a forward of T tokens computes attention with the attention op (one
        node over each token's slot list) or with the three nodes: the op unless
        attention="graph" or the cache has only the three-node interface."""
        if self.attention == "graph":
            return False
        cache = self._cache
        return callable(getattr(cache, "fill_index", None)) and callable(getattr(cache, "store", None))

    def graph(self, T, K, n_out):
        """The cached forward graph for (T, K, n_out), built on first use."""
        key = (T, K, n_out)
        g = self._graphs.get(key)
        if g is None:
            t0 = self.clock()
            if self.packed and T not in self._reserved_for:
                # size the buffers at once for T tokens over the whole context (as ggml
                # reserves its compute buffer), so that the windows to come, which need
                # more, do not grow them and drop the graphs built so far; with room to
                # spare, as the packing is not monotone in K (a smaller window has needed 6 %
                # more), though a graph that needs more still gets it
                need = forward_graph_bytes(self.config, self.weights, self.cache, T, self.n_ctx, T,
                                           fused=self.fused(T), reduce=self.reduce)
                self._intermediates_for(need + need // RESERVE_SPARE)
                if not self.fused(T):
                    self._masks_for(T * self.n_ctx)
                self._reserved_for.add(T)
            fused = self.fused(T)
            g = build_forward_graph(self.config, self.weights, self.cache, T, K, n_out,
                                    self.packed, buffer_for=self._intermediates_for,
                                    mask_buffer=self._masks_for(T * K) if self.packed and not fused
                                    else None, fused=fused, reduce=self.reduce)
            self._graphs[key] = g
            pin_attention(g.graph, self.attention)
            g.graph.plan(self.n_threads, tune=self.tune)
            self._share_work(g.graph)
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
            self.build_s += self.clock() - t0
            self.n_built += 1
        else:
            self._graphs.move_to_end(key)
        return g

    def step_graph(self, cache, R, N, n_out, invariant=True):
        """The cached graph of a step over the paged `cache` (R tokens, slot lists of
        N values, logits of n_out rows), built on first use. invariant: every MUL_MAT
        takes the CPU profile, whose dot products give each row the same bits whatever
        the other rows (BLAS's do not), so a sequence's logits do not depend on the
        batch it is in."""
        key = ("step", id(cache), R, N, n_out, invariant)
        g = self._graphs.get(key)
        if g is None:
            t0 = self.clock()
            g = build_step_graph(self.config, self.weights, cache, R, N, n_out,
                                 buffer_for=self._intermediates_for if self.packed else None,
                                 reduce=self.reduce)
            if invariant:
                pin_row_invariant(g.graph)
            pin_attention(g.graph, self.attention)
            self._graphs[key] = g
            g.graph.plan(self.n_threads, tune=self.tune)
            self._share_work(g.graph)
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
            self.build_s += self.clock() - t0
            self.n_built += 1
        else:
            self._graphs.move_to_end(key)
        return g

    def run_step(self, g):
        """Compute a step graph whose inputs are written (under the forward lock)."""
        with self._lock:
            self.file.check_unchanged()    # a ModelLoadError here, not a SIGBUS in compute
            pool = shared_pool(self.n_threads) if self.n_threads > 1 else None
            g.graph.compute(n_threads=self.n_threads if pool is None else None, pool=pool)
        return g.logits

    def _intermediates_for(self, nbytes):
        """The shared buffer of intermediates, grown to nbytes when smaller."""
        if self._intermediates is None or self._intermediates.nbytes < nbytes:
            self._drop_graphs()               # they hold the old one: it goes before the new one
            self._intermediates = None
            self._intermediates = aligned_bytes(nbytes)
        return self._intermediates

    def _masks_for(self, n):
        """The shared mask buffer (float32), grown to n elements when smaller."""
        if self._masks is None or self._masks.size < n:
            self._drop_graphs()
            self._masks = None
            self._masks = np.empty(n, np.float32)
        return self._masks

    def _drop_graphs(self):
        """Forget every built graph (rebuilt when next needed): a shared buffer is growing."""
        self._graphs.clear()
        self._work_donor, self._work_bytes = None, 0

    def _share_work(self, graph):
        """Give graph the work buffer of the graphs before it (or, when it needs more,
        its own, which the next graphs share)."""
        size = graph.reserve(self.n_threads, share_with=self._work_donor)
        if size > self._work_bytes:
            self._work_donor, self._work_bytes = graph, size
            for g in self._graphs.values():     # all move to it: the smaller one is freed
                g.graph.reserve(self.n_threads, share_with=graph)

    def forward(self, tokens, positions, n_out=None):
        """Run one batch: tokens, positions int (T,) -> logits (n_out, V) of the last
        n_out tokens (default: all T).

        Writes the batch's K/V rows into the cache. The returned array is the
        graph's own output buffer: copy it to keep it past the next call. Calls from
        several threads take turns (the graphs share their buffers and the cache).
        """
        tokens = np.asarray(tokens).reshape(-1)
        positions = np.asarray(positions).reshape(-1)
        T = tokens.size
        if T == 0 or positions.size != T:
            raise ValueError(f"forward: {T} tokens and {positions.size} positions")
        # checked before the int32 cast, which would wrap 2**32 + 3 to 3 and cut 2.9 to 2;
        # distinct, as two tokens at one position would write one cache row at once
        if positions.dtype.kind not in "iu":
            raise ValueError(f"forward: positions must be integers, got {positions.dtype}")
        if positions.min() < 0 or positions.max() >= self.n_ctx:
            raise ValueError(f"forward: positions {positions.min()}..{positions.max()} do not "
                             f"fit a context of {self.n_ctx} tokens")
        if np.unique(positions).size != T:
            raise ValueError("forward: positions must be distinct")
        positions = positions.astype(np.int32)
        if tokens.dtype.kind not in "iu" or not all(0 <= int(t) < self.config.n_vocab
                                                     for t in (tokens.min(), tokens.max())):
            raise ValueError(f"forward: token ids must be integers in 0..{self.config.n_vocab - 1}")
        tokens = tokens.astype(np.int32)
        n_out = T if n_out is None else n_out
        if not 1 <= n_out <= T:
            raise ValueError(f"forward: n_out must be in 1..{T}, got {n_out}")
        with self._lock:
            return self._forward(tokens, positions, n_out)

    def _forward(self, tokens, positions, n_out):
        """forward's work, its arguments checked (int32 arrays), under its lock."""
        cache = self._cache
        if cache.cut_by_fork:
            raise RuntimeError("forward: another thread was running forward on this model when "
                               "the process forked, so its cache is unknown here; call "
                               "model.cache.clear() to start over")
        self.file.check_unchanged()    # a ModelLoadError here, not a SIGBUS in compute
        try:
            slots = cache.begin(positions)
            g = self.graph(tokens.size, cache.window(self.kv_pad), n_out)
            g.tokens[:] = tokens
            g.positions[:] = positions
            g.slots[:] = slots
            if g.kv_index is not None:
                cache.fill_index(g.kv_index, positions)
            else:
                cache.fill_mask(g.mask, positions)
            pool = shared_pool(self.n_threads) if self.n_threads > 1 else None
            g.graph.compute(n_threads=self.n_threads if pool is None else None, pool=pool)
        except BaseException:
            # a failed call (no memory for a graph, Ctrl-C) leaves no position marked
            # as held that it may not have written
            cache.rollback()
            raise
        return g.logits
