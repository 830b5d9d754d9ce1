"""ggml-bench batch: many sequences per step - aggregate decode speed against batch size.

For each B in -np: B prompts of 16 tokens (consecutive windows of the held-out text),
read in one step, then -n tokens generated for every sequence (greedy, end-of-text
ignored), once to build the graphs and then --rounds times, the sizes taken in turns
(1, 16, 1, 16, ...: a slow spell of the machine falls on every size alike), keeping each
size's fastest decode. Reported per B: prompt tokens/s, aggregate decode tokens/s (all
sequences), its ratio to B = 1 measured in the same run, each sequence's time per token,
graph-building time per step, and the KV pages the sequences held at most.

--prefix N puts the same N tokens of the held-out text before every prompt (a system
prompt): with prefix sharing (the default; --no-share-prefix turns it off) the timed run
finds them in the pages the first run left named, and "shared" counts the prompt
tokens it did not compute.
"""
import argparse
import json
import time

import ggml_py as gg
from ggml_py.cli.common import (
    add_kv_arguments,
    file_name,
    int_list,
    kv_options,
    open_llama,
    positive_int,
)
from ggml_py.cli.common import run as run_reporting_errors
from ggml_py.model.bundled import default_model_path, default_text_path

PROG = "ggml-bench batch"
PROMPT_TOKENS = 16
# graphs kept: every size's (the sizes are timed in turns, and graphs of one size dropped
# for the others' would be built again inside its timed run); each holds ~32 KB a layer
KEPT_GRAPHS = 512


def sequence_counts(text):
    """-np: comma-separated counts of sequences, each 1 or more."""
    return int_list(text, low=1, what="counts of sequences")


def decoded_count(text):
    """-n: at least 2 tokens a sequence (one decode step to time)."""
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be at least 2 (the first token comes with the "
                                         f"prompt, the decode starts at the second), got {value}")
    return value


def add_arguments(parser):
    """The flags of `ggml-bench batch`."""
    parser.add_argument("-m", "--model", type=file_name, default=None, metavar="FNAME",
                        help="GGUF model file (default: the bundled Shakespeare model)")
    parser.add_argument("-np", "--parallel", type=sequence_counts, default=[1, 2, 4, 8, 16, 32, 64],
                        help="sequences per batch, comma-separated (default 1,2,4,8,16,32,64)")
    parser.add_argument("-n", "--n-gen", type=decoded_count, default=128,
                        help="tokens generated per sequence, 2 or more: the first comes with "
                             "the prompt, the others are decode (default 128)")
    parser.add_argument("-t", "--threads", type=positive_int, default=None,
                        help="threads (default: physical cores)")
    parser.add_argument("--rounds", type=positive_int, default=1,
                        help="timed runs of each B, the sizes in turns; the fastest decode "
                             "of each is kept (default 1)")
    parser.add_argument("--prefix", type=int, default=0, metavar="N",
                        help="the same N tokens before every prompt (default 0)")
    parser.add_argument("--no-share-prefix", dest="share_prefix", action="store_false",
                        help="compute and hold every prompt's tokens itself")
    add_kv_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--plot", default=None, metavar="PNG",
                        help="draw aggregate decode tokens/s against B into this PNG "
                             "(needs matplotlib: pip install 'ggml_py[plot]')")


def run(args):
    """Run the benchmark; a bad value, model or output ends in one line and status 1."""
    return run_reporting_errors(PROG, bench_batch, args)


def prompts(llm, n, prefix=0):
    """n prompts of PROMPT_TOKENS ids each (BOS, then consecutive windows of the held-out
    text), each after the same `prefix` ids (the text after the windows)."""
    step = PROMPT_TOKENS - 1
    with open(default_text_path(), encoding="utf-8") as f:
        ids = llm.tokenize(f.read((n * step + prefix) * 8 + 1024), add_bos=False)   # enough
    if len(ids) < n * step + prefix:
        raise ValueError(f"the held-out text has {len(ids)} tokens, too few for {n} prompts")
    bos = [llm.token_bos()] if llm.token_bos() is not None else []
    head = ids[n * step:n * step + prefix]
    return [bos + head + ids[i * step:(i + 1) * step] for i in range(n)]


def time_batch(llm, n_seq, n_gen, prefix=0, share_prefix=True):
    """One run of n_seq sequences: a dict of its timings."""
    b = llm.batch(share_prefix=share_prefix)
    for p in prompts(llm, n_seq, prefix):
        b.add(p, max_tokens=n_gen, temperature=0, ignore_eos=True)
    model = llm.model
    build0, t0 = model.build_s, time.perf_counter()
    b.step()                                    # every prompt (n_batch permitting)
    while b.waiting or any(len(s.ids) - s.n_cached > 1 for s in b._running):
        b.step()
    t1 = time.perf_counter()
    steps0, pages = b.n_steps, llm.kv_pages_used()
    while b.running:
        b.step()
        pages = max(pages, llm.kv_pages_used())
    t2 = time.perf_counter()
    decode_steps = b.n_steps - steps0
    return {"prefill_s": t1 - t0, "decode_s": t2 - t1, "decode_steps": decode_steps,
            "build_s": model.build_s - build0, "steps": b.n_steps, "max_pages": pages,
            "shared_tokens": b.n_shared_tokens}


def bench_batch(args):
    """Time each B, print the table (or JSON) and the plot. Returns 0."""
    if args.plot is not None:
        from ggml_py.cli.tune import plot_path
        args.plot = plot_path(args.plot)     # checked before the work
    if args.prefix < 0:
        raise ValueError(f"--prefix: expected a count >= 0, got {args.prefix}")
    sizes = sorted(set(args.parallel) | {1})
    n_ctx = max(sizes) * (PROMPT_TOKENS + args.prefix + args.n_gen + 16)
    model = args.model or default_model_path()
    llm, _ = open_llama(model, n_ctx=n_ctx, n_threads=args.threads, n_seq_max=max(sizes),
                        **kv_options(args))
    llm.model.max_graphs = max(llm.model.max_graphs, KEPT_GRAPHS)
    run = {"prefix": args.prefix, "share_prefix": args.share_prefix}
    # builds the graphs the timed runs use, the largest B first: its graphs size the shared
    # buffer of intermediates, which a larger graph built after the others would grow,
    # dropping them to be built again inside the timed runs
    for n_seq in sorted(sizes, reverse=True):
        time_batch(llm, n_seq, args.n_gen, **run)
    timed = {n_seq: [] for n_seq in sizes}
    for _ in range(args.rounds):
        for n_seq in sizes:
            timed[n_seq].append(time_batch(llm, n_seq, args.n_gen, **run))
    rows = []
    for n_seq in sizes:
        r = min(timed[n_seq], key=lambda t: t["decode_s"])
        r.update(n_seq=n_seq, n_gen=args.n_gen, n_threads=llm.n_threads(), rounds=args.rounds, **run,
                 prefill_ts=n_seq * (PROMPT_TOKENS + args.prefix) / r["prefill_s"],
                 # (the first token of each comes with its prompt: n_gen - 1 decoded)
                 decode_ts=n_seq * (args.n_gen - 1) / r["decode_s"],
                 ms_per_token=1e3 * r["decode_s"] / (args.n_gen - 1),
                 build_ms_per_step=1e3 * r["build_s"] / r["steps"],
                 kv_bytes=r["max_pages"] * llm.kv_pool().page_size * kv_bytes_per_token(llm))
        rows.append(r)
    single = rows[0]["decode_ts"]
    for r in rows:
        r["vs_single"] = r["decode_ts"] / single
    rows = [r for r in rows if r["n_seq"] in args.parallel]
    if args.json:
        print(json.dumps({"system_info": gg.system_info(), "model": model, "results": rows},
                         indent=1))
    else:
        print_table(rows, model, llm, args)
    if args.plot is not None:
        plot(rows, args.plot, model)
    return 0


def kv_bytes_per_token(llm):
    """Bytes of K and V one token holds over all layers."""
    pool = llm.kv_pool()
    return pool.nbytes // pool.n_slots


def print_table(rows, model, llm, args):
    """The Markdown table of the results."""
    head = (f", after the same {args.prefix} (prefix sharing {'on' if args.share_prefix else 'off'})"
            if args.prefix else "")
    rounds = f", fastest of {args.rounds} rounds in turns" if args.rounds > 1 else ""
    print(f"model {model}, {llm.n_threads()} threads, prompts of {PROMPT_TOKENS} tokens{head}, "
          f"greedy{rounds}\n")
    print("|   B | prompt t/s | shared | decode t/s (all) | x B=1 | ms/token/seq | build ms/step | KV MiB |")
    print("|----:|-----------:|-------:|-----------------:|------:|-------------:|--------------:|-------:|")
    for r in rows:
        print(f"| {r['n_seq']:>3} | {r['prefill_ts']:>10.1f} | {r['shared_tokens']:>6} | "
              f"{r['decode_ts']:>16.1f} | {r['vs_single']:>5.2f} | {r['ms_per_token']:>12.2f} | "
              f"{r['build_ms_per_step']:>13.2f} | {r['kv_bytes'] / 2**20:>6.1f} |", flush=True)
    print(f"\n{gg.system_info()}")


def plot(rows, path, model):
    """Aggregate decode tokens/s against B, drawn into path (its extension: the format)."""
    import os

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ggml_py.files.output import atomic_output
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["n_seq"] for r in rows], [r["decode_ts"] for r in rows], "o-")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequences per step (B)")
    ax.set_ylabel("aggregate decode tokens/s")
    ax.set_title(f"ggml-bench batch: {model.rsplit('/', 1)[-1]}")
    ax.grid(True, alpha=0.3)
    with atomic_output(path) as written:
        fig.savefig(written, format=os.path.splitext(path)[1][1:].lower(), dpi=120,
                    bbox_inches="tight")
    plt.close(fig)
