"""Does tune data pick the fastest MUL_MAT profile?

For each matrix shape of a llama preset, each M and thread count, every profile
is timed directly at full size in --repeat rounds (the profiles taking turns,
cheap ones in short bursts, a round's time the burst's fastest run; close ones
get up to three times as many rounds more), in --sweeps sweeps over the whole
grid, minutes apart. The fastest profile is the oracle, in two views: by each
profile's fastest round (the machine at its fastest), and by its median round
(what a run at a random moment can expect; --save-oracle keeps every round).
Profiles that run the same code at a thread count (blas-split and blas-mt are
blas at one thread) are timed once. The profile chosen from a tune file
(benched here first with ggml-tune's sampling, unless --tune-file is given) and
the one the built-in rule (no tune file) picks are then compared with it:

    python benchmarks/tune_vs_oracle.py --model-shape 1.1B --type Q4_0 --threads 1,2

Prints a table (tuned / oracle and fallback / oracle time ratios, fastest
rounds) and a summary with the misses for each view. Several tune files (say,
from two versions of the sampling, benched in turns) can be scored against one
oracle:

    python benchmarks/tune_vs_oracle.py --tune-file a1.json b1.json a2.json b2.json
"""
import json
import statistics
import sys
import time

import ggml_py as gg
from ggml_py.tune import data as tune
from ggml_py.cli.common import ArgumentParser, positive_int, run, weight_type
from ggml_py.files.output import atomic_output
from ggml_py.tune.bench import (DEFAULT_M_VALUES, MAX_RUNS, MIN_CASE_SECONDS, PRESETS, Waker,
                                bench, distinct_profiles, preset_shapes, random_weight)
from ggml_py.cli.tune import parse_threads

import numpy as np

from stolen_time import StolenTime


UNSETTLED = 1.25            # profiles this close to the fastest get more rounds


def time_profiles(graph, profiles, pool, repeat):
    """{name: [ms of each round]} of the graph's mul_mat under each profile.

    The profiles take turns, round after round, so that a slow spell on the
    machine does not fall on one of them only; in its turn a cheap product runs
    a short burst, as ggml-tune's cases do (workers awake, as inside a graph),
    and the round's time is the burst's fastest run. After `repeat` rounds, the
    profiles within UNSETTLED of the fastest run more rounds, up to 4 x repeat
    in all, until the fastest leads by that much or stands alone.
    """
    node = graph.nodes[-1]
    rounds = {p.name: [] for p in profiles}
    waker = Waker()

    def fastest_ms(name):
        return min(rounds[name])

    def run_round(candidates, warm_up=False):
        for p in candidates:
            node.profile = p
            waker.wake(pool)   # not paying for the previous profile's sleeping workers
            start = time.perf_counter()
            burst = []
            for _ in range(MAX_RUNS):
                t0 = time.perf_counter()
                graph.compute(pool=pool)
                burst.append(1e3 * (time.perf_counter() - t0))
                if time.perf_counter() - start >= MIN_CASE_SECONDS:
                    break
            if not warm_up:
                rounds[p.name].append(min(burst))

    run_round(profiles, warm_up=True)
    for _ in range(repeat):
        run_round(profiles)
    for _ in range(3 * repeat):
        best = min(fastest_ms(p.name) for p in profiles)
        close = [p for p in profiles if fastest_ms(p.name) <= UNSETTLED * best]
        if len(close) < 2:
            break
        run_round(close)
    return rounds


def full_size_graphs(n, k, type, m_values, rng, max_threads, share_with=None):
    """{M: graph of mul_mat(the whole (n, k) weight, M activation rows)}, their
    work buffers reserved for every profile (one buffer, shared)."""
    m_max = max(m_values)
    ctx = gg.Context(mem_size=gg.row_bytes(type, k) * n + 4 * k * m_max + 8 * n * m_max * len(m_values)
                     + (16 << 20))
    weight = random_weight(ctx, rng, n, k, type)
    acts = ctx.from_numpy(rng.standard_normal((m_max, k)).astype(np.float32))
    graphs = {}
    for m in m_values:
        graph = graphs[m] = gg.build_forward(gg.mul_mat(weight, gg.view(acts, (m, k))))
        graph.lookahead = 0   # workers stay awake between runs, as between a model's nodes
        node = graph.nodes[-1]
        for profile in node.profiles():
            node.profile = profile
            graph.reserve(max_threads, share_with=share_with)
        share_with = share_with or graph
    return graphs


def oracle_times(shapes, type, m_values, threads, repeat, sweeps):
    """{(n, k, M, threads): {profile name: [ms of each round]}} over `sweeps`
    sweeps of the whole grid: the machine's speed drifts over minutes (and not
    alike for every kernel), so each product is timed at several moments,
    minutes apart."""
    rng = np.random.default_rng(1)
    pools = {t: gg.ThreadPool(t) for t in threads}
    graphs, first = {}, None
    for n, k, _ in shapes:
        graphs[n, k] = full_size_graphs(n, k, type, m_values, rng, max(threads), share_with=first)
        first = first or next(iter(graphs[n, k].values()))
    times = {}
    for sweep in range(sweeps):
        with StolenTime() as stolen:
            for (n, k), by_m in graphs.items():
                for m, graph in by_m.items():
                    for t in threads:
                        candidates = distinct_profiles(graph.nodes[-1].profiles(), t)
                        new = time_profiles(graph, candidates, pools[t], repeat)
                        old = times.setdefault((n, k, m, t), {})
                        for name, rounds in new.items():
                            old.setdefault(name, []).extend(rounds)
        print(f"oracle sweep {sweep + 1}/{sweeps} ({stolen})", flush=True)
    for pool in pools.values():
        pool.close()
    return times, graphs


def main(argv=None):
    p = ArgumentParser(prog="tune_vs_oracle.py", description=__doc__.splitlines()[0])
    p.add_argument("--model-shape", default="1.1B", choices=sorted(PRESETS))
    p.add_argument("--type", type=weight_type, default=gg.Type.Q4_0)
    p.add_argument("--threads", type=parse_threads, default=[1, 2])
    p.add_argument("--repeat", type=positive_int, default=5)
    p.add_argument("--sweeps", type=positive_int, default=3,
                   help="oracle sweeps over the grid (default 3)")
    p.add_argument("--passes", type=positive_int, default=None,
                   help="ggml-tune passes (default 1)")
    p.add_argument("--tune-file", nargs="+", metavar="FILE",
                   help="use these tune files instead of benching one now (the table shows the "
                        "first; each gets a summary line)")
    p.add_argument("--save-tune", metavar="FILE", help="save the tune data benched now")
    p.add_argument("--save-oracle", metavar="FILE",
                   help="save the oracle's rounds (JSON: per case, per profile, ms of each round)")
    args = p.parse_args(argv)
    if args.tune_file and (args.save_tune or args.passes is not None):
        p.error("--save-tune and --passes are for the tune data benched here, not with --tune-file")
    args.passes = args.passes or 1
    type, threads = args.type, args.threads
    shapes = preset_shapes(args.model_shape, type)
    for path in (args.save_tune, args.save_oracle):
        if path is not None:
            tune.check_writable(path)     # before minutes of measuring, not after
    print(gg.system_info())

    if args.tune_file:
        # a file without these shapes or thread counts would be scored on the fallback rule
        datas = [tune.load(f, shapes=shapes) for f in args.tune_file]
        for f, data in zip(args.tune_file, datas):
            missing = sorted(set(threads) - set(data.thread_counts))
            if missing:
                raise ValueError(f"{f}: not benched at {missing} thread(s); pass --threads "
                                 f"{','.join(map(str, data.thread_counts))} or bench again")
    else:
        start = time.perf_counter()
        with StolenTime() as stolen:
            datas = [bench(shapes, model="oracle-check", thread_counts=threads, passes=args.passes)]
        print(f"tune bench: {time.perf_counter() - start:.1f} s for {len(shapes)} shapes "
              f"x {len(DEFAULT_M_VALUES)} M x threads {threads}, {args.passes} pass(es) ({stolen})")
        if args.save_tune:
            datas[0].save(args.save_tune)

    rounds, graphs = oracle_times(shapes, type, datas[0].m_values, threads, args.repeat, args.sweeps)
    if args.save_oracle:
        with atomic_output(args.save_oracle) as tmp, open(tmp, "w") as f:
            json.dump([[list(key), by_name] for key, by_name in rounds.items()], f)
    views = {stat: {key: {p: reduce(r) for p, r in by_name.items()} for key, by_name in rounds.items()}
             for stat, reduce in (("fastest round", min), ("median round", statistics.median))}
    print(f"{'N x K':>12} {'M':>4} {'thr':>3}  {'oracle':<11} {'ms':>8}  {'tuned':<11} {'x':>5}  "
          f"{'fallback':<11} {'x':>5}   (oracle: each profile's fastest round)")
    for j, data in enumerate(datas):
        name = f"{args.tune_file[j]}: " if args.tune_file and len(datas) > 1 else ""
        for stat, times in views.items():
            print(f"\n{name}against each profile's {stat}: "
                  + compare(data, times, graphs, print_table=(j == 0 and stat == "fastest round")))


def compare(data, times, graphs, print_table):
    """Summary line of the profiles `data` picks against the oracle `times`
    ({case: {profile: ms}}) and the built-in rule; print_table: print a
    row per case too."""
    tuned_ratios, fallback_ratios, misses = [], [], []
    for (n, k, m, t), ms_of in times.items():
        graph = graphs[n, k][m]
        node = graph.nodes[-1]
        oracle = min(ms_of, key=ms_of.get)
        node.profile_pinned = False
        tuned = graph.plan(t, tune=data).rows[-1].profile.name
        fallback = node.default_profile().name

        def ms(name):   # at one thread blas-split and blas-mt run blas's code
            return ms_of[name] if name in ms_of else ms_of["blas"]

        tr, fr = ms(tuned) / ms_of[oracle], ms(fallback) / ms_of[oracle]
        tuned_ratios.append(tr)
        fallback_ratios.append(fr)
        if tr > 1.05:
            misses.append(f"{n}x{k} M={m} {t} thr: {tuned} x{tr:.2f}")
        if print_table:
            print(f"{n:>6}x{k:<5} {m:>4} {t:>3}  {oracle:<11} {ms_of[oracle]:8.2f}  {tuned:<11} "
                  f"{tr:5.2f}  {fallback:<11} {fr:5.2f}")
    within = sum(r <= 1.05 for r in tuned_ratios)
    return (f"tuned within 5 % of the oracle: {within}/{len(tuned_ratios)}; "
            f"worst tuned x{max(tuned_ratios):.2f}, worst fallback x{max(fallback_ratios):.2f}; "
            f"mean tuned x{statistics.mean(tuned_ratios):.3f}, "
            f"fallback x{statistics.mean(fallback_ratios):.3f}"
            + "".join(f"\n  missed {miss}" for miss in misses))


if __name__ == "__main__":
    sys.exit(run("tune_vs_oracle.py", main))
