"""ggml-perplexity: perplexity of a text file by llama.cpp's method and printout.

stdout gets `[1]x,[2]y,...` as each chunk finishes, then
`Final estimate: PPL = X +/- Y`; stderr gets the log lines and a tqdm progress
bar with the time left. When stdout and stderr are the same terminal, the
running values show in the bar and the `[i]` line is printed when done (a bar
and a growing line cannot share one terminal line).
"""
import argparse
import sys
import time

import ggml_py as gg
from ggml_py.model.bundled import default_model_path, default_text_path
from ggml_py.cli.common import (ArgumentParser, add_model_arguments, console_script, file_name,
                                kv_options, open_llama, process_escapes, read_prompt_file,
                                run, setup_tune)
from ggml_py.model.perplexity import ADD_EOS_REFUSED

PROG = "ggml-perplexity"


def chunk_count(text):
    """--chunks: at least 1, or negative for all chunks (0 would score nothing)."""
    value = int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1, or negative for all chunks, got 0")
    return value


def build_parser():
    """The flags of ggml-perplexity: the shared model flags plus -f and --chunks."""
    p = ArgumentParser(prog=PROG, description="Perplexity of a text file, llama.cpp's method.")
    add_model_arguments(p, ctx_default=512)
    p.add_argument("-f", "--file", type=file_name, default=None, metavar="FNAME",
                   help="text file to score, less one trailing newline (default: the bundled "
                        "held-out Shakespeare text)")
    p.add_argument("--chunks", type=chunk_count, default=-1, metavar="N",
                   help="score at most N chunks (default: -1 = all; 0 is refused)")
    return p


def log(*args):
    """Print to stderr, flushed at once (stdout carries only the [i] values and the estimate)."""
    print(*args, file=sys.stderr, flush=True)


def main(argv=None):
    """Score the text chunk by chunk (n_ctx tokens each) and print the running and final
    perplexity. Returns the exit status: 0, or 130 when interrupted."""
    from tqdm import tqdm
    parser = build_parser()
    args = parser.parse_args(argv)
    args.model = args.model or default_model_path()
    if args.ctx_size and args.ctx_size < 4:
        parser.error(f"argument -c/--ctx-size: must be at least 4 (0: the model's training "
                     f"context), got {args.ctx_size}")
    args.file = args.file or default_text_path()
    text = read_prompt_file(args.file)    # as llama.cpp's -f, for every program
    if args.escape:    # llama.cpp escapes params.prompt, which holds the -f text
        text = process_escapes(text)

    llm, load_warnings = open_llama(args.model, args.ctx_size, args.ctx_default, n_threads=args.threads,
                                    n_batch=args.batch_size, **kv_options(args),
                                    use_mmap=args.use_mmap, repack=args.repack, tp=args.tp,
                                    tp_log=args.tp_log)
    log(f"system_info: n_threads = {llm.n_threads()} / {gg.default_threads()} | {gg.system_info()}")
    log(f"perplexity: loaded {args.model} in {1e3 * llm.timings.load_s:.2f} ms")
    for message in load_warnings:
        log(f"perplexity: warning: {message}")
    n_ctx = llm.n_ctx()
    if n_ctx < 4:
        raise ValueError(f"{args.model}: the model's training context is {n_ctx} tokens; "
                         f"perplexity needs at least 4: give -c N")
    if args.tune and args.tune_file is not None:    # bench, save the file, exit
        setup_tune(llm, args, log)
        return 0
    if llm.tokenizer.add_eos:
        raise ValueError(ADD_EOS_REFUSED)
    log("perplexity: tokenizing the input ..")
    t0 = time.perf_counter()
    tokens = llm.tokenize(text, add_bos=True)   # as llama-perplexity: "<s>" etc. stay text
    log(f"perplexity: tokenization took {1e3 * (time.perf_counter() - t0):g} ms")
    if len(tokens) < 2 * n_ctx:
        raise ValueError(f"you need at least {2 * n_ctx} tokens to evaluate perplexity with a "
                         f"context of {n_ctx}; the data file tokenizes to only {len(tokens)} tokens")
    setup_tune(llm, args, log)    # after the text's checks: a refused text benches nothing
    n_chunk = len(tokens) // n_ctx if args.chunks < 0 else min(args.chunks, len(tokens) // n_ctx)
    log(f"perplexity: calculating perplexity over {n_chunk} chunks, n_ctx={n_ctx}, "
        f"batch_size={min(args.batch_size, n_ctx)}, n_seq=1")

    same_terminal = sys.stdout.isatty() and sys.stderr.isatty()
    bar = tqdm(total=n_chunk, unit="chunk", file=sys.stderr, leave=False, dynamic_ncols=True,
               disable=None)
    values = []

    def on_chunk(i, n, ppl, seconds):
        if i == 0:
            log(f"perplexity: {seconds:.2f} seconds per pass - ETA {seconds * n / 60:.2f} minutes")
        values.append(f"[{i + 1}]{ppl:.4f},")
        if same_terminal:
            bar.set_postfix_str(f"PPL {ppl:.4f}", refresh=False)
        else:
            sys.stdout.write(values[-1])
            sys.stdout.flush()
        bar.update(1)

    status = 0
    try:
        result = llm.perplexity(tokens, n_ctx=n_ctx, n_chunks=n_chunk, callback=on_chunk)
    except KeyboardInterrupt:
        result, status = None, 130
    bar.close()
    if same_terminal:
        sys.stdout.write("".join(values))
    sys.stdout.write("\n")
    if result is None:
        log(f"{PROG}: interrupted")
        return status
    if result.error == result.error:   # not NaN
        print(f"Final estimate: PPL = {result.ppl:.4f} +/- {result.error:.5f}")
    else:
        print(f"Final estimate: PPL = {result.ppl:.4f}")
        log("Unexpected negative standard deviation of log(prob)")
    for line in llm.timings.lines():
        log(f"perf: {line}")
    return status


@console_script
def cli(argv=None):
    """Entry point of the ggml-perplexity console script."""
    return run(PROG, main, argv)


if __name__ == "__main__":
    sys.exit(cli())
