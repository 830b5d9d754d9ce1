"""What the command-line programs share: one-line errors, model loading, flags."""
import argparse
import functools
import math
import os
import re
import signal
import sys
import threading
import warnings

from ggml_py.dist.launch import (join_start, leave_before_start, mpiexec_size, rank_line,
                                 serve_and_exit, world)
from ggml_py.dist.llama import Llama
from ggml_py.files.gguf_reader import GGUFModelFile, ModelFileWarning, ModelLoadError
from ggml_py.model.config import DEFAULT_N_CTX, LlamaConfig, context_size
from ggml_py.model.session import TrainingContextWarning
from ggml_py.tokenizer.metadata import TokenizerWarning


def console_script(main):
    """Wrap a console script's entry point: when the reader of its output goes
    away (`ggml-tune analyze F | head`), it stops quietly with exit status 141,
    as a program killed by SIGPIPE does, instead of reporting an error. A standard
    stream closed at the start (`<&-`, `2>&-`) is the null device: no input, and the
    logs go nowhere rather than into stdout, which carries only the text."""
    @functools.wraps(main)
    def entry(*args, **kwargs):
        for name, mode in (("stdin", "r"), ("stdout", "w"), ("stderr", "w")):
            if getattr(sys, name) is None:
                setattr(sys, name, open(os.devnull, mode))
        argv = args[0] if args else kwargs.get("argv")
        status = 1
        try:
            status = main(*args, **kwargs)
            return status
        except BrokenPipeError:
            # the interpreter flushes stdout at exit: let that flush go nowhere
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            status = 141
            return status
        except BaseException as exc:
            status = exc
            raise
        finally:
            # a rank of a split model (--tp under mpiexec) that ends before the ranks
            # meet to load it: the others, waiting for it there, end too
            leave_before_start(sys.argv[1:] if argv is None else argv, status)
    return entry


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (no usage dump) and exits 2, and
    refuses a one-dash word it does not know (llama.cpp's `-ngl`, `-fa`, `-tb`) rather
    than read it as a one-letter flag and its value (`-n gl`, `-f a`, `-t b`)."""

    # a flag's value that argparse would take for a flag ('-inf' for -i, '-1e-3'): its
    # negative numbers are digits with an optional point
    NEGATIVE_NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?|-(inf|infinity|nan)", re.I)

    def error(self, message):
        """Print "<prog>: error: <message>" to stderr and exit with status 2."""
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_args(self, args=None, namespace=None):
        """argparse's; arguments that no flag takes are reported by the subcommand they
        were given to ('ggml-bench model: error: ...'), not by the program."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self._parser_given(parsed).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def _parser_given(self, parsed):
        """The parser of the subcommand that parsed holds (this one without subcommands)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                sub = action.choices.get(getattr(parsed, action.dest, None) or "")
                if isinstance(sub, ArgumentParser):
                    return sub._parser_given(parsed)
        return self

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, after refusing unknown one-dash words (see the class)."""
        args = self._glue_negative_values(sys.argv[1:] if args is None else list(args))
        word = self._unknown_one_dash_word(args)
        if word is not None:
            glued = self._option_string_actions.get(word[:2])
            hint = f"not read as '{word[:2]} {word[2:]}'; " if glued and glued.nargs != 0 else ""
            self.error(f"unrecognized argument '{word}' ({hint}see --help for this program's flags)")
        return super().parse_known_args(args, namespace)

    def _glue_negative_values(self, args):
        """args with '--temp -inf' as '--temp=-inf' (a negative number after a flag that
        takes one value), so that argparse reads it as the value. Stops at '--'."""
        out = []
        for i, arg in enumerate(args):
            if arg == "--":
                return out + args[i:]
            action = self._flag_action(out[-1]) if out else None
            if action is not None and action.nargs is None and self.NEGATIVE_NUMBER.fullmatch(arg):
                out[-1] += "=" + arg
            else:
                out.append(arg)
        return out

    def _flag_action(self, word):
        """The action of flag `word`, or of the one long flag it abbreviates ('--tem' for
        '--temp', as argparse reads it); None if it is neither."""
        action = self._option_string_actions.get(word)
        if action is None and self.allow_abbrev and word.startswith("--") and "=" not in word:
            found = {a for name, a in self._option_string_actions.items() if name.startswith(word)}
            action = found.pop() if len(found) == 1 else None
        return action

    def _unknown_one_dash_word(self, args):
        """The first argument such as '-ngl' (or '-fa=1') that is not one of this parser's
        flags, nor the value of one, nor one-letter switches run together ('-eh'); None if
        there is none. Stops at '--' and at a subcommand, whose own parser checks the rest."""
        subcommands = {name for action in self._actions
                       if isinstance(action, argparse._SubParsersAction) for name in action.choices}
        takes_value = False
        for arg in args:
            if takes_value:
                takes_value = False
                continue
            if arg == "--" or arg in subcommands:
                return None
            name = arg.split("=", 1)[0]
            action = self._option_string_actions.get(name)
            if action is not None:
                takes_value = "=" not in arg and action.nargs != 0
            elif re.fullmatch(r"-[A-Za-z]{2}[A-Za-z0-9-]*", name) and not self._switches(name):
                return arg
        return None

    def _switches(self, word):
        """Whether '-eh' is one-letter flags that take no value, run together."""
        actions = [self._option_string_actions.get("-" + letter) for letter in word[1:]]
        return all(action is not None and action.nargs == 0 for action in actions)


def positive_int(text):
    """An integer flag that must be at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def seed_value(text):
    """-s / --seed: -1 for a random seed (drawn and printed), else 0 or more."""
    value = int(text)
    if value < -1:
        raise argparse.ArgumentTypeError(f"must be -1 (a random seed) or 0 or more, got {value}")
    return value


def thread_count(text):
    """A thread count flag: 1..MAX_THREADS (the worker pool's limit)."""
    from ggml_py.core.graph import MAX_THREADS
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"thread count must be at least 1, got {value}")
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"thread count must be at most {MAX_THREADS}, got {value}")
    return value


def int_list(text, low=None, high=None, what="integers"):
    """Comma-separated integers (e.g. 1,2,4), each in low..high (None: unbounded).
    An empty item or a value out of range is refused (argparse.ArgumentTypeError)."""
    try:
        values = [int(item) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}") from None
    for value in values:
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f"at least {low}" if high is None else f"at most {high}" if low is None \
                else f"in {low}..{high}"
            raise argparse.ArgumentTypeError(f"{what} must be {bounds}, got {value}")
    return values


def thread_list(text):
    """A comma-separated list of thread counts, each 1..MAX_THREADS (the pool's limit)."""
    from ggml_py.core.graph import MAX_THREADS
    return int_list(text, 1, MAX_THREADS, what="thread counts")


def positive_int_list(text):
    """A comma-separated list of integers that must be at least 1."""
    return int_list(text, low=1)


def count_list(text):
    """A comma-separated list of counts (integers, 0 or more)."""
    return int_list(text, low=0, what="counts")


def n_threads(text):
    """-t of ggml-main / ggml-perplexity: as llama.cpp, 0 or less (-1 is its default) means
    the default thread count (None: the physical cores); else 1..MAX_THREADS."""
    return thread_count(text) if int(text) > 0 else None


def ctx_size(text):
    """-c: a token count, or 0 for the model's training context."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0 (0: the model's training "
                                         f"context), got {value}")
    return value


def weight_type(text):
    """A weight type flag: a type name (any case) with a matrix product kernel."""
    import ggml_py as gg
    from ggml_py.tune.bench import weight_type as checked
    names = {t.name.lower(): t for t in gg.Type}
    type = names.get(text.strip().lower())
    if type is None:
        valid = sorted(n for n, t in names.items() if gg.type_traits(t)["has_vec_dot"])
        raise argparse.ArgumentTypeError(f"unknown weight type {text!r}; one of {', '.join(valid)}")
    try:
        return checked(type)
    except ValueError as exc:     # a type without a kernel (I8, Q8_K, ...)
        raise argparse.ArgumentTypeError(str(exc)) from None


def weight_type_list(text):
    """A comma-separated list of weight types (weight_type)."""
    return [weight_type(name) for name in text.split(",")]


def file_name(text):
    """A file flag: an empty name is refused (it must not fall back to a default file)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a file name, got ''")
    return text


def number(text):
    """A float flag; NaN is refused (it compares false with everything)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if math.isnan(value):
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
    return value


def positive_number(text):
    """A float flag that must be finite and > 0."""
    value = number(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def read_prompt_file(path):
    """The text of a prompt file as llama.cpp reads `-f`: the raw bytes (invalid UTF-8
    kept as surrogate escapes, as for a command-line argument, so byte tokens stand
    for them) with one trailing newline dropped."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "surrogateescape")
    except OSError as e:        # as a model file's error: the file, then the problem
        raise ValueError(f"{path}: cannot read ({e.strerror or e})") from None
    return text[:-1] if text.endswith("\n") else text


def process_escapes(text):
    """text with llama.cpp's escapes replaced (common.cpp's string_process_escapes):
    \\n \\r \\t \\' \\" \\\\ become the character, \\xHH the byte HH; any other
    backslash stays. Works on the bytes, so a \\xHH that is not UTF-8 with its neighbours
    is kept as a byte (a surrogate escape, as -p and -f keep invalid bytes)."""
    data = text.encode("utf-8", "surrogateescape")
    data = _ESCAPE.sub(lambda m: _ESCAPES.get(m[1]) or bytes([int(m[1][1:], 16)]), data)
    return data.decode("utf-8", "surrogateescape")


_ESCAPES = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"'": b"'", b'"': b'"', b"\\": b"\\"}
_ESCAPE = re.compile(rb"\\(x[0-9A-Fa-f]{2}|[nrt'\"\\])")


def add_model_arguments(parser, ctx_default):
    """Flags every program has, with llama.cpp's names."""
    parser.add_argument("-m", "--model", type=file_name, default=None, metavar="FNAME",
                        help="model path (a llama-architecture GGUF file; default: the bundled "
                             "Shakespeare model)")
    parser.add_argument("-t", "--threads", type=n_threads, default=None, metavar="N",
                        help="threads (default: -1 = physical cores; 0 or less: the default)")
    parser.add_argument("-c", "--ctx-size", type=ctx_size, default=None, metavar="N",
                        help=f"context size in tokens (default: {ctx_default}, or the model's "
                             f"training context when that is smaller; 0 = from model)")
    parser.set_defaults(ctx_default=ctx_default)
    parser.add_argument("-e", "--escape", action="store_true", default=True,
                        help="process escapes (\\n, \\r, \\t, \\', \\\", \\\\, \\xHH) in the "
                             "prompt or -f text (default: on)")
    parser.add_argument("--no-escape", dest="escape", action="store_false",
                        help="do not process escape sequences")
    parser.add_argument("-b", "--batch-size", type=positive_int, default=512, metavar="N",
                        help="most tokens evaluated at once (default: 512)")
    add_kv_arguments(parser)
    parser.add_argument("--no-mmap", dest="use_mmap", action="store_false",
                        help="read the model into memory instead of mapping it (then changing "
                             "the file while the program runs does not reach it)")
    add_repack_argument(parser)
    parser.add_argument("--tp", action="store_true",
                        help="under mpiexec -n N: split the model over the N processes (tensor "
                             "parallel; N must divide the model's KV heads); rank 0 prints, "
                             "the others compute their share")
    add_tp_log_argument(parser)
    parser.add_argument("--tune", action="store_true",
                        help="bench the model's matrix shapes at start-up and schedule MUL_MAT "
                             "profiles with the results (with --tune-file: bench, save, exit)")
    parser.add_argument("--tune-file", metavar="FNAME",
                        help="load MUL_MAT tune data (ggml-tune) to schedule with; with --tune, "
                             "write it there and exit")


KV_TYPE_CHOICES = ("f32", "f16", "q8_0", "q4_0", "int8")
ATTENTION_CHOICES = ("auto", "graph", "slim", "flash")


def add_repack_argument(parser):
    """--no-repack (args.repack): the programs' switch for Llama(repack=)."""
    parser.add_argument("--no-repack", dest="repack", action="store_false",
                        help="keep the file's weight layout: Q4_0, Q4_K, Q5_K and Q6_K matrices "
                             "are not copied with their rows interleaved at load (faster start, "
                             "slower decoding)")


def add_tp_log_argument(parser):
    """--tp-log (args.tp_log): open_llama's tp_log."""
    parser.add_argument("--tp-log", action="store_true",
                        help="with --tp: the other processes also log to stderr (what each "
                             "holds, how long it served), each line starting 'rank N:'")


def add_kv_arguments(parser):
    """-ctk, -ctv (llama.cpp's names and types, plus int8) and --attention."""
    parser.add_argument("-ctk", "--cache-type-k", choices=KV_TYPE_CHOICES, default="f16",
                        help="KV cache type for K (default: f16; int8: one scale per token and "
                             "head)")
    parser.add_argument("-ctv", "--cache-type-v", choices=KV_TYPE_CHOICES, default=None,
                        help="KV cache type for V (default: as K)")
    parser.add_argument("--attention", choices=ATTENTION_CHOICES, default="auto",
                        help="attention: one node (slim or flash profile; auto: each token slim "
                             "or flash by its own context length) or the three-node graph "
                             "(f16/f32 caches) (default: auto)")


def kv_options(args):
    """The Llama keyword arguments of -ctk, -ctv and --attention."""
    return {"kv_type": args.cache_type_k, "kv_type_v": args.cache_type_v or args.cache_type_k,
            "attention": args.attention}


def setup_tune(llm, args, log):
    """Apply --tune / --tune-file to a loaded Llama: --tune benches its shapes and
    schedules with the data or, with --tune-file, saves them there (the program then
    exits); --tune-file alone loads the file.

    A tune file that cannot be used (corrupt, another CPU, model or version) is
    reported in one line and the run goes on with ggml's fallback rule.
    """
    import time

    from ggml_py.tune import data as tune
    from ggml_py.tune.bench import bench
    m_max = min(args.batch_size, llm.n_ctx())   # the largest batch a run can evaluate
    if args.tune:
        if args.tune_file is not None:
            tune.check_writable(args.tune_file, not_over=llm.model.file.path)
        name, shapes = llm.matrix_shapes()     # a split model's: its ranks' shares
        m_values = [2 ** i for i in range(max(m_max - 1, 1).bit_length() + 1)]
        start = time.perf_counter()
        data = bench(shapes, model=name, m_values=m_values, thread_counts=[llm.n_threads()])
        log(f"tune: benched {len(shapes)} shapes x {len(m_values)} M at "
            f"{tune.threads_text([llm.n_threads()])} "
            f"in {time.perf_counter() - start:.1f} s")
        if args.tune_file is not None:
            data.save(args.tune_file)
            log(f"tune: saved {args.tune_file}")
        else:
            llm.set_tune(data)
    elif args.tune_file is not None:
        try:
            llm.set_tune(args.tune_file)
            log(f"tune: scheduling MUL_MAT profiles with {args.tune_file}")
            data = llm.model.tune
            if llm.n_threads() not in data.thread_counts:
                log(f"tune: {args.tune_file} was benched at {tune.threads_text(data.thread_counts)}; "
                    f"times at {llm.n_threads()} are estimated between them")
            benched = data.m_values[-1]
            if m_max > benched:
                m_max_flag = (m_max - 1).bit_length()
                hint = (f"ggml-tune --m-max {m_max_flag} benches them" if m_max_flag <= 12
                        else "ggml-tune benches up to --m-max 12, M=4096")
                log(f"tune: {args.tune_file} was benched up to M={benched}; batches of up to "
                    f"{m_max} tokens are estimated past it ({hint})")
        except tune.TuneFileError as exc:
            log(f"tune: {exc}; using the fallback rule")


def serving_rank():
    """Whether this process is a rank other than 0 of an mpiexec launch (with --tp it
    computes its share of rank 0's steps and prints nothing)."""
    comm = world()
    return comm is not None and comm.Get_rank() > 0


def open_llama(model, n_ctx=None, ctx_default=DEFAULT_N_CTX, use_mmap=True, pool_contexts=None,
               tp=False, tp_log=False, **kwargs):
    """Llama(model, **kwargs) with the context of -c (n_ctx) by the one rule
    (model.config.context_size, with the program's default), the file read once; and the
    messages of its TrainingContextWarnings (a context longer than the model's training
    context), ModelFileWarnings (a file others may change under its mapping) and
    TokenizerWarnings (a vocabulary llama.cpp reads with a warning too), for the
    program to log as llama.cpp does; other warnings are shown as Python shows them.
    pool_contexts: the KV pool holds this many contexts of the rule's size when -c is not
    given (-c is the whole pool, as llama.cpp's); the program then bounds each sequence's
    context itself, so a pool past the training context is not warned about.

    tp (--tp): under mpiexec with more than one process, the model is split over them;
    only rank 0 returns (the others serve its steps and then end the process; tp_log,
    --tp-log: they say on stderr what they hold and how long they served)."""
    comm = world() if tp else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TrainingContextWarning)
        warnings.simplefilter("always", ModelFileWarning)
        warnings.simplefilter("always", TokenizerWarning)
        try:
            f = GGUFModelFile(model, use_mmap=use_mmap)
            given = n_ctx
            n_ctx = context_size(n_ctx, LlamaConfig.from_gguf(f).n_ctx_train, f,
                                 default=ctx_default)
        except BaseException as exc:     # (a file missing on one host: every rank hears)
            if comm is None:
                raise
            join_start(comm, exc)
        if comm is not None:
            join_start(comm)
        if pool_contexts is not None and given is None:
            n_ctx *= pool_contexts
        llm = Llama(f, n_ctx=n_ctx, comm=comm, **kwargs)
    copies = copies_warning(llm)
    if llm.rank > 0:
        if copies:
            rank_line(f"rank {llm.rank}: warning: {copies}")
        serve_and_exit(llm, log=tp_log)
    if pool_contexts is not None:
        caught = [w for w in caught if not issubclass(w.category, TrainingContextWarning)]
    messages = []
    if tp and comm is None:
        messages.append("--tp: one process (mpiexec -n N starts N processes to split the model "
                        "over)")
    elif not tp and mpiexec_size() > 1:
        messages.append(f"started by mpiexec with {mpiexec_size()} processes but without --tp: "
                        f"each runs the whole model alone")
    if copies:
        messages.append(f"rank 0 {copies}")
    for w in caught:
        if issubclass(w.category, (TrainingContextWarning, ModelFileWarning, TokenizerWarning)):
            messages.append(str(w.message))
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return llm, messages


def copies_warning(llm):
    """The warning ("holds ...") of a split model's rank that holds weights as F32 copies
    of its columns (their blocks straddle its share: dist/shard.py), whose logits then
    differ from one process's by more than rounding; None where it holds none (or the
    model is whole)."""
    copies = getattr(llm.model, "copies", ())
    if llm.comm is None or not copies:
        return None
    return (f"holds {', '.join(copies)} as F32 copies of its columns (the split falls inside "
            f"their blocks): the logits differ from one process's by more than rounding")


def run(prog, main, argv=None):
    """Run main(argv); a bad model file or input, or one too large for memory,
    ends in one line and exit 1; Ctrl-C (wherever main does not handle it itself:
    loading, tokenizing, writing) in "<prog>: interrupted" and exit 130."""
    # as llama.cpp's programs, Ctrl-C (SIGINT) stops them even when they were started with
    # it ignored (a background job of a script), where Python leaves it ignored; a caller's
    # own handler is left alone, and the ignoring put back at the end
    ignored = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return main(argv)
    except BrokenPipeError:
        raise   # for console_script
    except KeyboardInterrupt:
        sys.stdout.flush()
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except (ModelLoadError, ValueError, OSError, MemoryError) as e:
        sys.stdout.flush()
        rank_line(f"{prog}: error: {e}")     # (every rank of a split model may say it at once)
        return 1
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
