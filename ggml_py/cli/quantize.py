"""ggml-quantize: re-type the weights of a llama GGUF file with ggml_py's own
quantizers, in llama.cpp's type mixes (the work: ggml_py.tools.quantize).

    ggml-quantize model-f32.gguf model-q4_k_m.gguf Q4_K_M
    python -m ggml_py.cli.quantize IN OUT TYPE     # the same
"""
import argparse
import sys
import time

from ggml_py.cli.common import ArgumentParser, console_script, run
from ggml_py.tools.quantize import HELP_MIXES, TARGETS, quantize_file, unknown_type


def target_type(text):
    """The TYPE argument: a name of TARGETS (any case), kept as given."""
    if text.upper() not in TARGETS:
        raise argparse.ArgumentTypeError(unknown_type(text))
    return text


@console_script
def main(argv=None):
    """Entry point of the ggml-quantize console script."""
    p = ArgumentParser(
        prog="ggml-quantize", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Quantize a llama GGUF file with ggml_py's quantizers, in llama.cpp's mixes.",
        epilog=HELP_MIXES)
    p.add_argument("input")
    p.add_argument("output", help="a new path (not the input); written whole or not at all")
    p.add_argument("type", type=target_type, help="one of " + ", ".join(TARGETS))
    p.add_argument("--allow-requantize", action="store_true",
                   help="re-encode quantized weights into another type (lossy; llama.cpp's flag)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    # a bad input or an unwritable output (QuantizeError, OSError) ends in one line and
    # status 1, Ctrl-C in status 130 (the output is written whole or not at all)
    return run("ggml-quantize", quantize_command, args)


def quantize_command(args):
    """ggml-quantize's work, once its flags are parsed."""
    start = time.perf_counter()
    quantize_file(args.input, args.output, args.type, progress=not args.quiet,
                  allow_requantize=args.allow_requantize)
    print(f"ggml-quantize: done in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
