"""Tiny random llama GGUF files for the tests, written once per test process.

The vocabulary is the first 512 tokens of llama.cpp's SentencePiece test vocab
(tests/data/ggml-vocab-llama-spm.gguf): real byte fallback and merges, but a
small output matrix.
"""
import atexit
import functools
import os
import shutil
import struct
import tempfile

import gguf
import numpy as np

from ggml_py.core.profiles import task_profiles
from ggml_py.core.types import Op
from ggml_py.tools.random_model import RandomLlamaSpec, spm_vocab_from_gguf, write_random_llama

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
    "q5_k": RandomLlamaSpec(n_vocab=N_VOCAB, n_embd=256, n_head=4, n_head_kv=2, n_ff=512,
                            weight_type="Q5_K", seed=7),
    "q6_k": RandomLlamaSpec(n_vocab=N_VOCAB, n_embd=256, n_head=4, n_head_kv=2, n_ff=512,
                            weight_type="Q6_K", seed=8),
    # heads not n_embd / n_head wide (attention.key_length, as Mistral Nemo): Q is 4 x 24
    "heads": RandomLlamaSpec(n_vocab=N_VOCAB, head_dim=24, seed=6),
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


# the optional biases llama.cpp loads for LLM_ARCH_LLAMA, with their lengths in a
# default-shaped RandomLlamaSpec (E 64, H*D 64, Hkv*D 32, F 160)
BIASES = {"attn_q": 64, "attn_k": 32, "attn_v": 32, "attn_output": 64,
          "ffn_gate": 160, "ffn_up": 160, "ffn_down": 64}


@functools.lru_cache(maxsize=None)
def biased_model_path(names=tuple(BIASES)):
    """model_path("f32") plus random F32 bias tensors blk.N.{name}.bias for `names`."""
    rng = np.random.default_rng(7)

    def add_biases(tensors):
        n_layer = SPECS["f32"].n_layer
        return tensors + [[f"blk.{il}.{name}.bias", [BIASES[name]], 0,
                           rng.normal(0, 0.5, BIASES[name]).astype(np.float32).tobytes()]
                          for il in range(n_layer) for name in names]
    return edited_model(f"tiny-bias-{len(names)}.gguf", tensors=add_biases)


# ---- raw GGUF files, for bad ones ------------------------------------------------

V = gguf.GGUFValueType
_CODES = {V.UINT8: "B", V.INT8: "b", V.UINT16: "H", V.INT16: "h", V.UINT32: "I", V.INT32: "i",
          V.FLOAT32: "f", V.BOOL: "?", V.UINT64: "Q", V.INT64: "q", V.FLOAT64: "d"}


def gguf_parts(path):
    """(kvs, tensors) of a GGUF file: kvs [(key, types, value)], types [T] or
    [ARRAY, T]; tensors [[name, ne (ggml order), type id, data bytes]]."""
    reader = gguf.GGUFReader(path)
    kvs = [(k, list(f.types), f.contents()) for k, f in reader.fields.items()
           if not k.startswith("GGUF.")]
    tensors = [[t.name, [int(d) for d in t.shape], int(t.tensor_type), t.data.tobytes()]
               for t in reader.tensors]
    return kvs, tensors


def _value_bytes(t, value, order="<"):
    if t == V.STRING:
        data = value.encode() if isinstance(value, str) else bytes(value)
        return struct.pack(order + "Q", len(data)) + data
    return struct.pack(order + _CODES[t], value)


def gguf_bytes(kvs, tensors, offsets=None, alignment=32, order="<"):
    """A GGUF v3 file, written byte by byte (nothing checked): kvs and tensors as
    gguf_parts gives them; offsets: the offset written for each tensor (None: the
    usual running, aligned one), its data stays where it would be anyway; order:
    the byte order of the header ('>': big-endian; the tensor data stays as given)."""
    out = [b"GGUF", struct.pack(order + "IQQ", 3, len(tensors), len(kvs))]
    for key, types, value in kvs:
        out += [_value_bytes(V.STRING, key, order), struct.pack(order + "I", types[0])]
        if types[0] == V.ARRAY:
            out.append(struct.pack(order + "IQ", types[1], len(value)))
            out += [_value_bytes(types[1], v, order) for v in value]
        else:
            out.append(_value_bytes(types[0], value, order))
    data, natural = b"", []
    for name, ne, type_id, raw in tensors:
        natural.append(len(data))
        data += raw + b"\0" * (-len(raw) % alignment)
    for (name, ne, type_id, raw), offset in zip(tensors, offsets or natural):
        out += [_value_bytes(V.STRING, name, order),
                struct.pack(f"{order}I{len(ne)}Q", len(ne), *ne),
                struct.pack(order + "IQ", type_id, offset)]
    header = b"".join(out)
    return header + b"\0" * (-len(header) % alignment) + data


def edited_model(name, kind="f32", keys=None, tensors=None, **layout):
    """A copy of model_path(kind) with metadata `keys` ({key: (types, value)}; None
    removes the key) and `tensors(list)` edited; layout: gguf_bytes' offsets, alignment, order."""
    kvs, parts = gguf_parts(model_path(kind))
    for key, typed in (keys or {}).items():
        kvs = [kv for kv in kvs if kv[0] != key] + ([(key, *typed)] if typed else [])
    if tensors is not None:
        parts = tensors(parts)
    path = scratch_path(name)
    with open(path, "wb") as f:
        f.write(gguf_bytes(kvs, parts, **layout))
    return path


TEXT = open(os.path.join(DATA, "ggml-vocab-llama-spm.gguf.inp"), encoding="utf-8").read()


class GgmlRule:
    """Schedule data (what the planner asks `estimates` of) for ggml's rule: blas-mt from
    32 rows, the CPU kernels below."""

    def estimates(self, n, k, type, m, n_threads):
        name = "blas-mt" if m >= 32 else "cpu"
        return [(1.0, p) for p in task_profiles(Op.MUL_MAT, type) if p.name == name]
