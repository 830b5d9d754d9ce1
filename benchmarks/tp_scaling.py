"""Tensor-parallel scaling on one machine: decode and prefill tokens/s of a model on
1 rank x 1 thread, R ranks x 1 thread (mpiexec -n R ... --tp) and 1 rank x R threads, in
the same run, and the all-reduce's cost (per layer of a decode step, in the graph; and
alone, by size).

    python benchmarks/tp_scaling.py -m tinyllama-q4_0.gguf -n 32 -p 64 --rounds 3

Each configuration runs in a process of its own (under mpiexec for R ranks), warms up
(one whole run), then times -n greedy decode steps and a -p token prompt from an empty
cache; the configurations take turns, --rounds times, and the best round of each is
kept (medians printed too); within a process each is timed --reps times and the best
kept. The timed steps run without per-node timing (which slowed two ranks more than one:
every node of both read the clock, and each all-reduce waited for the other's); one more
decode then runs with it on every rank, so each node's time is known: the all-reduce
nodes' (which include waiting for the slower rank), the ops every rank repeats whole
(norms, residual adds, the embedding rows) and the ones the ranks split.
docs/distributed.md's cost model is fitted from these figures. Never part of the tests.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

WORKER = "--worker"
REPEATED_OPS = ("RMS_NORM", "MUL", "ADD", "GET_ROWS")   # every rank computes them whole
PROFILE_ORDER = "bench-profile"   # rank 0's order to the others: per-node timing on or off


def worker(args):
    """One configuration: print one JSON line (rank 0) of its timings."""
    import numpy as np

    import ggml_py as gg
    from ggml_py.core import graph as graph_module
    comm = None
    if args.ranks > 1:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    # per-node timing of every graph, on while profiling[0] (a benchmark's own hook; rank 0
    # switches it on every rank with an order of the benchmark's own)
    profiling = [False]
    compute = graph_module.Graph.compute
    graph_module.Graph.compute = lambda self, n_threads=None, pool=None, profile=False: \
        compute(self, n_threads, pool, profile=profiling[0])
    llm = gg.Llama(args.model, n_ctx=max(args.n_prompt, args.n_gen) + 8, n_threads=args.threads,
                   comm=comm)
    config = llm.config
    if llm.rank > 0:
        execute = llm.model.execute

        def execute_or_profile(order, pool):
            if order[0] == PROFILE_ORDER:
                profiling[0] = order[1]
                return True
            return execute(order, pool)
        llm.model.execute = execute_or_profile
        llm.serve()
        all_reduce_alone(gg, comm, config.n_embd, args.n_prompt)
        return
    bos = llm.token_bos() or 0
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, llm.n_vocab(), args.n_prompt).tolist()

    greedy = gg.SamplingParams(temperature=0)

    def decode():      # greedy from BOS: rank 0 gathers each rank's top token only
        llm.reset()
        t0 = time.perf_counter()
        n = sum(1 for _ in llm.generate_tokens([bos], greedy, max_tokens=args.n_gen,
                                               ignore_eos=True))
        assert n == args.n_gen
        return time.perf_counter() - t0

    def prefill():
        llm.reset()
        t0 = time.perf_counter()
        llm._decode(prompt)
        return time.perf_counter() - t0

    decode(), prefill()                                   # warm-up: every graph built
    decode_s = min(decode() for _ in range(args.reps))
    prefill_s = min(prefill() for _ in range(args.reps))
    profiling[0] = True                                   # one decode more, node by node
    if comm is not None:
        llm.model.channel.send(PROFILE_ORDER, True)
    for g in llm.model._graphs.values():
        g.graph.reset_stats()
    profiled_s = decode()
    nodes = node_times(llm, gg, args.n_gen)
    llm.close()
    result = {"ranks": args.ranks, "threads": args.threads, "n_layer": config.n_layer,
              "decode_tps": args.n_gen / decode_s, "prefill_tps": args.n_prompt / prefill_s,
              "decode_ms": 1e3 * decode_s / args.n_gen,
              "profiled_decode_ms": 1e3 * profiled_s / args.n_gen, **nodes}
    if comm is not None:
        result.update(all_reduce_alone(gg, comm, config.n_embd, args.n_prompt))
    print(json.dumps(result), flush=True)


def node_times(llm, gg, n_tokens):
    """Per decoded token: µs in all-reduce nodes, in ops every rank repeats, in the rest,
    from the profiles of the graphs of one token (each decode step ran one)."""
    sums = {"allreduce_us": 0.0, "repeated_us": 0.0, "split_us": 0.0}
    for key, g in llm.model._graphs.items():
        if key[0] != 1:
            continue
        try:
            stats = g.graph.stats()
        except ValueError:       # built, not run since
            continue
        for r in stats:
            name = "allreduce_us" if r.op == gg.Op.ALL_REDUCE else \
                "repeated_us" if r.op.name in REPEATED_OPS else "split_us"
            sums[name] += r.total_us
    return {k: v / n_tokens for k, v in sums.items()}


def all_reduce_alone(gg, comm, n_embd, n_prompt, reps=300):
    """µs of one all-reduce graph node of (1, E) and (n_prompt, E) floats, every rank
    computing it back to back (rank 0's figures)."""
    out = {}
    for rows in (1, n_prompt):
        ctx = gg.Context(mem_size=8 * rows * n_embd + (1 << 16))
        a = ctx.new_tensor(gg.F32, (rows, n_embd))
        graph = gg.build_forward(gg.all_reduce(a, comm))
        graph.compute(n_threads=1)
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            graph.compute(n_threads=1)
        out[f"allreduce_{rows}x{n_embd}_us"] = 1e6 * (time.perf_counter() - t0) / reps
    return out


def run_config(args, ranks, threads):
    # (python -m mpi4py: an exception on one rank aborts them all, instead of a hang)
    cmd = [sys.executable, "-m", "mpi4py", os.path.abspath(__file__), WORKER, "-m", args.model, "-n",
           str(args.n_gen), "-p", str(args.n_prompt), "--ranks", str(ranks), "--threads",
           str(threads), "--reps", str(args.reps)]
    if ranks > 1:
        mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        cmd = [mpiexec if os.path.exists(mpiexec) else "mpiexec", "-n", str(ranks)] + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", required=True)
    p.add_argument("-n", "--n-gen", type=int, default=32)
    p.add_argument("-p", "--n-prompt", type=int, default=64)
    p.add_argument("-R", "--ranks", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=2, help="timings of each in a process (best kept)")
    p.add_argument(WORKER, action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    R = args.ranks
    configs = [(1, 1), (R, 1), (1, R)]
    runs = {c: [] for c in configs}
    for i in range(args.rounds):
        for c in configs:
            runs[c].append(run_config(args, *c))
            print(f"round {i + 1} {c[0]}x{c[1]}: decode {runs[c][-1]['decode_tps']:.2f} t/s, "
                  f"prefill {runs[c][-1]['prefill_tps']:.2f} t/s", file=sys.stderr, flush=True)
    best = {c: max(r, key=lambda x: x["decode_tps"]) for c, r in runs.items()}
    print("| ranks x threads | decode t/s best (median) | prefill t/s best (median) |")
    print("|---|---:|---:|")
    for c, r in runs.items():
        dec = [x["decode_tps"] for x in r]
        pre = [x["prefill_tps"] for x in r]
        print(f"| {c[0]} x {c[1]} | {max(dec):.2f} ({statistics.median(dec):.2f}) | "
              f"{max(pre):.2f} ({statistics.median(pre):.2f}) |")
    one, split, threaded = best[(1, 1)], best[(R, 1)], best[(1, R)]
    print(f"\ndecode: {R}x1 / 1x1 = x{split['decode_tps'] / one['decode_tps']:.2f}, "
          f"{R}x1 / 1x{R} = x{split['decode_tps'] / threaded['decode_tps']:.2f}")
    print(f"prefill: {R}x1 / 1x1 = x{split['prefill_tps'] / one['prefill_tps']:.2f}, "
          f"{R}x1 / 1x{R} = x{split['prefill_tps'] / threaded['prefill_tps']:.2f}")
    L = split["n_layer"]
    print(f"\nper decoded token ({R}x1, rank 0's graph): all-reduce nodes "
          f"{split['allreduce_us']:.0f} us ({split['allreduce_us'] / L:.0f} us per layer, two "
          f"nodes), repeated ops {split['repeated_us']:.0f} us, split ops "
          f"{split['split_us']:.0f} us; step {1e3 * split['profiled_decode_ms']:.0f} us profiled, "
          f"{1e3 * split['decode_ms']:.0f} us not")
    print(f"per decoded token (1x1): repeated ops {one['repeated_us']:.0f} us, split ops "
          f"{one['split_us']:.0f} us; step {1e3 * one['profiled_decode_ms']:.0f} us profiled, "
          f"{1e3 * one['decode_ms']:.0f} us not")
    alone = {k: v for k, v in split.items() if k.startswith("allreduce_") and k[-3:] == "_us"
             and "x" in k}
    print("all-reduce alone: " + ", ".join(f"{k[10:-3]} {v:.1f} us" for k, v in alone.items()))
    print("\n" + json.dumps({f"{c[0]}x{c[1]}": r for c, r in runs.items()}))


if __name__ == "__main__":
    main()
