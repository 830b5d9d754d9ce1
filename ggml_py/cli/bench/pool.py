"""ggml-bench pool: what the worker pool costs.

1. Dispatch overhead: a chain of tiny ops (a 1-element scale: no real work), so
   the time per node is the executor's and the pool's own cost.
2. Idle cost: one long single-thread stage marked `wait`: the CPU time the idle
   workers burn beside it, as a share of one core.
Both for each waiting policy, medians over repeats.
"""
import argparse
import contextlib
import json
import os
import statistics
import threading
import time

import numpy as np
import psutil

import ggml_py as gg
from ggml_py._core import MAX_SPIN_US
from ggml_py.cli.common import number, positive_int, thread_list

POLICIES = ("spin", "sleep", "spin-then-sleep")


def spin_budget(text):
    """--spin-us: a number of microseconds in 0 .. MAX_SPIN_US."""
    value = number(text)
    if not 0 <= value <= MAX_SPIN_US:
        raise argparse.ArgumentTypeError(f"must be in 0 .. {MAX_SPIN_US:g}, got {text!r}")
    return value


def add_arguments(parser):
    """The flags of `ggml-bench pool`."""
    parser.add_argument("-t", "--threads", type=thread_list, default="1,2,4",
                        help="comma-separated thread counts (default 1,2,4)")
    parser.add_argument("--nodes", type=positive_int, default=2000, help="nodes in the dispatch chain")
    parser.add_argument("--repeats", type=positive_int, default=15, help="timed computes per case")
    parser.add_argument("--spin-us", type=spin_budget, default=200.0,
                        help=f"spin budget of spin-then-sleep, µs (0 .. {MAX_SPIN_US:g})")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def tiny_chain(n_nodes):
    """n_nodes scale ops on one element, one after another."""
    ctx = gg.Context(mem_size=(n_nodes + 8) * 1024)
    x = ctx.from_numpy(np.ones(1, np.float32))
    for _ in range(n_nodes):
        x = gg.scale(x, 1.0)
    return gg.build_forward(x)


def long_wait_stage():
    """One mul_mat whose COMPUTE runs on the main thread only, workers told to wait."""
    rng = np.random.default_rng(0)
    ctx = gg.Context(mem_size=40 << 20)
    a = ctx.from_numpy(rng.standard_normal((2048, 2048)).astype(np.float32))
    b = ctx.from_numpy(rng.standard_normal((16, 2048)).astype(np.float32))
    graph = gg.build_forward(gg.mul_mat(a, b))
    node = graph.nodes[0]
    node.profile = node.profile.with_stage("compute", parallel=False, wait=True)
    return graph


def thread_cpu_seconds(exclude_id):
    """CPU seconds of every thread of this process but one: from the scheduler's
    nanosecond counters (/proc/self/task/*/schedstat) where Linux keeps them, else
    psutil's, which tick every 10 ms (2 % of a core over MIN_SECONDS)."""
    total, read = 0, False
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            if int(tid) == exclude_id:
                continue
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
                read = True
            except (OSError, ValueError, IndexError):   # a thread that has ended, or no counters
                continue
    if read:
        return total / 1e9
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id != exclude_id)


MIN_SECONDS = 0.5   # process CPU times tick every 10 ms: measure long enough to make that small


def measure_dispatch(graph, pool, repeats):
    """(median µs per node, cores used by the whole process while dispatching)."""
    graph.compute(pool=pool)
    proc = psutil.Process()
    walls = []
    c0, t0 = sum(proc.cpu_times()[:2]), time.perf_counter()
    while len(walls) < repeats or time.perf_counter() - t0 < MIN_SECONDS:
        start = time.perf_counter()
        graph.compute(pool=pool)
        walls.append(time.perf_counter() - start)
    cores = (sum(proc.cpu_times()[:2]) - c0) / (time.perf_counter() - t0)
    return 1e6 * statistics.median(walls) / len(graph.nodes), cores


def measure_idle_cost(graph, pool):
    """Share of a core the workers use while the main thread runs a wait stage."""
    graph.compute(pool=pool)
    me = threading.get_native_id()
    c0, t0 = thread_cpu_seconds(me), time.perf_counter()
    while time.perf_counter() - t0 < MIN_SECONDS:
        graph.compute(pool=pool)
    return (thread_cpu_seconds(me) - c0) / (time.perf_counter() - t0)


def run(args):
    """Measure dispatch and idle cost for every thread count and waiting policy; print a
    table (or JSON). Returns 0."""
    threads = args.threads
    chain, wait_graph = tiny_chain(args.nodes), long_wait_stage()
    rows = []
    for n in threads:
        for policy in POLICIES:
            with gg.ThreadPool(n, policy=policy, spin_us=args.spin_us) as pool:
                us_per_node, cores = measure_dispatch(chain, pool, args.repeats)
                idle = measure_idle_cost(wait_graph, pool) if n > 1 else 0.0
            rows.append({"threads": n, "policy": policy, "us_per_node": us_per_node,
                         "cores_while_dispatching": cores, "idle_worker_core_share": idle})
    if args.json:
        print(json.dumps({"system_info": gg.system_info(), "nodes": args.nodes,
                          "repeats": args.repeats, "spin_us": args.spin_us, "rows": rows},
                         indent=1))
        return 0
    print(gg.system_info())
    print(f"dispatch: chain of {args.nodes} one-element ops, median of >= {args.repeats} computes "
          f"over >= {MIN_SECONDS} s; idle: workers' CPU during a single-thread wait stage")
    print(f"{'threads':>7} {'policy':<16} {'us/node':>8} {'cores used':>10} {'idle cost':>10}")
    for r in rows:
        print(f"{r['threads']:>7} {r['policy']:<16} {r['us_per_node']:>8.2f} "
              f"{r['cores_while_dispatching']:>10.2f} {100 * r['idle_worker_core_share']:>9.1f}%")
    return 0
