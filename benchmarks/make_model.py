"""Write a llama GGUF with random weights, shaped like a real model, for benchmarks.

    python benchmarks/make_model.py tinyllama-f16.gguf --shape tinyllama --type F16
    python benchmarks/make_model.py small.gguf --shape 256x4 --type F32
    ggml-bench model -m tinyllama-f16.gguf -p 512 -n 128 -t 1,2

Shapes: `tinyllama` (TinyLlama 1.1B: 2048 wide, 22 layers, 32 heads, 4 KV heads,
FFN 5632, 32000 tokens) or `WIDTHxLAYERS` (head size 64, FFN ~2.7x, MHA).
Types: F32, F16, BF16, or a quantized type with a matrix-product kernel (Q8_0,
Q4_0, Q4_K, ...: what gg.Llama loads; not Q8_K, an activation-only type). Quantized
matrices are written by ggml_py's own reference quantizers (ggml_py.core.quants), not the
`gguf` package's. The vocabulary is llama.cpp's SentencePiece test vocabulary
(tests/data), so prompts tokenize like LLaMA 2's.
"""
import argparse
import os
import sys
import time

from ggml_py.cli.common import ArgumentParser, run, weight_type
from ggml_py.tools.random_model import RandomLlamaSpec, spm_vocab_from_gguf, write_random_llama

VOCAB = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "ggml-vocab-llama-spm.gguf")


MIN_VOCAB = 259      # <unk> <s> </s> and the 256 byte tokens (llama.cpp aborts on fewer)
MAX_VOCAB = 32000    # the test vocabulary's size


def shape_flag(text):
    """--shape: "tinyllama", or (width, layers) of WIDTHxLAYERS."""
    if text == "tinyllama":
        return text
    try:
        width, layers = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"tinyllama or WIDTHxLAYERS, got {text!r}") from None
    if width < 64 or width % 64 or layers < 1:
        raise argparse.ArgumentTypeError(f"{text}: the width must be a multiple of 64 (heads "
                                         f"of 64), the layers at least 1")
    return width, layers


def vocab_size(text):
    """--n-vocab: MIN_VOCAB .. MAX_VOCAB tokens."""
    value = int(text)
    if not MIN_VOCAB <= value <= MAX_VOCAB:
        raise argparse.ArgumentTypeError(f"must be in {MIN_VOCAB}..{MAX_VOCAB} (the special "
                                         f"and byte tokens .. the test vocabulary), got {value}")
    return value


def spec_for(shape, weight_type, n_vocab):
    """The RandomLlamaSpec of a parsed --shape; ValueError when the type cannot hold it."""
    if shape == "tinyllama":
        return RandomLlamaSpec(n_vocab=n_vocab, n_embd=2048, n_layer=22, n_head=32, n_head_kv=4,
                               n_ff=5632, n_ctx_train=2048, weight_type=weight_type.name)
    width, layers = shape
    n_ff = (int(width * 8 / 3) + 31) // 32 * 32
    return RandomLlamaSpec(n_vocab=n_vocab, n_embd=width, n_layer=layers, n_head=max(1, width // 64),
                           n_head_kv=max(1, width // 64), n_ff=n_ff, n_ctx_train=2048,
                           weight_type=weight_type.name)


def main(argv=None):
    parser = ArgumentParser(prog="make_model.py", description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--shape", type=shape_flag, default="tinyllama", help="tinyllama or WIDTHxLAYERS")
    parser.add_argument("--type", type=weight_type, default="F16", help="weight type of the matrices")
    parser.add_argument("--n-vocab", type=vocab_size, default=MAX_VOCAB,
                        help=f"{MIN_VOCAB} .. {MAX_VOCAB} (default)")
    args = parser.parse_args(argv)
    try:
        spec = spec_for(args.shape, args.type, args.n_vocab)
    except ValueError as e:        # e.g. a K type on an FFN width 256 does not divide
        parser.error(f"--shape / --type: {e}")
    t0 = time.perf_counter()
    write_random_llama(args.path, spec, vocab=spm_vocab_from_gguf(VOCAB, args.n_vocab))
    size = os.path.getsize(args.path)
    print(f"{args.path}: {spec.n_layer} layers x {spec.n_embd}, {args.type.name}, "
          f"{size / 2**20:.1f} MiB in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    sys.exit(run("make_model.py", main))
