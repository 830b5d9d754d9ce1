"""ggml-convert: a Hugging Face-style llama checkpoint directory -> GGUF (the work:
ggml_py.tools.convert).

    ggml-convert MODEL_DIR [--outfile OUT.gguf] [--outtype f32|f16|bf16]
"""
import sys

from ggml_py.cli.common import ArgumentParser, console_script, run
from ggml_py.tools.convert import OUTTYPES, convert


@console_script
def main(argv: list[str] | None = None) -> int:
    """Entry point of ggml-convert; returns the exit status (1 on a bad input)."""
    parser = ArgumentParser(
        prog="ggml-convert",
        description="Convert a Hugging Face-style llama checkpoint directory to GGUF.")
    parser.add_argument("model", help="directory with config.json, weights and tokenizer")
    parser.add_argument("--outfile", help="output path (default: MODEL/<name>-<outtype>.gguf)")
    parser.add_argument("--outtype", default="f16", type=str.lower, choices=OUTTYPES,
                        help="f32, f16 (default) or bf16; 1-D tensors stay f32")
    parser.add_argument("--vocab-only", action="store_true",
                        help="write the metadata and tokenizer only (no tensors)")
    args = parser.parse_args(argv)
    # a bad checkpoint (ConvertError) or an unwritable output ends in one line and status 1,
    # Ctrl-C in status 130
    return run("ggml-convert", convert_command, args)


def convert_command(args) -> int:
    """ggml-convert's work, once its flags are parsed."""
    convert(args.model, args.outfile, args.outtype, vocab_only=args.vocab_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
