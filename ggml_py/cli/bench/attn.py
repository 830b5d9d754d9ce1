"""ggml-bench attn: time per attention layer against context length, per profile and KV
cache type (the layout of Table 3 of the xFasterTransformer paper: one row per length).

For each length L of -L: one layer's attention over L tokens - by default the prompt's
(L query tokens, causal, as the seed's "generation of the first token"), with --decode one
new token's over L cached ones - computed by the three-node graph (mul_mat, soft_max,
mul_mat over an F16 cache; BLAS for 32 query rows and more, as the model runs it) and by
the attention op with each profile (slim, flash) and each -ctk type (K and V of that
type). Reported: milliseconds per layer, the best of -r runs after a warm-up, profiles
and types in turns so that a slow spell on the machine falls on all of them. With --cold,
the CPU's caches are filled with other data before each run (a read of 64 MiB), as in a
model, where a layer's weights stream through between one layer's attention and the next:
the layer's K and V then come from memory.
Shapes: the model's (-m) or --shape H,Hkv,D (default 32,32,128: Llama 2 7B's, the paper's).
"""
import argparse
import json
import time

import numpy as np

import ggml_py as gg
from ggml_py.cli.common import count_list, file_name, positive_int
from ggml_py.cli.common import run as run_reporting_errors
from ggml_py.core import ops
from ggml_py.core.graph import build_forward
from ggml_py.core.tensor import Context
from ggml_py.core.types import Type
from ggml_py.model.forward import graph_attention
from ggml_py.model.kv_rows import KV_TYPE_NAMES, KVRows

PROG = "ggml-bench attn"
GRAPH_MAX_SCORE_BYTES = 3 << 30     # the three-node graph's (H, T, L) scores, at most
COLD_BYTES = 64 << 20               # --cold: read before each run, twice a large L3


def shape_triple(text):
    """--shape H,Hkv,D."""
    values = count_list(text)
    if len(values) != 3 or min(values) < 1 or values[0] % values[1]:
        raise argparse.ArgumentTypeError(f"expected H,Hkv,D with Hkv dividing H, got {text!r}")
    return tuple(values)


def kv_type_list(text):
    """-ctk: comma-separated KV cache types."""
    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in KV_TYPE_NAMES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"expected types among {', '.join(KV_TYPE_NAMES)}, "
                                         f"got {text!r}")
    return names


def add_arguments(parser):
    """The flags of `ggml-bench attn`."""
    parser.add_argument("-m", "--model", type=file_name, default=None, metavar="FNAME",
                        help="take the attention shape (heads, KV heads, head size) of this GGUF")
    parser.add_argument("--shape", type=shape_triple, default=None, metavar="H,Hkv,D",
                        help="query heads, KV heads, head size (default 32,32,128)")
    parser.add_argument("-L", "--lengths", type=count_list, default=[256, 512, 1024, 2048, 4096],
                        help="context lengths, comma-separated (default 256,512,1024,2048,4096)")
    parser.add_argument("-ctk", "--cache-types", type=kv_type_list, default=["f16", "int8"],
                        help="KV cache types of the attention op (default f16,int8)")
    parser.add_argument("--profiles", default="graph,slim,flash",
                        help="among graph (three nodes), slim, flash (default all three)")
    parser.add_argument("--decode", action="store_true",
                        help="one query token over L cached ones (default: L causal query tokens)")
    parser.add_argument("--cold", action="store_true",
                        help="fill the caches with other data before each run, so that K and V "
                             "come from memory (as in a model)")
    parser.add_argument("-t", "--threads", type=positive_int, default=None,
                        help="threads (default: physical cores)")
    parser.add_argument("-r", "--repetitions", type=positive_int, default=3,
                        help="timed runs per cell, the best kept (default 3)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--plot", default=None, metavar="PNG",
                        help="draw ms per layer against L into this PNG (needs matplotlib)")


def run(args):
    """Run the benchmark; a bad value, model or output ends in one line and status 1."""
    return run_reporting_errors(PROG, bench_attn, args)


def attention_shape(args):
    """(H, Hkv, D) of -m or --shape."""
    if args.model is not None:
        if args.shape is not None:
            raise ValueError("give -m or --shape, not both")
        from ggml_py.files.gguf_reader import GGUFModelFile
        from ggml_py.model.config import LlamaConfig
        c = LlamaConfig.from_gguf(GGUFModelFile(args.model))
        return c.n_head, c.n_head_kv, c.head_dim
    return args.shape or (32, 32, 128)


class Case:
    """One cell: the graph of one layer's attention for (L, profile, type), built once."""

    def __init__(self, H, Hkv, D, L, T, profile, type, rng):
        # the graph's results are not packed: scores, probabilities and copies
        self.ctx = Context(mem_size=3 * 4 * H * T * L + 4 * T * L + 16 * T * H * D + 16 * L * Hkv * D
                           + (16 << 20))
        ctx, scale = self.ctx, 1 / np.sqrt(D)
        q = ctx.from_numpy(rng.standard_normal((T, H, D)).astype(np.float32))
        if profile == "graph":
            # head-major (Hkv, L, D), as the model's caches: keys and values are the cache
            keys = values = ctx.from_numpy(rng.standard_normal((Hkv, L, D)).astype(np.float16),
                                           type=Type.F16)
            mask = ctx.from_numpy(np.where(np.arange(L)[None, :] <= np.arange(L - T, L)[:, None],
                                           np.float32(0), np.float32(-np.inf)))
            out = graph_attention(q, keys, values, mask, scale)
        else:
            rows = KVRows(1, L, Hkv, D, type, type, "the bench's cache")
            x = ctx.from_numpy(rng.standard_normal((L, Hkv * D)).astype(np.float32))
            slots = ctx.from_numpy(np.arange(L, dtype=np.int32))
            kv = rows.store(ctx, 0, x, x, slots, "bench")
            build_forward(kv.k, kv.v).compute(n_threads=1)     # the rows, written once
            self.rows = rows
            k, v, ks, vs = rows.leaves(ctx, 0, "bench")
            counts = np.arange(L - T + 1, L + 1, dtype=np.int32)
            index = np.concatenate([np.stack([np.full(T, 2 * T, np.int32), counts], 1).ravel(),
                                    np.arange(L, dtype=np.int32)])
            out = ops.attention(q, k, v, ctx.from_numpy(index), scale, ks, vs)
            out.profile = next(p for p in out.profiles() if p.name == profile)
        self.graph = build_forward(out)

    def time(self, n_threads):
        t0 = time.perf_counter()
        self.graph.compute(n_threads=n_threads)
        return time.perf_counter() - t0


def columns(args):
    """[(profile, type name)]: graph once (F16), the op's profiles per type."""
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    bad = [p for p in profiles if p not in ("graph", "slim", "flash")]
    if bad or not profiles:
        raise ValueError(f"--profiles: expected graph, slim, flash, got {args.profiles!r}")
    cols = [("graph", "f16")] if "graph" in profiles else []
    return cols + [(p, t) for t in args.cache_types for p in profiles if p != "graph"]


def bench_attn(args):
    """Time every cell, print the table (or JSON) and the plot. Returns 0."""
    if args.plot is not None:
        from ggml_py.cli.tune import plot_path
        args.plot = plot_path(args.plot)     # checked before the work
    H, Hkv, D = attention_shape(args)
    n_threads = args.threads or gg.default_threads()
    cols = columns(args)
    rng = np.random.default_rng(0)
    other = np.ones(COLD_BYTES // 4, np.float32) if args.cold else None
    rows = []
    for L in args.lengths:
        T = 1 if args.decode else L
        cases = {}
        for profile, name in cols:
            if profile == "graph" and 8 * H * T * L > GRAPH_MAX_SCORE_BYTES:
                continue            # (scores and probabilities, float32, would not fit)
            if name in ("q8_0", "q4_0") and D % 32:
                continue
            cases[(profile, name)] = Case(H, Hkv, D, L, T, profile, KV_TYPE_NAMES[name], rng)
        best = {key: float("inf") for key in cases}
        for key, case in cases.items():
            case.time(n_threads)                   # warm-up
        for _ in range(args.repetitions):
            for key, case in cases.items():
                if args.cold:
                    other.sum()
                best[key] = min(best[key], case.time(n_threads))
        rows.append({"length": L, "tokens": T,
                     "ms": {f"{p} {t}": 1e3 * best[(p, t)] if (p, t) in best else None
                            for p, t in cols}})
        if not args.json:
            print_row(rows[-1], cols, first=len(rows) == 1, H=H, Hkv=Hkv, D=D, n_threads=n_threads,
                      decode=args.decode, cold=args.cold)
        cases.clear()
    if args.json:
        print(json.dumps({"system_info": gg.system_info(), "shape": [H, Hkv, D], "n_threads": n_threads,
                          "decode": args.decode, "cold": args.cold, "results": rows}, indent=1))
    else:
        print(f"\n{gg.system_info()}")
    if args.plot is not None:
        plot(rows, cols, args.plot, (H, Hkv, D), args.decode)
    return 0


def print_row(r, cols, first, H, Hkv, D, n_threads, decode, cold=False):
    """One Markdown row (the header before the first)."""
    if first:
        what = "one new token over L cached" if decode else "L causal query tokens"
        what += ", K and V from memory" if cold else ""
        print(f"attention of one layer, H={H} Hkv={Hkv} D={D}, {what}, {n_threads} threads, "
              f"ms (best of runs)\n")
        print("|     L | " + " | ".join(f"{p} {t}" for p, t in cols) + " |")
        print("|------:|" + "|".join("-" * (len(p) + len(t) + 2) + ":" for p, t in cols) + "|")
    cells = []
    for p, t in cols:
        v = r["ms"][f"{p} {t}"]
        cells.append(f"{'-' if v is None else f'{v:.3f}':>{len(p) + len(t) + 1}}")
    print(f"| {r['length']:>5} | " + " | ".join(cells) + " |", flush=True)


def plot(rows, cols, path, shape, decode):
    """ms per layer against L, one line per column, drawn into path (log-log)."""
    import os

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ggml_py.files.output import atomic_output
    fig, ax = plt.subplots(figsize=(6, 4))
    for p, t in cols:
        pts = [(r["length"], r["ms"][f"{p} {t}"]) for r in rows if r["ms"][f"{p} {t}"] is not None]
        if pts:
            ax.plot(*zip(*pts), "o-" if p != "graph" else "s--", label=f"{p} {t}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length L")
    ax.set_ylabel("ms per attention layer")
    H, Hkv, D = shape
    ax.set_title(f"ggml-bench attn: H={H} Hkv={Hkv} D={D}, " + ("decode" if decode else "prompt"))
    ax.grid(True, alpha=0.3)
    ax.legend()
    with atomic_output(path) as written:
        fig.savefig(written, format=os.path.splitext(path)[1][1:].lower(), dpi=120,
                    bbox_inches="tight")
    plt.close(fig)

