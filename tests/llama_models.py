"""Tiny random llama GGUF files for the tests, written once per test process.

The vocabulary is the first 512 tokens of llama.cpp's SentencePiece test vocab
(tests/data/ggml-vocab-llama-spm.gguf): real byte fallback and merges, but a
small output matrix.
"""
import atexit
import functools
import os
import shutil
import tempfile

from ggml_py.random_model import RandomLlamaSpec, spm_vocab_from_gguf, write_random_llama

DATA = os.path.join(os.path.dirname(__file__), "data")
SPM_VOCAB = os.path.join(DATA, "ggml-vocab-llama-spm.gguf")
N_VOCAB = 512

_dir = tempfile.mkdtemp(prefix="ggml_py_llama_")
atexit.register(shutil.rmtree, _dir, ignore_errors=True)

SPECS = {
    "f32": RandomLlamaSpec(n_vocab=N_VOCAB),
    "f16": RandomLlamaSpec(n_vocab=N_VOCAB, weight_type="F16", seed=1),
    # GQA with one KV head, tied output, Llama 3.1-style rope_freqs, linear rope scaling
    "variant": RandomLlamaSpec(n_vocab=N_VOCAB, n_head_kv=1, tied_output=True, rope_freqs=True,
                               rope_scale_linear=2.0, rope_freq_base=50000.0, seed=2),
    # quantized matrices (activations meet them as Q8_0 / Q8_K, as in ggml)
    "q8_0": RandomLlamaSpec(n_vocab=N_VOCAB, weight_type="Q8_0", seed=3),
    "q4_0": RandomLlamaSpec(n_vocab=N_VOCAB, weight_type="Q4_0", seed=4),
    "q4_k": RandomLlamaSpec(n_vocab=N_VOCAB, n_embd=256, n_head=4, n_head_kv=2, n_ff=512,
                            weight_type="Q4_K", seed=5),
}


@functools.lru_cache(maxsize=None)
def vocab():
    return spm_vocab_from_gguf(SPM_VOCAB, N_VOCAB)


@functools.lru_cache(maxsize=None)
def model_path(kind="f32"):
    """Path of a tiny model file of the given kind (see SPECS)."""
    path = os.path.join(_dir, f"tiny-{kind}.gguf")
    write_random_llama(path, SPECS[kind], vocab=vocab())
    return path


def scratch_path(name):
    """A path in the tests' temporary folder."""
    return os.path.join(_dir, name)


TEXT = open(os.path.join(DATA, "ggml-vocab-llama-spm.gguf.inp"), encoding="utf-8").read()
