"""What the command-line programs share: one-line errors, model loading, flags."""
import argparse
import functools
import os
import sys

from ggml_py.gguf_model import ModelLoadError


def console_script(main):
    """Wrap a console script's entry point: when the reader of its output goes
    away (`ggml-tune analyze F | head`), it stops quietly with exit status 141,
    as a program killed by SIGPIPE does, instead of reporting an error."""
    @functools.wraps(main)
    def entry(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except BrokenPipeError:
            # the interpreter flushes stdout at exit: let that flush go nowhere
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
    return entry


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (no usage dump) and exits 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def thread_count(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"thread count must be at least 1, got {value}")
    return value


def add_model_arguments(parser, ctx_default):
    """Flags every program has, with llama.cpp's names."""
    parser.add_argument("-m", "--model", default=None, metavar="FNAME",
                        help="model path (a llama-architecture GGUF file; default: the bundled "
                             "Shakespeare model)")
    parser.add_argument("-t", "--threads", type=thread_count, default=None, metavar="N",
                        help="threads (default: physical cores)")
    parser.add_argument("-c", "--ctx-size", type=int, default=None, metavar="N",
                        help=f"context size in tokens (default: {ctx_default}, or the model's "
                             f"training context when that is smaller; 0 = from model)")
    parser.set_defaults(ctx_default=ctx_default)
    parser.add_argument("-b", "--batch-size", type=positive_int, default=512, metavar="N",
                        help="most tokens evaluated at once (default: 512)")
    parser.add_argument("-ctk", "--cache-type-k", choices=("f16", "f32"), default="f16",
                        help="KV cache type for K (default: f16)")
    parser.add_argument("-ctv", "--cache-type-v", choices=("f16", "f32"), default=None,
                        help="KV cache type for V (default: as K; must equal K)")
    parser.add_argument("--tune", action="store_true",
                        help="bench the model's matrix shapes at start-up and schedule MUL_MAT "
                             "profiles with the results (with --tune-file: bench, save, exit)")
    parser.add_argument("--tune-file", metavar="FNAME",
                        help="load MUL_MAT tune data (ggml-tune) to schedule with; with --tune, "
                             "write it there and exit")


def setup_tune(llm, args, log):
    """Apply --tune / --tune-file to a loaded Llama. Returns True when the program
    should exit now (--tune with --tune-file: bench, save, done).

    A tune file that cannot be used (corrupt, another CPU, model or version) is
    reported in one line and the run goes on with ggml's fallback rule.
    """
    import time

    from ggml_py import tune
    from ggml_py.tune_bench import bench, model_shapes
    if args.tune:
        name, shapes = model_shapes(llm.model.file)
        m_values = [2 ** i for i in range(max(args.batch_size - 1, 1).bit_length() + 1)]
        start = time.perf_counter()
        data = bench(shapes, model=name, m_values=m_values, thread_counts=[llm.n_threads()])
        log(f"tune: benched {len(shapes)} shapes x {len(m_values)} M at {llm.n_threads()} threads "
            f"in {time.perf_counter() - start:.1f} s")
        if args.tune_file:
            data.save(args.tune_file)
            log(f"tune: saved {args.tune_file}")
            return True
        llm.set_tune(data)
    elif args.tune_file:
        try:
            llm.set_tune(args.tune_file)
            log(f"tune: scheduling MUL_MAT profiles with {args.tune_file}")
        except tune.TuneFileError as exc:
            log(f"tune: {exc}; using the fallback rule")
    return False


def resolve_ctx_size(args):
    """-c as given, else the program's default capped at the model's training context."""
    if args.ctx_size is None:
        from ggml_py.gguf_model import GGUFModelFile
        from ggml_py.llama import LlamaConfig
        n_ctx_train = LlamaConfig.from_gguf(GGUFModelFile(args.model)).n_ctx_train
        args.ctx_size = min(args.ctx_default, n_ctx_train)
    return args.ctx_size


def kv_type(parser, args):
    if args.cache_type_v is not None and args.cache_type_v != args.cache_type_k:
        parser.error("the K and V cache types must be the same (-ctk / -ctv)")
    return args.cache_type_k


def run(prog, main, argv=None):
    """Run main(argv); a bad model file or input ends in one line and exit 1."""
    try:
        return main(argv)
    except BrokenPipeError:
        raise   # for console_script
    except (ModelLoadError, ValueError, OSError) as e:
        sys.stdout.flush()
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
