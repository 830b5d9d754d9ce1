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
from ggml_py.perplexity import perplexity, token_nll

PROMPT = "ROMEO. But soft, what light through yonder window breaks? It is the east, and Juliet is the sun."


def llama_cpp_model(path, n_ctx, n_threads, logits_all=True):
    import llama_cpp
    return llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=n_threads, n_batch=n_ctx,
                           logits_all=logits_all, verbose=False)


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


def time_in_turns(fn_a, fn_b, repeat):
    """Median seconds of fn_a and fn_b, run in turns after one warm-up each."""
    fn_a(), fn_b()
    runs = ([], [])
    for _ in range(repeat):
        for fn, out in zip((fn_a, fn_b), runs):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return statistics.median(runs[0]), statistics.median(runs[1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", required=True)
    p.add_argument("-f", "--file", help="text for perplexity (none: skip it)")
    p.add_argument("-c", "--ctx-size", type=int, default=256)
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-p", "--n-prompt", type=int, default=128)
    p.add_argument("-n", "--n-gen", type=int, default=32)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--tune-file", help="ggml-tune data for ggml_py's MUL_MAT profiles")
    args = p.parse_args()
    try:
        import llama_cpp  # noqa: F401  (the peer; checked before loading anything)
    except ImportError:
        sys.exit("compare_llama_cpp.py: needs llama-cpp-python (pip install llama-cpp-python; "
                 "see the README's Benchmarks section)")

    ours = gg.Llama(args.model, n_ctx=max(args.ctx_size, args.n_prompt + args.n_gen),
                    n_threads=args.threads)
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

    if args.file:
        text = open(args.file, encoding="utf-8").read()
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

    def ours_pp():
        ours.reset()
        ours._decode(prompt)   # the last token's logits only, like llama.cpp here

    def lc_pp():
        lc.reset()
        lc.eval(prompt)

    def ours_tg():
        ours.reset()
        ours._decode(prompt[:1])
        for t in range(args.n_gen):
            ours._decode([prompt[(t + 1) % len(prompt)]])

    def lc_tg():
        lc.reset()
        lc.eval(prompt[:1])
        for t in range(args.n_gen):
            lc.eval([prompt[(t + 1) % len(prompt)]])

    rows = [("pp", args.n_prompt, *time_in_turns(ours_pp, lc_pp, args.repeat)),
            ("tg", args.n_gen, *time_in_turns(ours_tg, lc_tg, args.repeat))]
    print(f"{'test':<8} {'ggml_py t/s':>12} {'llama.cpp t/s':>14} {'ratio':>7}")
    for name, n, t_ours, t_lc in rows:
        print(f"{name}{n:<6} {n / t_ours:12.1f} {n / t_lc:14.1f} {t_lc / t_ours:7.2f}")


if __name__ == "__main__":
    main()
