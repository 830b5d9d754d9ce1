"""ggml_py against llama.cpp (through llama-cpp-python) on the same GGUF files.

    python benchmarks/compare_llama_cpp.py -m model.gguf [-f text.txt] [-c 256] [-t 2]
    python benchmarks/compare_llama_cpp.py -m q4_0.gguf q4_k_m.gguf -p 512 -n 128 --busy 1 \\
        --peer-python /path/to/venv/bin/python

llama.cpp runs in a process of its own (benchmarks/llama_cpp_peer.py, started with
--peer-python: the Python of an environment with llama-cpp-python; this one's by
default), ggml_py in this one, from wherever this Python imports it. For each file:
that llama.cpp loads it (ours, e.g. from ggml-quantize), the largest logit
difference on a prompt, the perplexity of a text (-f) by llama.cpp's method
computed from each runtime's logits, and prompt (ppN: N tokens from an empty
cache) and generation (tgN: N single-token decodes) speed of both, the two taking
turns run after run, each computing only the last token's logits as llama-bench
does, both on -t threads. Printed per test: the best and the median t/s of each
over --repeat turns, and the ratio ggml_py / llama.cpp of the medians and of the
same turn's pair (median over turns). --busy N runs the speed tests again with N
other processes spinning on the CPU. --tune-file schedules ggml_py's MUL_MAT
profiles with ggml-tune data (its built-in rule otherwise). Never part of the tests.
"""
import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import ggml_py as gg
from ggml_py.cli.bench.model import spinning_processes
from ggml_py.cli.common import (ArgumentParser, file_name, open_llama, positive_int,
                                read_prompt_file, run, thread_count)
from ggml_py.model.perplexity import perplexity

PROMPT = "ROMEO. But soft, what light through yonder window breaks? It is the east, and Juliet is the sun."
PEER = Path(__file__).with_name("llama_cpp_peer.py")


class Peer:
    """llama.cpp in its own process (llama_cpp_peer.py), one request at a time."""

    def __init__(self, python):
        self.proc = subprocess.Popen([python, str(PEER)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def ask(self, cmd, **request):
        self.proc.stdin.write(json.dumps({"cmd": cmd, **request}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:     # (errors end the script in one line: run() reports a ValueError)
            raise ValueError(f"the llama.cpp process ended (exit status {self.proc.wait()})")
        answer = json.loads(line)
        if "error" in answer:
            raise ValueError(f"llama.cpp: {answer['error']}")
        return answer

    def logits(self, tokens):
        answer = self.ask("logits", tokens=tokens)
        return np.frombuffer(base64.b64decode(answer["logits"]), np.float32).reshape(answer["shape"])

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait()


def time_in_turns(case_a, case_b, repeat):
    """Seconds of each of `repeat` turns of two cases, after one warm-up each; a case
    is a function that runs the test and returns the seconds of its timed part."""
    case_a(), case_b()
    runs = ([], [])
    for _ in range(repeat):
        for case, out in zip((case_a, case_b), runs):
            out.append(case())
    return runs


def at_least(low):
    """A flag type: an integer >= low."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:      # (argparse would name this function in its message)
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    return parse


def check_logits(ours, peer, text, args):
    """Tokens, logits and (with -f) perplexity of both runtimes on one file."""
    ids = ours.tokenize(PROMPT, add_bos=True)
    same = ids == peer.ask("tokenize", text=PROMPT, add_bos=True)["tokens"]
    got = ours.eval(ids).copy()
    ref = peer.logits(ids)
    print(f"tokens identical: {same}; logits: max |ggml_py - llama.cpp| = {np.abs(got - ref).max():.4g} "
          f"(max |logit| {np.abs(ref).max():.3g}); greedy next tokens agree on "
          f"{100 * (got.argmax(1) == ref.argmax(1)).mean():.0f} % of positions")
    if text is not None:
        tokens = ours.tokenize(text, add_bos=True)[: args.chunks * args.ctx_size + 1]
        tokens = tokens[: max(2, len(tokens) // args.ctx_size) * args.ctx_size]
        ppl_ours = perplexity(ours, tokens, n_ctx=args.ctx_size).ppl
        ppl_lc = peer.ask("perplexity", tokens=tokens, n_ctx=args.ctx_size,
                          add_bos=bool(ours.tokenizer.add_bos), bos=ours.token_bos())["ppl"]
        print(f"perplexity (c={args.ctx_size}, {len(tokens) // args.ctx_size} chunks): ggml_py {ppl_ours:.4f}, "
              f"llama.cpp {ppl_lc:.4f}, ratio {ppl_ours / ppl_lc:.5f}")
    return ids


def speed_rows(ours, peer, ids, args, busy):
    """pp and tg of both runtimes in turns: one result dict per test."""
    prompt = (ids * (args.n_prompt // len(ids) + 1))[: args.n_prompt]
    n_gen = args.n_gen
    gen = [ids[(t + 1) % len(ids)] for t in range(n_gen)]

    def ours_pp():
        ours.reset()
        start = time.perf_counter()
        ours._decode(prompt)
        return time.perf_counter() - start

    def ours_tg():
        ours.reset()
        ours._decode(ids[:1])
        start = time.perf_counter()
        for t in gen:
            ours._decode([t])
        return time.perf_counter() - start

    rows = []
    tests = ((("pp", args.n_prompt), ours_pp, lambda: peer.ask("pp", tokens=prompt)["seconds"]),
             (("tg", n_gen), ours_tg, lambda: peer.ask("tg", first=ids[0], tokens=gen)["seconds"]))
    with spinning_processes(busy):
        for (kind, n), ours_case, peer_case in tests:
            if n == 0:
                continue
            a, b = time_in_turns(ours_case, peer_case, args.repeat)
            ts_a, ts_b = [n / s for s in a], [n / s for s in b]
            rows.append({"test": f"{kind}{n}", "busy": busy,
                         "ours_best": max(ts_a), "ours_median": statistics.median(ts_a),
                         "lc_best": max(ts_b), "lc_median": statistics.median(ts_b),
                         "ratio_median": statistics.median(ts_a) / statistics.median(ts_b),
                         "ratio_turns": statistics.median(x / y for x, y in zip(ts_a, ts_b)),
                         "ours_ts": ts_a, "lc_ts": ts_b})
    return rows


def main(argv=None):
    p = ArgumentParser(prog="compare_llama_cpp.py", description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", required=True, type=file_name, nargs="+")
    p.add_argument("-f", "--file", type=file_name, help="text for perplexity (none: skip it)")
    p.add_argument("-c", "--ctx-size", type=at_least(4), default=256)
    p.add_argument("--chunks", type=at_least(2), default=8,
                   help="perplexity chunks at most (llama.cpp's method needs 2 or more)")
    p.add_argument("-t", "--threads", type=thread_count, default=2)
    p.add_argument("-p", "--n-prompt", type=at_least(0), default=128, help="0: no pp test")
    p.add_argument("-n", "--n-gen", type=at_least(0), default=32, help="0: no tg test")
    p.add_argument("--repeat", type=positive_int, default=3)
    p.add_argument("--busy", type=at_least(0), default=0,
                   help="also time with this many other processes spinning on the CPU")
    p.add_argument("--peer-python", default=sys.executable,
                   help="the Python of an environment with llama-cpp-python (default: this one)")
    p.add_argument("--tune-file", type=file_name, help="ggml-tune data for ggml_py's MUL_MAT profiles")
    p.add_argument("--json", type=file_name, help="also write every turn's figures here")
    args = p.parse_args(argv)
    text = read_prompt_file(args.file) if args.file else None     # a missing file: now
    n_ctx = max(args.ctx_size, args.n_prompt + args.n_gen + 1)

    peer = Peer(args.peer_python)
    results = []
    try:
        try:
            info = peer.ask("info")
        except ValueError as e:
            raise ValueError(f"needs llama-cpp-python in {args.peer_python}'s environment "
                             f"(--peer-python; see the README's Benchmarks section): {e}") from None
        print(f"ggml_py {gg.__version__} ({os.path.dirname(gg.__file__)}): {gg.system_info()}")
        print(f"llama-cpp-python {info['version']} ({args.peer_python}): {info['system_info']}")
        print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for path in args.model:
            ours, _ = open_llama(path, n_ctx=n_ctx, n_threads=args.threads)  # quiet past n_ctx_train
            if args.tune_file:
                ours.set_tune(args.tune_file)
            peer.ask("load", path=path, n_ctx=n_ctx, n_threads=args.threads, logits_all=True)
            print(f"\nmodel: {path} ({ours.model.file.file_type_name()}); llama.cpp loads it: yes")
            ids = check_logits(ours, peer, text, args)
            # speed: an instance that keeps only the last logits, as llama-bench runs
            peer.ask("load", path=path, n_ctx=n_ctx, n_threads=args.threads, logits_all=False)
            print(f"{'test':<8} {'busy':>4} {'ggml_py t/s best, median':>25} "
                  f"{'llama.cpp t/s best, median':>28} {'ratio of medians':>17} {'per turn':>9}")
            for busy in sorted({0, args.busy}):
                for r in speed_rows(ours, peer, ids, args, busy):
                    r.update(model=path, type=ours.model.file.file_type_name(),
                             load=os.getloadavg()[0])
                    results.append(r)
                    print(f"{r['test']:<8} {busy:>4} {r['ours_best']:12.1f} {r['ours_median']:12.1f} "
                          f"{r['lc_best']:14.1f} {r['lc_median']:13.1f} {r['ratio_median']:17.2f} "
                          f"{r['ratio_turns']:9.2f}", flush=True)
            del ours
    finally:
        peer.close()
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(run("compare_llama_cpp.py", main))
