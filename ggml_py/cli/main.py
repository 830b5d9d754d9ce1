"""ggml-main: generate text from a prompt, with llama.cpp's `llama-cli` flags.

The prompt and the generated text go to stdout as they are produced; the
system info, load time and the timings at the end go to stderr. Ctrl-C stops
generation and still prints the timings (exit status 130). -cnv (a chat with the
model's template), -i / --interactive-first and -r run cli/interactive.py's loop.
"""
import argparse
import random
import sys

import ggml_py as gg
from ggml_py.cli import interactive
from ggml_py.cli.common import (ArgumentParser, add_model_arguments, console_script, file_name,
                                kv_options, number, open_llama, positive_number, process_escapes,
                                read_prompt_file, run, seed_value, setup_tune)
from ggml_py.model.bundled import default_model_path
from ggml_py.model.context_shift import kept_count
from ggml_py.model.perplexity import ADD_EOS_REFUSED
from ggml_py.model.sampling import SamplingParams

PROG = "ggml-main"


def repeat_window(text):
    """--repeat-last-n: a token count, 0 (off) or -1 (the whole context), as llama.cpp."""
    value = int(text)
    if value < -1:
        raise argparse.ArgumentTypeError(f"must be at least -1 (-1: the context), got {value}")
    return value


def predict_count(text):
    """-n: tokens to predict, or -1 (no limit) or -2 (until the context is full), as llama.cpp."""
    value = int(text)
    if value < -2:
        raise argparse.ArgumentTypeError(f"must be at least -2 (-1: no limit, -2: until the "
                                         f"context is full), got {value}")
    return value


def keep_value(text):
    """--keep: tokens of the prompt a context shift keeps (-1: all of it), as llama.cpp."""
    value = int(text)
    if value < -1:
        raise argparse.ArgumentTypeError(f"must be at least -1 (-1: the whole prompt), got {value}")
    return value


def prompt_taken_whole(argv):
    """argv with -p/--prompt VALUE as --prompt=VALUE: as llama-cli, the word after -p is
    the prompt even when it starts with '-' ("-p '- a list item'"), which argparse
    would take for a flag."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in ("-p", "--prompt") and i + 1 < len(argv):
            out.append(f"--prompt={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


class PromptSource(argparse.Action):
    """-p and -f both set the prompt, in the order given: the later one wins, as in llama.cpp."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.prompt_from = self.dest


def build_parser():
    """The flags of ggml-main: the shared model flags plus llama-cli's prompt and sampling flags."""
    p = ArgumentParser(prog=PROG, description="Generate text with a llama-architecture GGUF model.")
    add_model_arguments(p, ctx_default=2048)
    p.add_argument("-p", "--prompt", default="", action=PromptSource,
                   help="prompt to start generation with (special tokens such as <s> are parsed)")
    p.add_argument("-f", "--file", type=file_name, metavar="FNAME", action=PromptSource,
                   help="a file holding the prompt, less one trailing newline (the later of "
                        "-p and -f is the prompt)")
    p.set_defaults(prompt_from="prompt")
    p.add_argument("-n", "--n-predict", type=predict_count, default=-1, metavar="N",
                   help="tokens to predict (default: -1 = no limit: until end of text, the "
                        "context shifting when full; -2 = until the context is full)")
    p.add_argument("-s", "--seed", type=seed_value, default=-1, metavar="SEED",
                   help="RNG seed (default: -1, a random seed)")
    p.add_argument("--temp", type=number, default=0.8, help="temperature (default: 0.8; <= 0: greedy)")
    p.add_argument("--top-k", type=int, default=40, help="top-k sampling (default: 40, 0 = off)")
    p.add_argument("--top-p", type=number, default=0.95, help="top-p sampling (default: 0.95, 1.0 = off)")
    p.add_argument("--min-p", type=number, default=0.05, help="min-p sampling (default: 0.05, 0.0 = off)")
    p.add_argument("--repeat-penalty", type=positive_number, default=1.0,
                   help="penalize repeated tokens (default: 1.0 = off; must be > 0)")
    p.add_argument("--repeat-last-n", type=repeat_window, default=64,
                   help="last n tokens the penalties consider (default: 64, 0 = off, -1 = context)")
    p.add_argument("--presence-penalty", type=number, default=0.0,
                   help="subtracted from a repeated token's logit (default: 0.0 = off)")
    p.add_argument("--frequency-penalty", type=number, default=0.0,
                   help="times a token's count, subtracted from its logit (default: 0.0 = off)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="never end at an end-of-text token (its logit is set to -inf)")
    p.add_argument("--verbose-prompt", action="store_true", help="print the prompt's tokens")
    p.add_argument("--keep", type=keep_value, default=0, metavar="N",
                   help="tokens of the prompt a context shift keeps (default: 0, -1 = all; "
                        "the BOS is always kept)")
    p.add_argument("--no-display-prompt", dest="display_prompt", action="store_false",
                   help="do not echo the prompt")
    p.add_argument("-co", "--color", action="store_true",
                   help="colour the prompt (yellow) and the user's input (green) where the "
                        "terminal shows colours")
    p.add_argument("-sp", "--special", action="store_true",
                   help="print special tokens (<s>, </s>, <|im_end|> ...) as their texts")
    chat = p.add_argument_group("conversation and interactive modes")
    chat.add_argument("-cnv", "--conversation", action="store_true",
                      help="chat with the model, in its chat template (a plain User:/Assistant: "
                           "transcript for a model without one); -p is the first message")
    chat.add_argument("-sys", "--system-prompt", metavar="PROMPT",
                      help="the system message of the conversation (with -cnv)")
    chat.add_argument("-i", "--interactive", action="store_true",
                      help="generate, then read input where a reverse prompt or the end of "
                           "text is reached, and go on")
    chat.add_argument("-if", "--interactive-first", action="store_true",
                      help="as -i, but read input before generating")
    chat.add_argument("-r", "--reverse-prompt", action="append", default=[], metavar="PROMPT",
                      help="stop generating where the text ends with PROMPT (plain text; "
                           "may be given more than once) and, with -i, read input there")
    return p


def log_settings(llm, args, prompt, ids, n_keep, seed, log):
    """The prompt's tokens (--verbose-prompt), the sampler's and the run's settings."""
    if args.verbose_prompt:
        log(f"main: prompt: '{prompt}'")
        log(f"main: number of tokens in prompt = {len(ids)}")
        for t in ids:
            log(f"{t:6d} -> '{llm.tokenizer.token_to_piece(t).decode('utf-8', 'replace')}'")
    repeat_last_n = llm.n_ctx() if args.repeat_last_n < 0 else args.repeat_last_n
    log(f"sampler params: repeat_last_n = {repeat_last_n}, repeat_penalty = {args.repeat_penalty:.3f}, "
        f"frequency_penalty = {args.frequency_penalty:.3f}, presence_penalty = {args.presence_penalty:.3f}, "
        f"top_k = {args.top_k}, top_p = {args.top_p:.3f}, min_p = {args.min_p:.3f}, temp = {args.temp:.3f}")
    log(f"generate: n_ctx = {llm.n_ctx()}, n_batch = {args.batch_size}, "
        f"n_predict = {args.n_predict}, n_keep = {n_keep}, seed = {seed}")
    log("")


def log(*args):
    """Print to stderr, flushed at once (stdout carries only the text)."""
    print(*args, file=sys.stderr, flush=True)


def main(argv=None):
    """Load the model, echo the prompt and stream the generated text to stdout, timings to
    stderr. Returns the exit status: 0, or 130 when interrupted."""
    parser = build_parser()
    args = parser.parse_args(prompt_taken_whole(sys.argv[1:] if argv is None else argv))
    if args.system_prompt is not None and not args.conversation:
        parser.error("-sys/--system-prompt goes with -cnv/--conversation")
    if "" in args.reverse_prompt:
        parser.error("argument -r/--reverse-prompt: expected a text, got ''")
    args.model = args.model or default_model_path()
    prompt = args.prompt if args.prompt_from == "prompt" else read_prompt_file(args.file)
    if args.escape:    # as llama.cpp: on by default, for -p and -f and the reverse prompts
        prompt = process_escapes(prompt)
        args.reverse_prompt = [process_escapes(text) for text in args.reverse_prompt]
    seed = args.seed if args.seed >= 0 else random.SystemRandom().randrange(2**32)

    llm, load_warnings = open_llama(args.model, args.ctx_size, args.ctx_default, n_threads=args.threads,
                                    n_batch=args.batch_size, **kv_options(args),
                                    use_mmap=args.use_mmap, repack=args.repack, tp=args.tp,
                                    tp_log=args.tp_log)
    c = llm.config
    log(f"system_info: n_threads = {llm.n_threads()} / {gg.default_threads()} | {gg.system_info()}")
    log(f"main: loaded {args.model}: llama, {c.n_layer} layers, {c.n_embd} wide, "
        f"{c.n_head}/{c.n_head_kv} heads of {c.head_dim}, vocab {c.n_vocab}, "
        f"{llm.model.file.file_type_name()}, in {1e3 * llm.timings.load_s:.2f} ms")
    for message in load_warnings:
        log(f"main: warning: {message}")
    if args.tune and args.tune_file is not None:    # bench, save the file, exit
        setup_tune(llm, args, log)
        return 0

    if llm.tokenizer.add_eos:
        raise ValueError(ADD_EOS_REFUSED)
    repeat_last_n = llm.n_ctx() if args.repeat_last_n < 0 else args.repeat_last_n
    params = SamplingParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                            min_p=args.min_p, repeat_penalty=args.repeat_penalty,
                            repeat_last_n=repeat_last_n,
                            frequency_penalty=args.frequency_penalty,
                            presence_penalty=args.presence_penalty, seed=seed)
    if args.conversation or args.interactive or args.interactive_first or args.reverse_prompt:
        # checks now that the opening fits: nothing is echoed for one that does not
        conv, reply_first = interactive.start(llm, args, params, prompt, log)
        setup_tune(llm, args, log)
        log_settings(llm, args, prompt, conv.tokens, conv.n_keep, seed, log)
        if args.conversation or args.interactive or args.interactive_first:
            interactive.interactive_banner(args, log)
        status = interactive.run(llm, conv, reply_first, args, log)
        log("")
        for line in llm.timings.lines():
            log(f"perf: {line}")
        return status
    # as llama-cli: special tokens in the prompt ("<s>") are parsed; an empty prompt is
    # the BOS alone, or refused where the vocabulary adds none
    ids = llm.tokenize(prompt, special=True)
    if not ids:
        raise ValueError("the prompt is empty (and this vocabulary adds no BOS token to start from)")
    # checks now that the prompt fits the context: nothing is echoed for one that does not
    # -1: no limit, the context shifting when full (as llama-cli); -2: until it is full
    generated = llm.generate_tokens(ids, params, max_tokens=args.n_predict,
                                    ignore_eos=args.ignore_eos,
                                    context_shift=args.n_predict == -1, keep=args.keep)
    setup_tune(llm, args, log)    # after the prompt's checks: a refused prompt benches nothing
    n_keep = kept_count(ids, args.keep, llm.token_bos(),
                        llm.n_ctx() if args.n_predict == -1 else None)   # (as generate's)
    log_settings(llm, args, prompt, ids, n_keep, seed, log)

    status = 0
    decoder = llm.tokenizer.decoder(unparse_special=args.special, strip_leading_space=False)
    out = sys.stdout
    try:
        if args.display_prompt:
            out.write("".join(decoder.feed(t) for t in ids))
        out.flush()
        n_generated = 0
        for token in generated:
            out.write(decoder.feed(token))
            out.flush()
            n_generated += 1
        out.write(decoder.flush() + "\n")
        stopped_by_n = 0 <= args.n_predict <= n_generated
        if len(ids) + n_generated >= llm.n_ctx() and not stopped_by_n:
            log("main: context full, stopping")
    except KeyboardInterrupt:
        out.write(decoder.flush() + "\n")
        log("main: interrupted")
        status = 130
    out.flush()
    log("")
    for line in llm.timings.lines():
        log(f"perf: {line}")
    return status


@console_script
def cli(argv=None):
    """Entry point of the ggml-main console script."""
    return run(PROG, main, argv)


if __name__ == "__main__":
    sys.exit(cli())
