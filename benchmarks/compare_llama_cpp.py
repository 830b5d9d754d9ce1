"""ggml_py against llama.cpp (through llama-cpp-python) on the same GGUF file.

    pip install llama-cpp-python      # builds llama.cpp from source (see the README)
    python benchmarks/compare_llama_cpp.py -m model.gguf [-f text.txt] [-c 256] [-t 2]
    python benchmarks/compare_llama_cpp.py -m tinyllama.gguf -p 512 -n 128 --tune-file tune.json

Checks that llama.cpp loads the file (ours, e.g. from ggml-quantize), and
measures in the same run: the largest logit difference on a prompt, the
perplexity of a text (-f) by llama.cpp's method computed from each runtime's
logits, and prompt (pp) / generation (tg) speed of both, the two taking turns
run after run (median of --repeat), each computing only the last token's logits
of a prompt as llama-bench does. --tune-file schedules ggml_py's MUL_MAT
profiles with ggml-tune data (ggml's rule otherwise). Never part of the tests.
"""
import argparse
import statistics
import sys
import time

import numpy as np

import ggml_py as gg
from ggml_py.cli.common import (ArgumentParser, file_name, open_llama, positive_int,
                                read_prompt_file, run, thread_count)
from ggml_py.model.perplexity import perplexity, token_nll

PROMPT = "ROMEO. But soft, what light through yonder window breaks? It is the east, and Juliet is the sun."


def llama_cpp_model(path, n_ctx, n_threads, logits_all=True):
    """llama-cpp-python's Llama on `path`, n_threads for batches too (its default for
    those is every core, which is not what ggml_py gets)."""
    import llama_cpp
    return llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=n_threads,
                           n_threads_batch=n_threads, n_batch=n_ctx, logits_all=logits_all,
                           verbose=False)


def llama_cpp_perplexity(lc, tokens, n_ctx, add_bos, bos):
    """llama.cpp's perplexity method on llama-cpp-python's logits."""
    first = n_ctx // 2
    nll, count = 0.0, 0
    for i in range(len(tokens) // n_ctx):
        chunk = tokens[i * n_ctx:(i + 1) * n_ctx]
        if add_bos:
            chunk = [bos] + chunk[1:]
        lc.reset()
        lc.eval(chunk)
        logits = np.asarray(lc.scores[first:n_ctx - 1], np.float32)
        values = token_nll(logits, np.asarray(tokens[i * n_ctx + first + 1:(i + 1) * n_ctx]))
        nll += float(values.sum())
        count += len(values)
    return float(np.exp(nll / count))


def time_in_turns(case_a, case_b, repeat):
    """Median seconds of the timed part of two cases, run in turns after one warm-up
    each; a case is (setup, timed): setup() runs untimed before each timed()."""
    for setup, timed in (case_a, case_b):
        setup(), timed()
    runs = ([], [])
    for _ in range(repeat):
        for (setup, timed), out in zip((case_a, case_b), runs):
            setup()
            start = time.perf_counter()
            timed()
            out.append(time.perf_counter() - start)
    return statistics.median(runs[0]), statistics.median(runs[1])


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


def main(argv=None):
    p = ArgumentParser(prog="compare_llama_cpp.py", description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", required=True, type=file_name)
    p.add_argument("-f", "--file", type=file_name, help="text for perplexity (none: skip it)")
    p.add_argument("-c", "--ctx-size", type=at_least(4), default=256)
    p.add_argument("--chunks", type=at_least(2), default=8,
                   help="perplexity chunks at most (llama.cpp's method needs 2 or more)")
    p.add_argument("-t", "--threads", type=thread_count, default=2)
    p.add_argument("-p", "--n-prompt", type=positive_int, default=128)
    p.add_argument("-n", "--n-gen", type=positive_int, default=32)
    p.add_argument("--repeat", type=positive_int, default=3)
    p.add_argument("--tune-file", type=file_name, help="ggml-tune data for ggml_py's MUL_MAT profiles")
    args = p.parse_args(argv)
    try:
        import llama_cpp  # noqa: F401  (the peer; checked before loading anything)
    except ImportError:
        raise ValueError("needs llama-cpp-python (pip install llama-cpp-python; see the "
                         "README's Benchmarks section)") from None
    text = read_prompt_file(args.file) if args.file else None     # a missing file: now

    ours, _ = open_llama(args.model, n_ctx=max(args.ctx_size, args.n_prompt + args.n_gen),
                         n_threads=args.threads)    # quiet past n_ctx_train, as llama.cpp's here
    if args.tune_file:
        ours.set_tune(args.tune_file)
    lc = llama_cpp_model(args.model, max(args.ctx_size, args.n_prompt + args.n_gen), args.threads)
    print(gg.system_info())
    print(f"model: {args.model}; llama.cpp loads it: yes")

    ids = ours.tokenize(PROMPT, add_bos=True)
    same = ids == lc.tokenize(PROMPT.encode(), add_bos=True)
    got = ours.eval(ids).copy()
    lc.reset()
    lc.eval(ids)
    ref = np.asarray(lc.scores[:len(ids)], np.float32)
    print(f"tokens identical: {same}; logits: max |ggml_py - llama.cpp| = {np.abs(got - ref).max():.4g} "
          f"(max |logit| {np.abs(ref).max():.3g}); greedy next tokens agree on "
          f"{100 * (got.argmax(1) == ref.argmax(1)).mean():.0f} % of positions")

    if text is not None:
        tokens = ours.tokenize(text, add_bos=True)[: args.chunks * args.ctx_size + 1]
        tokens = tokens[: max(2, len(tokens) // args.ctx_size) * args.ctx_size]
        ppl_ours = perplexity(ours, tokens, n_ctx=args.ctx_size).ppl
        ppl_lc = llama_cpp_perplexity(lc, tokens, args.ctx_size, ours.tokenizer.add_bos, ours.token_bos())
        print(f"perplexity (c={args.ctx_size}, {len(tokens) // args.ctx_size} chunks): ggml_py {ppl_ours:.4f}, "
              f"llama.cpp {ppl_lc:.4f}, ratio {ppl_ours / ppl_lc:.5f}")

    prompt = (ids * (args.n_prompt // len(ids) + 1))[: args.n_prompt]
    del lc   # speed: an instance that keeps only the last logits, as llama-bench runs
    lc = llama_cpp_model(args.model, max(args.ctx_size, args.n_prompt + args.n_gen), args.threads,
                         logits_all=False)

    def ours_tg():
        for t in range(args.n_gen):
            ours._decode([prompt[(t + 1) % len(prompt)]])

    def lc_tg():
        for t in range(args.n_gen):
            lc.eval([prompt[(t + 1) % len(prompt)]])

    def ours_first():
        ours.reset()
        ours._decode(prompt[:1])

    def lc_first():
        lc.reset()
        lc.eval(prompt[:1])

    # pp: the prompt from an empty cache, the last token's logits only (as llama-bench);
    # tg: n_gen decodes after one token (that one untimed, as llama-bench times n)
    pp = time_in_turns((ours.reset, lambda: ours._decode(prompt)),
                       (lc.reset, lambda: lc.eval(prompt)), args.repeat)
    tg = time_in_turns((ours_first, ours_tg), (lc_first, lc_tg), args.repeat)
    rows = [("pp", args.n_prompt, *pp), ("tg", args.n_gen, *tg)]
    print(f"{'test':<8} {'ggml_py t/s':>12} {'llama.cpp t/s':>14} {'ratio':>7}")
    for name, n, t_ours, t_lc in rows:
        print(f"{name}{n:<6} {n / t_ours:12.1f} {n / t_lc:14.1f} {t_lc / t_ours:7.2f}")


if __name__ == "__main__":
    sys.exit(run("compare_llama_cpp.py", main))
