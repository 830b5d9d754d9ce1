"""ggml-bench model: llama-bench-style prompt processing (pp) and generation (tg) speed.

For each thread count and test, one warm-up run, then -r timed repetitions from
an empty cache, or (-d D) from a cache holding D tokens already (llama-bench's depth:
"tg128 @ d1536"): ppN evaluates N random tokens in batches of -b; tgN generates N
tokens one at a time (greedy on fixed ids, so sampling costs nothing).
Reported: tokens per second, mean ± standard deviation over the repetitions.
"""
import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time

import numpy as np

from ggml_py.cli.bench.mulmat import read_bandwidth

import ggml_py as gg
from ggml_py.model.bundled import default_model_path
from ggml_py.cli.common import (add_kv_arguments, add_repack_argument, add_tp_log_argument,
                                count_list, file_name, kv_options, open_llama,
                                positive_int, thread_list)
from ggml_py.cli.common import run as run_reporting_errors

PROG = "ggml-bench model"


def add_arguments(parser):
    """The flags of `ggml-bench model` (llama-bench's names)."""
    parser.add_argument("-m", "--model", type=file_name, default=None, metavar="FNAME",
                        help="GGUF model file (default: the bundled Shakespeare model)")
    parser.add_argument("-p", "--n-prompt", type=count_list, default=[512],
                        help="prompt sizes, comma-separated (default 512)")
    parser.add_argument("-n", "--n-gen", type=count_list, default=[128],
                        help="generated tokens, comma-separated (default 128)")
    parser.add_argument("-t", "--threads", type=thread_list, default=None,
                        help="thread counts, comma-separated (default: physical cores)")
    parser.add_argument("-b", "--batch-size", type=positive_int, default=512,
                        help="batch size (default 512)")
    parser.add_argument("-r", "--repetitions", type=positive_int, default=5,
                        help="timed runs per test (default 5)")
    parser.add_argument("-d", "--n-depth", type=count_list, default=[0],
                        help="tokens in the cache before each test, comma-separated (default 0)")
    add_kv_arguments(parser)
    parser.add_argument("--busy", type=busy_count, default=0, metavar="N",
                        help="also run every test with N other processes spinning on the CPU "
                             "(a machine in use), and report both")
    add_repack_argument(parser)
    parser.add_argument("--tp", action="store_true",
                        help="under mpiexec -n N: split the model over the N processes (tensor "
                             "parallel); -t is then each process's threads")
    add_tp_log_argument(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


MAX_BUSY = 64     # spinning processes --busy starts, at most


def busy_count(text):
    """--busy N: 0 (none, the default) .. MAX_BUSY other processes."""
    n = int(text)
    if not 0 <= n <= MAX_BUSY:
        raise argparse.ArgumentTypeError(f"must be in 0..{MAX_BUSY}, got {n}")
    return n


def size_label(n_params):
    """A parameter count as llama-bench shows it: 1.1B, 15M, 260K (trailing zeros dropped)."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n_params >= scale:
            return f"{n_params / scale:.1f}".rstrip("0").rstrip(".") + unit
    return str(n_params)


def rewind(llm, depth, rng):
    """Leave the first `depth` tokens of the depth prompt in the cache: evaluated once
    (untimed), then kept while later runs write past them (their rows are cut off)."""
    held = getattr(llm, "_bench_depth", 0)
    if depth == 0 or held < depth:
        llm.reset()
        llm._bench_depth = 0
        if depth:
            llm._decode(np.random.default_rng(1).integers(0, llm.n_vocab(), depth).tolist())
            llm._bench_depth = depth
    else:
        # the sequence cut back to its first `depth` tokens, as generate cuts a cached prompt
        llm.tokens = llm.tokens[:depth]
        llm.model.cache.truncate(depth)


def time_prompt(llm, n_prompt, rng, depth=0):
    """Seconds to evaluate n_prompt random tokens after `depth` tokens in the cache."""
    ids = rng.integers(0, llm.n_vocab(), n_prompt).tolist()
    rewind(llm, depth, rng)
    t0 = time.perf_counter()
    llm._decode(ids)
    return time.perf_counter() - t0


def time_generation(llm, n_gen, rng, depth=0):
    """Seconds to generate n_gen tokens one by one after `depth` tokens in the cache."""
    token = llm.token_bos() if llm.token_bos() is not None else 0
    rewind(llm, depth, rng)
    t0 = time.perf_counter()
    for _ in range(n_gen):
        logits = llm._decode([token])
        token = int(np.argmax(logits))
    return time.perf_counter() - t0


def run_test(llm, kind, n, repetitions, depth=0):
    """Tokens per second of each of `repetitions` timed runs of ppN or tgN (kind "pp" or "tg"),
    after one untimed warm-up run, each after `depth` tokens in the cache."""
    rng = np.random.default_rng(0)
    timer = time_prompt if kind == "pp" else time_generation
    # warm-up: one whole run, which builds every graph the timed runs use (a tgN past
    # 256 tokens needs a graph per 256-slot window; llama-bench's one-token tg warm-up
    # would leave those to the first timed run)
    timer(llm, n, rng, depth)
    samples = [n / timer(llm, n, rng, depth) for _ in range(repetitions)]
    return samples


def run(args):
    """Run the benchmark; a bad flag value, model file or context size, or output that
    cannot be written, ends in one line and exit status 1."""
    return run_reporting_errors(PROG, bench_model, args)


def bench_model(args):
    """Time every test at every thread count; print the table (or JSON). Returns 0."""
    n_prompts, n_gens = args.n_prompt, args.n_gen
    if not any(n > 0 for n in n_prompts + n_gens):
        raise ValueError("-p and -n are all 0: no test to run")
    threads = args.threads or [gg.default_threads()]
    n_ctx = max([n for n in n_prompts + n_gens] + [1]) + max(args.n_depth)
    args.model = args.model or default_model_path()
    # timed past the training context without a word, as llama-bench does
    llm, _ = open_llama(args.model, n_ctx=n_ctx, n_threads=threads[0], n_batch=args.batch_size,
                        **kv_options(args), repack=args.repack, tp=args.tp, tp_log=args.tp_log)
    f = llm.model.file
    model_name = f"llama {size_label(f.n_params)} {f.file_type_name()}"
    tests = [("pp", n, d) for d in args.n_depth for n in n_prompts if n > 0] + \
        [("tg", n, d) for d in args.n_depth for n in n_gens if n > 0]
    columns = COLUMNS + ((("busy", 4, ">"),) if args.busy else ())
    rows = []
    for busy in sorted({0, args.busy}):
        with spinning_processes(busy):
            for n_threads in threads:
                llm.model.n_threads = n_threads
                for kind, n, depth in tests:
                    samples = run_test(llm, kind, n, args.repetitions, depth)
                    rows.append({
                        "model_filename": args.model, "model_type": model_name,
                        "model_size": f.weights_nbytes, "model_n_params": f.n_params,
                        "type": f.file_type_name(), "n_threads": n_threads,
                        "n_ranks": llm.n_ranks,
                        "n_batch": args.batch_size, "type_k": args.cache_type_k,
                        "type_v": args.cache_type_v or args.cache_type_k,
                        "attention": args.attention, "n_depth": depth,
                        "n_prompt": n if kind == "pp" else 0, "n_gen": n if kind == "tg" else 0,
                        "test": f"{kind}{n}" + (f" @ d{depth}" if depth else ""), "busy": busy,
                        "avg_ts": statistics.fmean(samples),
                        "stddev_ts": statistics.stdev(samples) if len(samples) > 1 else 0.0,
                        "samples_ts": samples,
                    })
                    if not args.json:
                        if len(rows) == 1:
                            print_header(columns)
                        print_row(rows[-1], columns)
    # one read bandwidth per thread count: a roofline measured on one thread would
    # put two threads over 100 %
    per_token = bytes_per_token(f)
    # (a split model's ranks each read their share: one process's roofline does not apply)
    bandwidth = {nt: read_bandwidth(512, threads=nt) for nt in sorted({r["n_threads"] for r in rows
                                                                       if r["n_gen"]})
                 if llm.n_ranks == 1}
    for r in rows:
        if r["n_gen"] and bandwidth:
            r["read_bandwidth"] = bandwidth[r["n_threads"]]
            r["roofline_ts"] = r["read_bandwidth"] / per_token
            r["roofline_fraction"] = r["avg_ts"] / r["roofline_ts"]
    if args.json:
        print(json.dumps({"system_info": gg.system_info(),
                          "read_bandwidth": {str(nt): bw for nt, bw in bandwidth.items()},
                          "weight_bytes_per_token": per_token, "results": rows}, indent=1))
    elif bandwidth:
        print(f"\ndecode roofline: {per_token / 2**20:.1f} MiB of weights per token / the read "
              f"bandwidth measured now on as many threads")
        for r in rows:
            if r["n_gen"]:
                load = f" with {r['busy']} busy" if r["busy"] else ""
                print(f"  {r['test']} at {r['n_threads']} threads{load}: "
                      f"{100 * r['roofline_fraction']:.0f} % of the roofline "
                      f"({r['read_bandwidth'] / 1e9:.1f} GB/s = {r['roofline_ts']:.2f} t/s)")
    if not args.json:
        print(f"\n{gg.system_info()}")
    return 0


# a process that keeps one CPU busy; it ends by itself once its parent (this bench) is gone,
# however the bench ends, and after an hour at the most
SPINNER = ("import os, time\n"
           "parent, end = os.getppid(), time.monotonic() + 3600\n"
           "while os.getppid() == parent and time.monotonic() < end:\n"
           "    for _ in range(200_000):\n"
           "        pass\n")


@contextlib.contextmanager
def spinning_processes(n):
    """Within the block, n other processes spin on the CPU (none for n = 0)."""
    procs = [subprocess.Popen([sys.executable, "-c", SPINNER], stdin=subprocess.DEVNULL)
             for _ in range(n)]
    try:
        if procs:
            time.sleep(0.2)     # running before the first timed test
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def bytes_per_token(f):
    """Weight bytes one decoded token reads: every matrix, plus one embedding row."""
    total = 0
    tied = not f.has_tensor("output.weight")
    for t in f.reader.tensors:
        if t.name == "token_embd.weight" and not tied:
            total += t.nbytes // t.shape[-2]        # one of its rows
        elif len(t.shape) >= 2:
            total += t.nbytes
    return total


COLUMNS = (("model", 30, "<"), ("size", 10, ">"), ("params", 10, ">"), ("type", 6, "<"),
           ("threads", 7, ">"), ("test", 16, ">"), ("t/s", 20, ">"))


def print_header(columns=COLUMNS):
    """Print the Markdown table header of `columns`, numbers right-aligned (as llama-bench)."""
    print("| " + " | ".join(f"{name:{align}{width}}" for name, width, align in columns) + " |")
    print("| " + " | ".join(("-" * (width - 1) + ":") if align == ">" else "-" * width
                            for name, width, align in columns) + " |")


def print_row(r, columns=COLUMNS):
    """Print one result row of the table: size in GiB or MiB, t/s as mean ± standard deviation
    (and the busy processes, where `columns` has them)."""
    size = r["model_size"]
    size_text = f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.2f} MiB"
    ranks = r.get("n_ranks", 1)
    threads = f"{ranks}x{r['n_threads']}" if ranks > 1 else str(r["n_threads"])
    cells = (r["model_type"], size_text, size_label(r["model_n_params"]), r["type"],
             threads, r["test"], f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}",
             str(r["busy"]))
    print("| " + " | ".join(f"{c:{align}{width}}" for c, (name, width, align) in zip(cells, columns))
          + " |", flush=True)
