"""ggml-bench mulmat: MUL_MAT speed per weight type, shape, batch size M,
profile and thread count, next to the machine's own yardsticks measured in the
same run: numpy float32 matmul GFLOPS on the same shape and a large-array read
bandwidth on as many threads. Every figure is also printed as a fraction of them.

Shapes are weight matrices N x K (numpy order: N rows of K); the activations
are M x K. Defaults: the four matrix shapes of a 1.1B llama.
"""
import argparse
import json
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ggml_py.cli.common import (positive_int, positive_int_list, positive_number, thread_list,
                                weight_type_list)

DEFAULT_SHAPES = "2048x2048,5632x2048,2048x5632,32000x2048"
DEFAULT_M = "1,8,32,128,512"
DEFAULT_TYPES = "f16,q4_0,q8_0,q4_K"


def add_arguments(parser):
    """Options of `ggml-bench mulmat`."""
    parser.add_argument("--shapes", type=shape_list, default=DEFAULT_SHAPES,
                        help="weights NxK, comma separated")
    parser.add_argument("--m", type=positive_int_list, default=DEFAULT_M,
                        help="activation rows M, comma separated")
    parser.add_argument("--types", type=weight_type_list, default=DEFAULT_TYPES,
                        help="weight types (f32, f16, q4_0, ...)")
    parser.add_argument("--threads", type=thread_list, default="1,2",
                        help="thread counts, comma separated")
    parser.add_argument("--profiles", type=profile_names, default="all",
                        help="comma-separated MUL_MAT profile names, or 'all' valid ones")
    parser.add_argument("--repeat", type=positive_int, default=5,
                        help="timed runs per case (median kept)")
    parser.add_argument("--max-seconds", type=positive_number, default=2.0,
                        help="stop repeating a case once it has run this long")
    parser.add_argument("--bandwidth-mib", type=positive_int, default=512,
                        help="size of the read-bandwidth array")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def check_memory(shapes, m_max):
    """ValueError naming the first of `shapes` whose F32 weights, their typed copy and
    the activations of m_max rows would not fit in this machine's memory."""
    import psutil
    total = psutil.virtual_memory().total
    for n, k in shapes:
        need = 4 * (2 * n * k + m_max * (n + k))
        if need > total:
            raise ValueError(f"--shapes {n}x{k}: needs {need / 2**30:,.1f} GiB of memory at M = "
                             f"{m_max}; this machine has {total / 2**30:.1f} GiB")


def shape_list(text):
    """--shapes: comma-separated weight shapes NxK (N rows of K), e.g. 2048x5632."""
    shapes = []
    for item in text.split(","):
        try:
            n, k = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad shape {item!r} (expected NxK, e.g. 2048x5632)") from None
        if n <= 0 or k <= 0:
            raise argparse.ArgumentTypeError(f"bad shape {item!r}: N and K must be positive")
        shapes.append((n, k))
    return shapes


def profile_names(text):
    """--profiles: None for 'all', else a set of MUL_MAT profile names."""
    import ggml_py as gg
    if text == "all":
        return None
    wanted = {p.strip() for p in text.split(",")}
    known = {p.name for t in (gg.F32, gg.Q4_0) for p in gg.task_profiles(gg.Op.MUL_MAT, t)}
    if not wanted <= known:
        raise argparse.ArgumentTypeError(f"unknown {sorted(wanted - known)}; choose from "
                                         f"{sorted(known)} or 'all'")
    return wanted


def _median_time(fn, repeat, max_seconds):
    fn()   # warm-up: page in weights, size buffers, wake threads
    times, start = [], time.perf_counter()
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > max_seconds:
            break
    return statistics.median(times)


def read_bandwidth(mib, repeat=5, threads=1):
    """Bytes/s of reading a large float32 array on `threads` threads at once, each
    its own slice (best of numpy's sum and BLAS sdot, both run without the GIL): a
    roofline for work spread over that many threads."""
    a = np.ones(mib * (1 << 20) // 4, np.float32)
    parts = np.array_split(a, threads)
    with ThreadPoolExecutor(threads) as pool:
        def read(f):
            return f(a) if threads == 1 else list(pool.map(f, parts))
        t_sum = _median_time(lambda: read(np.sum), repeat, 5.0)
        t_dot = _median_time(lambda: read(lambda p: np.dot(p, p)), repeat, 5.0)   # reads p once
    return a.nbytes / min(t_sum, t_dot)


def numpy_gflops(n, k, m, repeat, max_seconds):
    """GFLOP/s of numpy's float32 x @ w.T, x (m, k), w (n, k): 2*n*k*m over the median time."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((n, k), dtype=np.float32)
    x = rng.standard_normal((m, k), dtype=np.float32)
    out = np.empty((m, n), np.float32)
    t = _median_time(lambda: np.matmul(x, w.T, out=out), repeat, max_seconds)
    return 2.0 * n * k * m / t / 1e9


def run(args):
    """Measure every case and print a table (or JSON); returns an exit code."""
    import ggml_py as gg

    shapes, m_values, threads, types = args.shapes, args.m, args.threads, args.types
    wanted = args.profiles
    offered = {p.name for t in types for p in gg.task_profiles(gg.Op.MUL_MAT, t)}
    if wanted is not None and not wanted & offered:
        raise ValueError(f"--profiles {','.join(sorted(wanted))}: no such profile for "
                         f"{', '.join(t.name for t in types)} (they have {', '.join(sorted(offered))})")

    check_memory(shapes, max(m_values))
    # a roofline per thread count: one thread alone does not reach the machine's bandwidth
    bandwidth = {nt: read_bandwidth(args.bandwidth_mib, threads=nt) for nt in threads}
    rows = []
    rng = np.random.default_rng(1)
    for n, k in shapes:
        w = rng.standard_normal((n, k), dtype=np.float32)
        for t in types:
            blck = gg.type_traits(t)["blck_size"]
            if k % blck:
                print(f"# skipping {t.name} {n}x{k}: K is not a multiple of {blck}", file=sys.stderr)
                continue
            weight_bytes = gg.row_bytes(t, k) * n
            ctx_w = gg.Context(mem_size=weight_bytes + (1 << 20))
            a = ctx_w.from_numpy(w, type=t)
            for m in m_values:
                np_gflops = numpy_gflops(n, k, m, args.repeat, args.max_seconds)
                ctx = gg.Context(mem_size=4 * k * m + 4 * n * m + (1 << 20))
                b = ctx.from_numpy(rng.standard_normal((m, k), dtype=np.float32))
                # the weights live in their own context; ops need one context, so
                # view them through a tensor of this one sharing the memory
                a_here = ctx.from_buffer(a.numpy().reshape(-1), t, (n, k))
                y = gg.mul_mat(a_here, b)
                graph = gg.build_forward(y)
                for profile in y.profiles():
                    if wanted is not None and profile.name not in wanted:
                        continue
                    y.profile = profile
                    for nt in threads:
                        sec = _median_time(lambda: graph.compute(n_threads=nt), args.repeat, args.max_seconds)
                        gflops = 2.0 * n * k * m / sec / 1e9
                        gbps = weight_bytes / sec / 1e9
                        rows.append({
                            "type": t.name, "n": n, "k": k, "m": m, "profile": profile.name,
                            "threads": nt, "ms": sec * 1e3, "gflops": gflops, "weight_gbps": gbps,
                            "numpy_gflops": np_gflops, "read_gbps": bandwidth[nt] / 1e9,
                            "frac_numpy": gflops / np_gflops, "frac_bandwidth": gbps * 1e9 / bandwidth[nt],
                        })
                        if not args.json:
                            _print_row(rows[-1], header=len(rows) == 1)
    if args.json:
        print(json.dumps({"machine": platform.processor() or platform.machine(),
                          "system_info": gg.system_info(),
                          "read_gbps": {str(nt): bw / 1e9 for nt, bw in bandwidth.items()},
                          "results": rows}, indent=1))
    else:
        per_thread = ", ".join(f"{bw / 1e9:.1f} GB/s on {nt}" for nt, bw in bandwidth.items())
        print(f"# read bandwidth {per_thread} thread(s); {gg.system_info()}")
    return 0


def _print_row(r, header):
    if header:
        print(f"{'type':<5} {'N x K':>12} {'M':>4} {'profile':<10} {'thr':>3} {'ms':>9} "
              f"{'GFLOPS':>8} {'GB/s':>6} {'np GFLOPS':>9} {'x numpy':>7} {'x bw':>5}", flush=True)
    print(f"{r['type']:<5} {str(r['n']) + 'x' + str(r['k']):>12} {r['m']:>4} {r['profile']:<10} "
          f"{r['threads']:>3} {r['ms']:>9.3f} {r['gflops']:>8.2f} {r['weight_gbps']:>6.2f} "
          f"{r['numpy_gflops']:>9.2f} {r['frac_numpy']:>7.2f} {r['frac_bandwidth']:>5.2f}", flush=True)
