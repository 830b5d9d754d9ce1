"""Measuring the attention op's profiles (slim, flash) for the tune file.

For each shape (head size, heads, KV heads, K and V cache types), each number of query
tokens T and each list length L: one node over L cache rows (T tokens at the end of the
list, causal), each profile timed in turns, the best of the runs. The planner reads the
result through TuneData.attention_estimates (core/graph.choose_attention_profile).
"""
import time

import numpy as np

from ggml_py.core.graph import build_forward
from ggml_py.core.ops import attention, set_rows
from ggml_py.core.tensor import Context
from ggml_py.core.types import Type, row_bytes
from ggml_py.tune.data import ATTENTION_PROFILES, AttentionTimes

DEFAULT_TOKENS = [1, 16, 256]          # decode, a step of a few sequences, a prompt's batch
DEFAULT_LENGTHS = [256, 1024, 4096]


def _pool(ctx, x, type):
    """A cache pool holding x (Hkv, L, D) in type, head-major as the model's caches hold
    their rows, and its scales (Hkv, L, 1) (I8)."""
    if type != Type.I8:
        return ctx.from_numpy(x, type=type), None
    rows = ctx.new_tensor(Type.I8, x.shape)
    scales = ctx.new_tensor(Type.F32, x.shape[:2] + (1,))
    ids = ctx.from_numpy(np.arange(x.shape[1], dtype=np.int32))
    build_forward(set_rows(rows, ctx.from_numpy(x), ids, scales)).compute(n_threads=1)
    return rows, scales


def attention_case(shape, T, L, rng):
    """(context, node, graph) of one attention node: T query tokens over a list of L."""
    D, H, Hkv, type_k, type_v = shape
    T = min(T, L)
    pool_bytes = L * (row_bytes(Type.F32, Hkv * D) + 4 * Hkv)    # at most, and its F32 source
    ctx = Context(mem_size=8 * pool_bytes + 8 * (T * H * D + 2 * T + L) + (1 << 20))
    x = rng.standard_normal((Hkv, L, D)).astype(np.float32)
    k, ks = _pool(ctx, x, type_k)
    v, vs = _pool(ctx, x, type_v)
    counts = np.arange(L - T + 1, L + 1, dtype=np.int32)
    index = np.concatenate([np.stack([np.full(T, 2 * T, np.int32), counts], 1).ravel(),
                            np.arange(L, dtype=np.int32)])
    q = ctx.from_numpy(rng.standard_normal((T, H, D)).astype(np.float32))
    out = attention(q, k, v, ctx.from_numpy(index), 1 / np.sqrt(D), ks, vs)
    return ctx, out, build_forward(out)


def bench_attention(shapes, thread_counts, tokens=None, lengths=None, repetitions=3, seed=0,
                    progress=None):
    """[AttentionTimes] of each shape (head_dim, n_head, n_head_kv, type_k, type_v).

    progress: as tune.bench's (a callable(n_steps) returning a bar with update()), or None.
    """
    tokens = sorted(set(tokens or DEFAULT_TOKENS))
    lengths = sorted(set(lengths or DEFAULT_LENGTHS))
    if len(lengths) < 2:
        raise ValueError(f"bench_attention needs two or more lengths, got {lengths}")
    rng = np.random.default_rng(seed)
    bar = progress(len(shapes) * len(tokens) * len(lengths)) if progress else None
    results = []
    for shape in shapes:
        D, H, Hkv, type_k, type_v = shape
        if H % Hkv:
            raise ValueError(f"bench_attention: {Hkv} KV heads do not divide {H} heads")
        times = {p: {t: [[0.0] * len(lengths) for _ in tokens] for t in thread_counts}
                 for p in ATTENTION_PROFILES}
        for i, T in enumerate(tokens):
            for j, L in enumerate(lengths):
                _, node, graph = attention_case(shape, T, L, rng)
                profiles = {p.name: p for p in node.profiles()}
                for n_threads in thread_counts:
                    best = {p: float("inf") for p in ATTENTION_PROFILES}
                    for run in range(repetitions + 1):     # the first run warms up
                        for name in ATTENTION_PROFILES:    # in turns: a slow spell hits both
                            node.profile = profiles[name]
                            t0 = time.perf_counter()
                            graph.compute(n_threads=n_threads)
                            if run:
                                best[name] = min(best[name], time.perf_counter() - t0)
                    for name in ATTENTION_PROFILES:
                        times[name][n_threads][i][j] = 1e6 * best[name]
                if bar is not None:
                    bar.update(1)
        results.append(AttentionTimes(D, H, Hkv, Type(type_k), Type(type_v), tokens, lengths,
                                      times))
    if bar is not None:
        bar.close()
    return results
