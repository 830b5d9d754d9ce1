"""Does tune data pick the fastest MUL_MAT profile?

For each matrix shape of a llama preset, each M and thread count, every profile
is timed directly at full size (fastest of --repeat rounds, the profiles taking
turns, cheap ones in short bursts); the fastest is the oracle. Profiles that run the same code at a thread
count (blas-split and blas-mt are blas at one thread) are timed once. The profile chosen from a tune file (benched here first with
ggml-tune's sampling, unless --tune-file is given) and the one ggml's fallback
rule picks are then compared with it:

    python benchmarks/tune_vs_oracle.py --model-shape 1.1B --type Q4_0 --threads 1,2

Prints a table (tuned / oracle and fallback / oracle time ratios) and a summary.
"""
import argparse
import statistics
import time

import ggml_py as gg
from ggml_py import tune
from ggml_py.tune_bench import (DEFAULT_M_VALUES, bench, distinct_profiles, preset_shapes,
                                random_weight)

import numpy as np


MIN_BURST_SECONDS = 0.004   # a cheap product runs back to back this long (as ggml-tune does) ...
MAX_BURST = 16              # ... at most this many times


def time_profiles(graph, profiles, pool, repeat):
    """{name: fastest wall ms} of the graph's mul_mat under each profile.

    The profiles take turns, round after round, so that a slow spell on the
    machine does not fall on one of them only; in its turn a cheap product runs
    a short burst (workers awake, as inside a graph). The fastest run counts
    (noise only adds time).
    """
    node = graph.nodes[-1]
    runs = {p.name: [] for p in profiles}
    for i in range(repeat + 1):
        for p in profiles:
            node.profile = p
            start = time.perf_counter()
            for _ in range(MAX_BURST):
                t0 = time.perf_counter()
                graph.compute(pool=pool)
                if i > 0:   # the first round warms up
                    runs[p.name].append(time.perf_counter() - t0)
                if time.perf_counter() - start >= MIN_BURST_SECONDS:
                    break
    return {name: 1e3 * min(r) for name, r in runs.items()}


def full_size_graphs(n, k, type, m_values, rng):
    """{M: graph of mul_mat(the whole (n, k) weight, M activation rows)}."""
    m_max = max(m_values)
    ctx = gg.Context(mem_size=gg.row_bytes(type, k) * n + 4 * k * m_max + 8 * n * m_max * len(m_values)
                     + (16 << 20))
    weight = random_weight(ctx, rng, n, k, type)
    acts = ctx.from_numpy(rng.standard_normal((m_max, k)).astype(np.float32))
    return {m: gg.build_forward(gg.mul_mat(weight, gg.view(acts, (m, k)))) for m in m_values}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-shape", default="1.1B")
    p.add_argument("--type", default="Q4_0")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--passes", type=int, default=1, help="ggml-tune passes (default 1)")
    p.add_argument("--tune-file", help="use this tune file instead of benching one now")
    args = p.parse_args()
    type = gg.Type[args.type.upper()]
    threads = [int(t) for t in args.threads.split(",")]
    shapes = preset_shapes(args.model_shape, type)
    print(gg.system_info())

    if args.tune_file:
        data = tune.load(args.tune_file)
    else:
        start = time.perf_counter()
        data = bench(shapes, model="oracle-check", thread_counts=threads, passes=args.passes)
        print(f"tune bench: {time.perf_counter() - start:.1f} s for {len(shapes)} shapes "
              f"x {len(DEFAULT_M_VALUES)} M x threads {threads}, {args.passes} pass(es)")

    rng = np.random.default_rng(1)
    print(f"{'N x K':>12} {'M':>4} {'thr':>3}  {'oracle':<11} {'ms':>8}  {'tuned':<11} {'x':>5}  "
          f"{'fallback':<11} {'x':>5}")
    tuned_ratios, fallback_ratios = [], []
    pools = {t: gg.ThreadPool(t) for t in threads}
    for n, k, _ in shapes:
        for m, graph in full_size_graphs(n, k, type, data.m_values, rng).items():
            node = graph.nodes[-1]
            for t in threads:
                candidates = distinct_profiles(node.profiles(), t)
                times = time_profiles(graph, candidates, pools[t], args.repeat)
                oracle = min(times, key=times.get)
                node.profile_pinned = False
                tuned = graph.plan(t, tune=data).rows[-1].profile.name
                fallback = node.default_profile().name

                def ms(name):   # at one thread blas-split and blas-mt run blas's code
                    return times[name] if name in times else times["blas"]

                tr, fr = ms(tuned) / times[oracle], ms(fallback) / times[oracle]
                tuned_ratios.append(tr)
                fallback_ratios.append(fr)
                print(f"{n:>6}x{k:<5} {m:>4} {t:>3}  {oracle:<11} {times[oracle]:8.2f}  {tuned:<11} "
                      f"{tr:5.2f}  {fallback:<11} {fr:5.2f}")
    for pool in pools.values():
        pool.close()
    within = sum(r <= 1.05 for r in tuned_ratios)
    print(f"\ntuned within 5 % of the oracle: {within}/{len(tuned_ratios)}; "
          f"worst tuned x{max(tuned_ratios):.2f}, worst fallback x{max(fallback_ratios):.2f}; "
          f"mean tuned x{statistics.mean(tuned_ratios):.3f}, fallback x{statistics.mean(fallback_ratios):.3f}")


if __name__ == "__main__":
    main()
