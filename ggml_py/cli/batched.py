"""ggml-batched: many sequences generated together, with llama.cpp's `llama-batched` /
`llama-parallel` conventions.

    ggml-batched -p "ROMEO." -np 4 -n 64          # one prompt, 4 sequences (seeds s, s+1, ...)
    ggml-batched -f prompts.txt -np 8 -n 128      # one prompt per line, 8 at a time

Each sequence's text streams to stdout line by line, each line led by its id ("[2] ...");
per-sequence and aggregate timings go to stderr at the end.
"""
import random
import sys
import time

import ggml_py as gg
from ggml_py.cli.common import (ArgumentParser, add_model_arguments, console_script, file_name,
                                kv_options, number, open_llama, positive_int, process_escapes, run,
                                seed_value)
from ggml_py.model.bundled import default_model_path
from ggml_py.model.context_shift import MIN_SHIFT_CONTEXT

PROG = "ggml-batched"


def build_parser():
    """The flags of ggml-batched."""
    p = ArgumentParser(prog=PROG, description="Generate many sequences at once (one forward "
                                              "step for all of them).")
    add_model_arguments(p, ctx_default=4096)
    p.add_argument("-p", "--prompt", default=None, help="the prompt of every sequence")
    p.add_argument("-f", "--file", type=file_name, metavar="FNAME",
                   help="prompts, one per line (empty lines skipped)")
    p.add_argument("-np", "--parallel", type=positive_int, default=4, metavar="N",
                   help="sequences run at once (default: 4); with -p, also how many sequences")
    p.add_argument("-n", "--n-predict", type=int, default=64, metavar="N",
                   help="tokens to generate per sequence (default: 64; -1: until end of text, "
                        "a full context shifting; -2: until the context is full; with either, "
                        "each sequence's context is n_ctx / -np)")
    p.add_argument("-s", "--seed", type=seed_value, default=-1,
                   help="RNG seed of the first sequence; sequence i gets seed + i "
                        "(default: -1, random)")
    p.add_argument("--temp", type=number, default=0.8, help="temperature (default: 0.8; <= 0: greedy)")
    p.add_argument("--top-k", type=int, default=40, help="top-k sampling (default: 40, 0 = off)")
    p.add_argument("--top-p", type=number, default=0.95, help="top-p sampling (default: 0.95)")
    p.add_argument("--min-p", type=number, default=0.05, help="min-p sampling (default: 0.05)")
    return p


def log(*args):
    """Print to stderr, flushed at once (stdout carries only the text)."""
    print(*args, file=sys.stderr, flush=True)


def read_prompts(args):
    """The prompts: -f's lines, or -p's prompt -np times."""
    if args.file is not None:
        with open(args.file, "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{args.file}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        # universal newlines, as a text file's lines
        prompts = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        prompts = [p for p in prompts if p.strip()]
        if not prompts:
            raise ValueError(f"{args.file}: no prompts (one per line)")
        return prompts
    prompt = process_escapes(args.prompt) if args.escape else args.prompt
    return [prompt] * args.parallel


def sequence_context(llm, args):
    """llm.batch's arguments for -n: a sequence may hold the whole context; with -n -1 or
    -2 (no end but the text's or the context's) each holds n_ctx / -np, as llama.cpp's
    server slots do (in whole pages: all of them fit the pool at once), so that no running
    sequence waits for pages another that never ends holds."""
    if args.n_predict >= 0:
        return {}
    pool = llm.kv_pool()
    n_ctx_seq = min(llm.n_ctx() // args.parallel,
                    pool.n_pages // args.parallel * pool.page_size + 1)
    if n_ctx_seq < MIN_SHIFT_CONTEXT:
        raise ValueError(f"-n {args.n_predict}: a sequence's context would be n_ctx / -np = "
                         f"{llm.n_ctx()} / {args.parallel}, too small ({MIN_SHIFT_CONTEXT} "
                         f"tokens at least)")
    return dict(n_ctx_seq=n_ctx_seq, context_shift=args.n_predict == -1)


class LineStreams:
    """Each sequence's text, printed a whole line at a time with its id in front."""

    def __init__(self, out):
        self.out, self.partial = out, {}

    def write(self, sid, text):
        lines = (self.partial.pop(sid, "") + text).split("\n")
        for line in lines[:-1]:
            self.out.write(f"[{sid}] {line}\n")
        if lines[-1]:
            self.partial[sid] = lines[-1]
        self.out.flush()

    def end(self, sid):
        rest = self.partial.pop(sid, None)
        if rest is not None:
            self.out.write(f"[{sid}] {rest}\n")
            self.out.flush()


def main(argv=None):
    """Load the model, run every prompt, stream the texts. Returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.prompt is None) == (args.file is None):
        parser.error("give a prompt (-p) or a file of prompts (-f), one of the two")
    if args.n_predict < -2:
        parser.error(f"-n {args.n_predict}: give a count, -1 (until end of text) or -2 "
                     f"(until the context is full)")
    args.model = args.model or default_model_path()
    prompts = read_prompts(args)
    seed = args.seed if args.seed >= 0 else random.SystemRandom().randrange(2**31)
    llm, warnings = open_llama(args.model, args.ctx_size, args.ctx_default, n_threads=args.threads,
                               n_batch=args.batch_size, **kv_options(args),
                               use_mmap=args.use_mmap, repack=args.repack, tp=args.tp,
                               tp_log=args.tp_log, n_seq_max=args.parallel)
    if args.attention == "graph":   # (the three nodes read one sequence's window)
        warnings.append("--attention graph: batches run the attention op, auto profile")
    for message in warnings:
        log(f"batched: warning: {message}")
    b = llm.batch(**sequence_context(llm, args))
    log(f"batched: {len(prompts)} sequences, {args.parallel} at once, n_ctx = {llm.n_ctx()} "
        f"(pages of {llm.kv_pool().page_size} tokens, {b.n_ctx_seq} a sequence), "
        f"n_predict = {args.n_predict}, seed = {seed} | {gg.system_info()}")
    sids = [b.add(p, max_tokens=args.n_predict, temperature=args.temp, top_k=args.top_k,
                  top_p=args.top_p, min_p=args.min_p, seed=seed + i) for i, p in enumerate(prompts)]
    streams = LineStreams(sys.stdout)
    started, ended = {}, {}
    t0 = time.perf_counter()
    status = 0
    try:
        while b.running:
            events = b.step()
            now = time.perf_counter()
            for sid, piece in events:
                started.setdefault(sid, now)
                streams.write(sid, piece)
                if b.sequence(sid).done:
                    streams.end(sid)
                    ended[sid] = now
    except KeyboardInterrupt:
        b.close()
        log("batched: interrupted")
        status = 130
    for sid in sids:
        streams.end(sid)
    total = time.perf_counter() - t0
    log("")
    n_gen = 0
    for sid in sids:
        s = b.sequence(sid)
        n_gen += len(s.tokens)
        span = ended.get(sid, t0 + total) - started.get(sid, t0)
        rate = f"{len(s.tokens) / span:8.2f} t/s" if span > 0 and s.tokens else "       -"
        log(f"seq {sid:3d}: prompt {len(s.prompt_tokens):5d} tokens, generated "
            f"{len(s.tokens):5d} ({s.finish_reason or 'running'}), {rate} after its first token")
    n_prompt = sum(len(b.sequence(sid).prompt_tokens) for sid in sids)
    log(f"\nbatched: {n_prompt} prompt + {n_gen} generated tokens in {total:.2f} s, "
        f"{n_gen / total if total > 0 else 0:.2f} generated tokens/s in all, "
        f"{b.n_steps} steps (graph building {1e3 * llm.model.build_s:.0f} ms)")
    return status


@console_script
def cli(argv=None):
    """Entry point of the ggml-batched console script."""
    return run(PROG, main, argv)


if __name__ == "__main__":
    sys.exit(cli())
