"""Write a llama GGUF with random weights, shaped like a real model, for benchmarks.

    python benchmarks/make_model.py tinyllama-f16.gguf --shape tinyllama --type F16
    python benchmarks/make_model.py small.gguf --shape 256x4 --type F32
    ggml-bench model -m tinyllama-f16.gguf -p 512 -n 128 -t 1,2

Shapes: `tinyllama` (TinyLlama 1.1B: 2048 wide, 22 layers, 32 heads, 4 KV heads,
FFN 5632, 32000 tokens) or `WIDTHxLAYERS` (head size 64, FFN ~2.7x, MHA).
Types: F32, F16, BF16, or a quantized type with a matrix-product kernel (Q8_0,
Q4_0, Q4_K, ...: what gg.Llama loads; not Q8_K, an activation-only type). Quantized
matrices are written by ggml_py's own reference quantizers (ggml_py.quants), not the
`gguf` package's. The vocabulary is llama.cpp's SentencePiece test vocabulary
(tests/data), so prompts tokenize like LLaMA 2's.
"""
import os
import sys
import time

import ggml_py as gg
from ggml_py.cli.common import ArgumentParser, positive_int, run
from ggml_py.random_model import RandomLlamaSpec, spm_vocab_from_gguf, write_random_llama
from ggml_py.tune_bench import weight_type as weight_type_or_error

VOCAB = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "ggml-vocab-llama-spm.gguf")


def spec_for(shape, weight_type, n_vocab):
    """The RandomLlamaSpec of --shape (tinyllama or WIDTHxLAYERS); ValueError for a bad one."""
    if weight_type not in gg.Type.__members__:
        raise ValueError(f"unknown --type {weight_type!r}")
    weight_type_or_error(gg.Type[weight_type], "--type")   # e.g. Q8_K: no matrix product
    if shape == "tinyllama":
        return RandomLlamaSpec(n_vocab=n_vocab, n_embd=2048, n_layer=22, n_head=32, n_head_kv=4,
                               n_ff=5632, n_ctx_train=2048, weight_type=weight_type)
    try:
        width, layers = (int(v) for v in shape.lower().split("x"))
    except ValueError:
        raise ValueError(f"--shape must be tinyllama or WIDTHxLAYERS, got {shape!r}") from None
    if width < 64 or width % 64 or layers < 1:
        raise ValueError(f"--shape {shape}: the width must be a multiple of 64 (heads of 64), "
                         f"the layers at least 1")
    gg.row_bytes(gg.Type[weight_type], width)     # ValueError: rows the type's blocks do not fill
    n_ff = (int(width * 8 / 3) + 31) // 32 * 32
    return RandomLlamaSpec(n_vocab=n_vocab, n_embd=width, n_layer=layers, n_head=max(1, width // 64),
                           n_head_kv=max(1, width // 64), n_ff=n_ff, n_ctx_train=2048,
                           weight_type=weight_type)


def main(argv=None):
    parser = ArgumentParser(prog="make_model.py", description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--shape", default="tinyllama", help="tinyllama or WIDTHxLAYERS")
    parser.add_argument("--type", default="F16", help="weight type of the matrices")
    parser.add_argument("--n-vocab", type=positive_int, default=32000,
                        help="at most the test vocabulary's 32000")
    args = parser.parse_args(argv)
    spec = spec_for(args.shape, args.type.upper(), args.n_vocab)
    t0 = time.perf_counter()
    write_random_llama(args.path, spec, vocab=spm_vocab_from_gguf(VOCAB, args.n_vocab))
    size = os.path.getsize(args.path)
    print(f"{args.path}: {spec.n_layer} layers x {spec.n_embd}, {args.type}, "
          f"{size / 2**20:.1f} MiB in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    sys.exit(run("make_model.py", main))
