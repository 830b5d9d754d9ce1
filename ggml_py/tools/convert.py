"""ggml-convert: a Hugging Face-style llama checkpoint directory -> GGUF.

    ggml-convert MODEL_DIR [--outfile OUT.gguf] [--outtype f32|f16|bf16]

The directory holds ``config.json`` (a class of LLAMA_CLASSES), the weights
(``*.safetensors``, or ``pytorch_model.bin`` which needs PyTorch) and the
tokenizer (``tokenizer.model`` from SentencePiece, or ``tokenizer.json``).
Tensors and metadata get llama.cpp's names, so llama.cpp and ggml_py load the
result alike.

RoPE pairing. Hugging Face's llama rotates the two *halves* of each head
(``x[i]`` with ``x[i + d/2]``); llama.cpp's "normal" rope rotates *adjacent*
pairs (``x[2i]`` with ``x[2i+1]``). A standard HF checkpoint therefore has its
q and k rows permuted back per head (row ``2i`` <- ``i``, ``2i+1`` <- ``i+d/2``),
as llama.cpp's converter does. A checkpoint whose ``config.json`` says
``"rope_pairing": "adjacent"`` (the ones ``training/train.py`` writes) is already
in llama.cpp's order and is written unchanged.

Neither ``safetensors`` nor ``sentencepiece`` is needed: both formats are read
here with numpy and a small protobuf reader. Nor is ``transformers``: a byte-level
BPE ``tokenizer.json``'s pre-tokenizer is named (``tokenizer.ggml.pre``) from its
regexes, not from the HF tokenizer's output as llama.cpp does, and special tokens
are read with gguf's ``SpecialVocab`` as llama.cpp's converter reads them.

The weights are memory-mapped while the GGUF is written, so the output is written
to a temporary file and renamed into place when complete, and an output that is
one of the checkpoint's files is refused.
"""

from __future__ import annotations

import json
import logging
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ggml_py.files.gguf_writer import write_streamed
from ggml_py.files.output import OutputPathError, atomic_output, check_output_path
from ggml_py.tokenizer.pretokenize import CONTRACTIONS_ANY_CASE, RE_GPT2, PRE_TOKENIZERS


class ConvertError(ValueError):
    """A bad input; ``main`` prints it as one line and exits non-zero."""


OUTTYPES = ("f32", "f16", "bf16")
# Hugging Face classes of the llama architecture (llama.cpp converts Mistral's as llama too:
# the same weights and graph; its sliding window, which llama.cpp's llama graph does not apply,
# is not written either)
LLAMA_CLASSES = ("LlamaForCausalLM", "LLaMAForCausalLM", "MistralForCausalLM")
LLAMA_MODEL_TYPES = ("llama", "mistral")


# ----------------------------------------------------------------------------- config

@dataclass(frozen=True)
class LlamaParams:
    """The model's hyper-parameters, read and checked from config.json (see read_config)."""
    n_vocab: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ctx: int
    rms_eps: float
    rope_theta: float
    rope_dim: int
    tied: bool
    adjacent_rope: bool
    rope_scaling_linear: float | None
    attention_bias: bool    # q/k/v/o projections have biases (blk.N.attn_*.bias)
    mlp_bias: bool          # gate/up/down projections have biases (blk.N.ffn_*.bias)


def _positive_int(cfg: dict, key: str, path: Path, default: int | None = None) -> int:
    """config.json's `key` as a positive int (4096.0 is taken as 4096); `default`
    when absent or null, an error when absent without one."""
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise ConvertError(f"{path}: missing key {key!r}")
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConvertError(f"{path}: {key} is {value!r}, not a positive integer")
    if value >= 2**31:      # GGUF stores these as 32-bit integers
        raise ConvertError(f"{path}: {key} is {value}, too large")
    return value


def _positive_float(value, what: str, path: Path, default: float | None = None) -> float:
    """A positive, finite number from config.json (`what` names it); `default` for null."""
    if value is None and default is not None:
        return default
    number = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:   # an int beyond float
            pass
    if number is None or not 0 < number < float("inf"):
        raise ConvertError(f"{path}: {what} is {value!r}, not a positive number")
    return number


def _rope_scaling_linear(scaling, key: str, path: Path) -> float | None:
    """The factor of a linear scaling object (config.json's `key`); None without
    scaling (null, empty, or transformers' rope_type "default"); an error for other kinds."""
    if scaling is None or scaling == {}:
        return None
    if not isinstance(scaling, dict):
        raise ConvertError(f"{path}: {key} is {scaling!r}, not an object "
                           '(like {"type": "linear", "factor": 2.0})')
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "default":
        return None
    if kind != "linear":
        raise ConvertError(f"{path}: {key} type {kind!r} is not supported (only 'linear')")
    if "factor" not in scaling:
        raise ConvertError(f"{path}: {key} has no factor")
    return _positive_float(scaling["factor"], f"{key} factor", path)


def _rope_config(cfg: dict, path: Path) -> tuple[float, float | None]:
    """(theta, linear scaling factor or None). transformers >= 5 saves both inside
    `rope_parameters` ({"rope_theta", "rope_type", "factor", ...}); older configs as
    top-level `rope_theta` and `rope_scaling`. rope_parameters wins, key by key."""
    params = cfg.get("rope_parameters")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ConvertError(f"{path}: rope_parameters is {params!r}, not an object")
    if params.get("rope_theta") is not None:
        theta = _positive_float(params["rope_theta"], "rope_parameters rope_theta", path)
    else:
        theta = _positive_float(cfg.get("rope_theta"), "rope_theta", path, default=10000.0)
    if "rope_type" in params or "type" in params:
        return theta, _rope_scaling_linear(params, "rope_parameters", path)
    return theta, _rope_scaling_linear(cfg.get("rope_scaling"), "rope_scaling", path)


def _flag(cfg: dict, key: str, path: Path) -> bool:
    """An optional boolean of config.json (absent or null: False)."""
    value = cfg.get(key)
    value = False if value is None else value
    if not isinstance(value, bool):
        raise ConvertError(f"{path}: {key} is {value!r}, not true or false")
    return value


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConvertError(f"{path}: not valid JSON ({e})") from None


def _json_object(path: Path) -> dict:
    """A JSON file that must hold an object (config.json, tokenizer_config.json, ...)."""
    value = _read_json(path)
    if not isinstance(value, dict):
        raise ConvertError(f"{path}: not a JSON object")
    return value


def read_config(model_dir: Path) -> LlamaParams:
    """config.json -> LlamaParams; every value checked, errors name the key. (The special
    token ids in it are read with the tokenizer: see read_vocab.)"""
    path = model_dir / "config.json"
    if not path.is_file():
        raise ConvertError(f"{model_dir}: no config.json")
    cfg = _json_object(path)
    archs = cfg.get("architectures")
    archs = [] if archs is None else archs
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ConvertError(f"{path}: architectures is {archs!r}, not a list of class names")
    model_type = cfg.get("model_type")
    # the first class names the model, as llama.cpp's converter reads it; model_type only
    # where there is none
    is_llama = archs[0] in LLAMA_CLASSES if archs else model_type in LLAMA_MODEL_TYPES
    if not is_llama:
        found = ", ".join(archs) or (model_type if isinstance(model_type, str) else "") or "none given"
        raise ConvertError(f"{path}: not a llama model (architectures: {found}); only "
                           f"{', '.join(LLAMA_CLASSES)} (one architecture) are supported")
    n_embd = _positive_int(cfg, "hidden_size", path)
    n_head = _positive_int(cfg, "num_attention_heads", path)
    n_head_kv = _positive_int(cfg, "num_key_value_heads", path, default=n_head)
    if cfg.get("head_dim") is None and n_embd % n_head:
        raise ConvertError(f"{path}: hidden_size {n_embd} is not a multiple of "
                           f"num_attention_heads {n_head}")
    head_dim = _positive_int(cfg, "head_dim", path, default=n_embd // n_head)
    if head_dim % 2:
        raise ConvertError(f"{path}: the head size {head_dim} is odd (RoPE rotates pairs)")
    if n_head % n_head_kv:
        raise ConvertError(f"{path}: num_attention_heads {n_head} is not a multiple of "
                           f"num_key_value_heads {n_head_kv}")
    pairing = cfg.get("rope_pairing", "half")
    if pairing not in ("half", "adjacent"):
        raise ConvertError(f"{path}: rope_pairing must be 'half' or 'adjacent', not {pairing!r}")
    tied = _flag(cfg, "tie_word_embeddings", path)
    rope_theta, rope_scaling_linear = _rope_config(cfg, path)
    return LlamaParams(
        n_vocab=_positive_int(cfg, "vocab_size", path), n_embd=n_embd,
        n_ff=_positive_int(cfg, "intermediate_size", path),
        n_layer=_positive_int(cfg, "num_hidden_layers", path), n_head=n_head, n_head_kv=n_head_kv,
        n_ctx=_positive_int(cfg, "max_position_embeddings", path, default=2048),
        rms_eps=_positive_float(cfg.get("rms_norm_eps"), "rms_norm_eps", path, default=1e-6),
        rope_theta=rope_theta, rope_dim=head_dim, tied=tied, adjacent_rope=pairing == "adjacent",
        rope_scaling_linear=rope_scaling_linear,
        attention_bias=_flag(cfg, "attention_bias", path), mlp_bias=_flag(cfg, "mlp_bias", path))


# ----------------------------------------------------------------------------- weights

_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
              "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
              "BOOL": np.bool_}


def _is_count(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def _safetensors_entry(info) -> tuple:
    """(numpy dtype, begin, end, shape) of a header entry; (None, ...) when malformed:
    an unknown dtype, offsets that are not two counts in order, a shape not of counts."""
    bad = (None, 0, 0, ())
    if not isinstance(info, dict):
        return bad
    dtype = _ST_DTYPES.get(info.get("dtype")) if isinstance(info.get("dtype"), str) else None
    offsets, shape = info.get("data_offsets"), info.get("shape")
    if (dtype is None or not isinstance(offsets, list) or len(offsets) != 2
            or not all(map(_is_count, offsets)) or offsets[0] > offsets[1]
            or not isinstance(shape, list) or not all(map(_is_count, shape))):
        return bad
    return dtype, offsets[0], offsets[1], tuple(shape)


@dataclass(frozen=True)
class CheckpointTensor:
    """A checkpoint's tensor, read when its values are needed, so that a conversion holds
    one tensor in memory at a time: its numpy-order shape now, float32 values from load()."""
    shape: tuple
    load: Callable[[], np.ndarray]

    def then(self, change: Callable[[np.ndarray], np.ndarray]) -> CheckpointTensor:
        """This tensor with `change` applied to its values when they are loaded."""
        return CheckpointTensor(self.shape, lambda: change(self.load()))


def _widened(array: np.ndarray, bf16: bool) -> np.ndarray:
    """float32 values of a stored array (BF16: its uint16 bits widened by a 16-bit shift)."""
    if bf16:
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return np.asarray(array, dtype=np.float32)


def read_safetensors(path: Path) -> Iterator[tuple[str, CheckpointTensor]]:
    """Yield (name, CheckpointTensor) from a .safetensors file (memory-mapped).

    The format is an 8-byte little-endian header length, a JSON header
    ``{name: {"dtype", "shape", "data_offsets": [begin, end]}}`` and the raw
    little-endian bytes; BF16 is widened to F32 by a 16-bit shift.
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            (n_header,) = struct.unpack("<Q", f.read(8) or b"\0" * 8)
            if n_header <= 0 or 8 + n_header > size:
                raise ConvertError(f"{path}: not a safetensors file (bad header length)")
            header = json.loads(f.read(n_header))
    except (json.JSONDecodeError, UnicodeDecodeError, struct.error):
        raise ConvertError(f"{path}: not a safetensors file (bad header)") from None
    if not isinstance(header, dict):
        raise ConvertError(f"{path}: not a safetensors file (the header is not a JSON object)")
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n_header)
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, begin, end, shape = _safetensors_entry(info)
        if dtype is None:
            raise ConvertError(f"{path}: tensor {name!r}: bad entry {info!r}")
        count = math.prod(shape)
        if end - begin != count * np.dtype(dtype).itemsize or end > len(data):
            raise ConvertError(f"{path}: tensor {name!r}: data size does not match its shape")
        array = data[begin:end].view(dtype).reshape(shape)
        yield name, CheckpointTensor(shape, lambda a=array, bf16=info["dtype"] == "BF16":
                                     _widened(a, bf16))


def read_pytorch_bin(path: Path) -> Iterator[tuple[str, CheckpointTensor]]:
    """Yield (name, CheckpointTensor) from a pytorch_model.bin (needs PyTorch; the file
    is loaded whole, its tensors widened to float32 one at a time)."""
    try:
        import torch
    except ImportError:
        raise ConvertError(f"{path}: reading pytorch_model.bin needs PyTorch "
                           "(pip install torch), or convert the checkpoint to safetensors") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a bad file
        raise ConvertError(f"{path}: cannot load ({type(e).__name__}: {e})") from None
    for name, tensor in state.items():
        yield name, CheckpointTensor(tuple(tensor.shape),
                                     lambda t=tensor: t.detach().to(torch.float32).numpy())


# (files, their index, reader), tried in this order
_WEIGHT_FORMATS = (("*.safetensors", "model.safetensors.index.json", read_safetensors),
                   ("pytorch_model*.bin", "pytorch_model.bin.index.json", read_pytorch_bin))


def _read_files(files: list[Path], reader) -> tuple[dict[str, CheckpointTensor], dict[str, Path]]:
    """({HF name: array}, {HF name: its file}) of `files`; a name in two files is an error
    (a stale copy beside the real weights must not win silently)."""
    weights: dict[str, CheckpointTensor] = {}
    source: dict[str, Path] = {}
    for f in files:
        for name, array in reader(f):
            if name in source:
                raise ConvertError(f"tensor {name!r} is in both {source[name].name} and {f.name}; "
                                   "remove the stale file")
            weights[name], source[name] = array, f
    return weights, source


def _read_indexed(index: Path, reader) -> dict[str, CheckpointTensor]:
    """The tensors of a sharded checkpoint: exactly the files the index's weight_map names,
    each tensor in the file it names, and no tensor it does not list."""
    weight_map = _json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise ConvertError(f"{index}: no weight_map of tensor names to file names")
    files = sorted({index.parent / f for f in weight_map.values()})
    for f in files:
        if not f.is_file():
            raise ConvertError(f"{index}: its weight_map names {f.name}, which is missing")
    weights, source = _read_files(files, reader)
    for name, fname in weight_map.items():
        if source.get(name) != index.parent / fname:
            raise ConvertError(f"{index}: tensor {name!r} is not in {fname}, where its weight_map puts it")
    extra = sorted(weights.keys() - weight_map.keys())
    if extra:
        raise ConvertError(f"{index}: tensor {extra[0]!r} of {source[extra[0]].name} is not in its weight_map")
    return weights


def read_weights(model_dir: Path) -> dict[str, CheckpointTensor]:
    """Every tensor of the checkpoint, {HF name: CheckpointTensor}: with an index
    (model.safetensors.index.json) the files it names, else all *.safetensors files;
    else the same for pytorch_model*.bin (pytorch_model.bin.index.json)."""
    for pattern, index_name, reader in _WEIGHT_FORMATS:
        if (model_dir / index_name).is_file():
            return _read_indexed(model_dir / index_name, reader)
        files = sorted(model_dir.glob(pattern))
        if files:
            return _read_files(files, reader)[0]
    raise ConvertError(f"{model_dir}: no weights (*.safetensors or pytorch_model.bin)")


def permute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF half-rotation rows -> llama.cpp adjacent pairs, per head.

    w (n_head * head_dim, n_embd): within a head, row 2i <- row i and
    row 2i+1 <- row i + head_dim/2.
    """
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
# the optional biases (config attention_bias / mlp_bias), as llama.cpp names them
_LAYER_NAMES.update({hf[:-len("weight")] + "bias": gg[:-len("weight")] + "bias"
                     for hf, gg in _LAYER_NAMES.items() if "_proj." in hf})
_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(hf_name: str, n_layer: int) -> str | None:
    """llama.cpp's tensor name for an HF name; None for tensors that are dropped."""
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    if hf_name.endswith("rotary_emb.inv_freq"):
        return None                                   # recomputed from rope_theta
    parts = hf_name.split(".", 3)                     # model, layers, N, rest
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
        if int(parts[2]) < n_layer and parts[3] in _LAYER_NAMES:
            return f"blk.{parts[2]}.{_LAYER_NAMES[parts[3]]}"
    raise ConvertError(f"unexpected tensor {hf_name!r} for a {n_layer}-layer llama")


def expected_shapes(p: LlamaParams) -> dict[str, tuple[int, ...]]:
    """GGUF name -> numpy shape (rows, cols) of every llama tensor, in file order."""
    hd = p.rope_dim
    shapes = {"token_embd.weight": (p.n_vocab, p.n_embd)}
    for i in range(p.n_layer):
        shapes.update({
            f"blk.{i}.attn_norm.weight": (p.n_embd,),
            f"blk.{i}.attn_q.weight": (p.n_head * hd, p.n_embd),
            f"blk.{i}.attn_k.weight": (p.n_head_kv * hd, p.n_embd),
            f"blk.{i}.attn_v.weight": (p.n_head_kv * hd, p.n_embd),
            f"blk.{i}.attn_output.weight": (p.n_embd, p.n_head * hd),
            f"blk.{i}.ffn_norm.weight": (p.n_embd,),
            f"blk.{i}.ffn_gate.weight": (p.n_ff, p.n_embd),
            f"blk.{i}.ffn_up.weight": (p.n_ff, p.n_embd),
            f"blk.{i}.ffn_down.weight": (p.n_embd, p.n_ff),
        })
        if p.attention_bias:
            shapes.update({f"blk.{i}.attn_q.bias": (p.n_head * hd,),
                           f"blk.{i}.attn_k.bias": (p.n_head_kv * hd,),
                           f"blk.{i}.attn_v.bias": (p.n_head_kv * hd,),
                           f"blk.{i}.attn_output.bias": (p.n_embd,)})
        if p.mlp_bias:
            shapes.update({f"blk.{i}.ffn_gate.bias": (p.n_ff,), f"blk.{i}.ffn_up.bias": (p.n_ff,),
                           f"blk.{i}.ffn_down.bias": (p.n_embd,)})
    shapes["output_norm.weight"] = (p.n_embd,)
    if not p.tied:
        shapes["output.weight"] = (p.n_vocab, p.n_embd)
    return shapes


def map_tensors(weights: dict[str, CheckpointTensor], p: LlamaParams) -> dict[str, CheckpointTensor]:
    """HF tensors -> {gguf name: CheckpointTensor} in llama.cpp's order and layout."""
    out: dict[str, CheckpointTensor] = {}
    for hf_name, array in weights.items():
        name = gguf_name(hf_name, p.n_layer)
        if name is not None and not (name == "output.weight" and p.tied):
            out[name] = array
    shapes = expected_shapes(p)
    for name in out:
        if name not in shapes:      # a bias the config does not announce: never drop it
            flag = "mlp_bias" if ".ffn_" in name else "attention_bias"
            raise ConvertError(f"tensor {name} is in the checkpoint but config.json's {flag} "
                               "is not true")
    for name, shape in shapes.items():
        if name not in out:
            hint = (" — a model whose output is its embeddings says \"tie_word_embeddings\": "
                    "true in config.json" if name == "output.weight" else "")
            raise ConvertError(f"missing tensor {name} (HF name of the checkpoint not found){hint}")
        if out[name].shape != shape:
            raise ConvertError(f"tensor {name}: shape {out[name].shape}, expected {shape}")
    # only now that the shapes are right: the q, k biases are rows of the projection too,
    # permuted alike, as llama.cpp's convert_hf_to_gguf.py does
    for name in shapes:
        if not p.adjacent_rope and name.endswith(("attn_q.weight", "attn_k.weight",
                                                  "attn_q.bias", "attn_k.bias")):
            n_head = p.n_head if ".attn_q." in name else p.n_head_kv
            out[name] = out[name].then(lambda w, n=n_head: permute_rope_rows(w, n))
    return {name: out[name] for name in shapes}


# ----------------------------------------------------------------------------- tokenizer

# GGUF token types (gguf.TokenType); SentencePiece numbers its piece types the same way
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = range(1, 7)


@dataclass
class Vocab:
    """A tokenizer as GGUF stores it (tokenizer.ggml.*); types are GGUF token types."""
    model: str                  # "llama" (SentencePiece) or "gpt2" (byte-level BPE)
    pre: str                    # tokenizer.ggml.pre: "default", or a byte-level BPE pre-tokenizer
    tokens: list[str]
    scores: list[float] | None
    types: list[int]
    merges: list[str] | None
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool | None
    chat_template: str | list | None = None   # tokenizer_config.json's, as gguf.SpecialVocab reads it


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _proto_fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """Yield (field number, value) of a protobuf message; value is int or bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = int.from_bytes(buf[pos:pos + 8], "little"), pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = int.from_bytes(buf[pos:pos + 4], "little"), pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > len(buf):
            raise ValueError("truncated message")
        yield field, value


def _int32(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def read_sentencepiece_model(path: Path) -> dict:
    """Parse the fields of a SentencePiece ``ModelProto`` that GGUF needs.

    ModelProto: pieces = 1 (piece 1, score 2, type 3), trainer_spec = 2
    (model_type 3, byte_fallback 35, unk/bos/eos/pad id 40-43), normalizer_spec = 3
    (add_dummy_prefix 3). proto2 defaults apply to absent fields.
    """
    buf = path.read_bytes()
    model = {"pieces": [], "scores": [], "types": [], "model_type": 1, "byte_fallback": False,
             "unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": -1, "add_dummy_prefix": True}
    try:
        for field, value in _proto_fields(buf):
            if field == 1:
                piece, score, kind = "", 0.0, 1
                for f, v in _proto_fields(value):
                    if f == 1:
                        piece = v.decode("utf-8")
                    elif f == 2:
                        score = struct.unpack("<f", v.to_bytes(4, "little"))[0]
                    elif f == 3:
                        kind = v
                model["pieces"].append(piece)
                model["scores"].append(score)
                model["types"].append(kind)
            elif field == 2:
                names = {3: "model_type", 35: "byte_fallback", 40: "unk_id", 41: "bos_id",
                         42: "eos_id", 43: "pad_id"}
                for f, v in _proto_fields(value):
                    if f in names:
                        model[names[f]] = bool(v) if f == 35 else _int32(v)
            elif field == 3:
                for f, v in _proto_fields(value):
                    if f == 3:
                        model["add_dummy_prefix"] = bool(v)
    except (ValueError, UnicodeDecodeError, AttributeError, TypeError) as e:
        raise ConvertError(f"{path}: not a SentencePiece model ({e})") from None
    if not model["pieces"]:
        raise ConvertError(f"{path}: not a SentencePiece model (no pieces)")
    return model


def _tokenizer_config(model_dir: Path) -> dict:
    path = model_dir / "tokenizer_config.json"
    return _json_object(path) if path.is_file() else {}


def vocab_from_sentencepiece(path: Path) -> Vocab:
    """A ``llama`` vocabulary from a SentencePiece ``tokenizer.model`` (unigram or BPE), with
    its own special ids (read_vocab applies the checkpoint's)."""
    m = read_sentencepiece_model(path)
    if m["model_type"] not in (1, 2):
        raise ConvertError(f"{path}: SentencePiece model type {m['model_type']} (only unigram/BPE)")

    def opt_id(i: int) -> int | None:
        return i if 0 <= i < len(m["pieces"]) else None

    return Vocab("llama", "default", m["pieces"], m["scores"], m["types"], None,
                 opt_id(m["bos_id"]), opt_id(m["eos_id"]), opt_id(m["unk_id"]), opt_id(m["pad_id"]),
                 add_bos=True, add_eos=False, add_space_prefix=m["add_dummy_prefix"])


def _looks_special(text: str) -> bool:
    """llama.cpp's does_token_look_special: added tokens some checkpoints forget to mark special."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or text.startswith("<|") and text.endswith("|>")
            or text.startswith("<｜") and text.endswith("｜>")
            or text.startswith("<unused") and text.endswith(">"))


def added_token(text: str, special: bool) -> tuple[str, int]:
    """(text, type) of an added token as llama.cpp's converter writes it: CONTROL when marked
    special or looking special, else USER_DEFINED with SentencePiece's "▁" as a space."""
    if special or _looks_special(text):
        return text, CONTROL
    return text.replace("▁", " "), USER_DEFINED


def sentencepiece_added_tokens(model_dir: Path, tok_cfg: dict) -> dict[int, tuple[str, int]]:
    """{id: (text, type)} of the tokens added to a SentencePiece vocabulary (by a fine-tune),
    as llama.cpp's _create_vocab_sentencepiece reads them: added_tokens.json (USER_DEFINED),
    then tokenizer_config.json's added_tokens_decoder, which wins (see added_token)."""
    added = {}
    path = model_dir / "added_tokens.json"
    if path.is_file():
        for text, i in _json_object(path).items():
            if not _is_count(i):
                raise ConvertError(f"{path}: token {text!r} has id {i!r}, not a non-negative integer")
            added[i] = (text, USER_DEFINED)
    decoder = tok_cfg.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        raise ConvertError(f"{model_dir / 'tokenizer_config.json'}: added_tokens_decoder is not an object")
    for key, entry in decoder.items():
        content = entry.get("content") if isinstance(entry, dict) else None
        if not (key.isascii() and key.isdigit()) or not isinstance(content, str):
            raise ConvertError(f"{model_dir / 'tokenizer_config.json'}: added_tokens_decoder entry "
                               f"{key!r}: {entry!r} is not an id and {{\"content\": text}}")
        added[int(key)] = added_token(content, bool(entry.get("special")))
    return added


def _merge_text(merge, path: Path) -> str:
    """A tokenizer.json merge, "a b" or ["a", "b"], as GGUF's "a b"."""
    if isinstance(merge, str):
        return merge
    if isinstance(merge, list) and len(merge) == 2 and all(isinstance(m, str) for m in merge):
        return " ".join(merge)
    raise ConvertError(f"{path}: merge {merge!r} is not \"a b\" or [\"a\", \"b\"]")


def read_tokenizer_json(path: Path) -> tuple[dict, list[str], list[dict]]:
    """(tokenizer.json, its BPE merges as "a b", its added tokens), every id checked."""
    tj = _read_json(path)
    bpe = tj.get("model") if isinstance(tj, dict) else None
    if not isinstance(bpe, dict):
        raise ConvertError(f"{path}: not a tokenizer.json with a model vocabulary")
    if bpe.get("type", "BPE") != "BPE":
        raise ConvertError(f"{path}: tokenizer model {bpe.get('type')!r} is not supported (only BPE)")
    vocab = bpe.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise ConvertError(f"{path}: the model vocabulary is {vocab!r}, not an object of tokens")
    for text, i in vocab.items():
        if not _is_count(i):
            raise ConvertError(f"{path}: token {text!r} has id {i!r}, not a non-negative integer")
    added = tj.get("added_tokens") or []
    if not isinstance(added, list):
        raise ConvertError(f"{path}: added_tokens is not a list")
    for t in added:
        if not isinstance(t, dict) or not isinstance(t.get("content"), str) or not _is_count(t.get("id")):
            raise ConvertError(f"{path}: added token {t!r} has no text and integer id")
    merges = bpe.get("merges") or []
    if not isinstance(merges, list):
        raise ConvertError(f"{path}: merges is not a list")
    return tj, [_merge_text(m, path) for m in merges], added


# HF writes the contractions case-insensitively; llama.cpp (ggml_py.tokenizer.pretokenize) spells the cases out
_HF_CONTRACTIONS = "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
# tokenizer.ggml.pre names a byte-level BPE checkpoint can get, in order of preference: the
# names llama.cpp's converter writes, for the pre-tokenizers ggml_py.tokenizer.pretokenize implements
BPE_PRE_NAMES = ("llama-bpe", "smaug-bpe", "gpt-2", "trillion", "qwen2", "stablelm2",
                 "starcoder", "command-r")


def _pre_tokenizer_regexes(pre) -> list[str] | None:
    """The regexes a byte-level tokenizer.json pre_tokenizer splits with, in order and in
    llama.cpp's spelling; None unless it is Split (Isolated) / Digits steps and one ByteLevel
    that adds no prefix space (its use_regex is GPT-2's regex)."""
    steps = pre.get("pretokenizers") if isinstance(pre, dict) and pre.get("type") == "Sequence" else [pre]
    regexes, byte_level = [], 0
    for step in steps if isinstance(steps, list) else [None]:
        step = step if isinstance(step, dict) else {}
        pattern = step.get("pattern") if isinstance(step.get("pattern"), dict) else {}
        if (step.get("type") == "Split" and isinstance(pattern.get("Regex"), str)
                and step.get("behavior") == "Isolated" and not step.get("invert")):
            regexes.append(pattern["Regex"].replace(_HF_CONTRACTIONS, CONTRACTIONS_ANY_CASE))
        elif step.get("type") == "Digits":
            regexes.append(r"\p{N}" if step.get("individual_digits") else r"\p{N}+")
        elif step.get("type") == "ByteLevel" and not step.get("add_prefix_space"):
            byte_level += 1
            if step.get("use_regex", True):
                regexes.append(RE_GPT2)
        else:
            return None
    return regexes if byte_level == 1 else None


def bpe_pre_name(tj: dict, tok_cfg: dict, path: Path) -> str:
    """tokenizer.ggml.pre of a byte-level BPE tokenizer.json: the llama.cpp name whose
    pre-tokenizer splits with the same regexes as its pre_tokenizer; among names sharing
    them, the one with the same ignore_merges (the BPE model's) and clean_spaces
    (tokenizer_config.json's clean_up_tokenization_spaces). llama.cpp's converter hashes the
    HF tokenizer's output instead; like it, an unknown pre-tokenizer is refused."""
    pre = tj.get("pre_tokenizer")
    regexes = _pre_tokenizer_regexes(pre)
    names = [n for n in BPE_PRE_NAMES if [r.pattern for r in PRE_TOKENIZERS[n].patterns] == regexes]
    if not names:
        found = json.dumps(pre)       # one line, whatever the regexes hold
        raise ConvertError(f"{path}: BPE pre-tokenizer not recognized: {found[:400]} "
                           f"(known: those of {', '.join(BPE_PRE_NAMES)})")
    ignore_merges = bool(tj["model"].get("ignore_merges"))
    clean = tok_cfg.get("clean_up_tokenization_spaces")

    def mismatch(name: str) -> tuple[bool, bool]:
        pt = PRE_TOKENIZERS[name]
        return pt.ignore_merges != ignore_merges, isinstance(clean, bool) and pt.clean_spaces != clean

    return min(names, key=mismatch)


def vocab_from_tokenizer_json(path: Path, tok_cfg: dict, n_vocab: int) -> Vocab:
    """A Hugging Face ``tokenizer.json`` with a BPE model, with its own special ids
    (read_vocab applies the checkpoint's).

    Byte-fallback BPE (llama/SentencePiece style) becomes a ``llama`` vocabulary
    whose scores rank merges (a token made by merge r scores -r); byte-level BPE
    becomes a ``gpt2`` vocabulary with its merges and pre-tokenizer (bpe_pre_name).
    """
    tj, merges, added_list = read_tokenizer_json(path)
    bpe = tj["model"]
    vocab: dict[str, int] = bpe["vocab"]
    added = {t["content"]: t for t in added_list}
    n = max([*vocab.values(), *(t["id"] for t in added.values())]) + 1
    if n > n_vocab:
        raise ConvertError(f"tokenizer has {n} tokens, config.json vocab_size is {n_vocab}")
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [UNUSED] * n
    for text, i in vocab.items():
        tokens[i], types[i] = text, NORMAL
    for t in added.values():
        tokens[t["id"]], types[t["id"]] = added_token(t["content"], bool(t.get("special")))

    spm_style = bool(bpe.get("byte_fallback")) or "<0x0A>" in vocab
    if not spm_style:
        pre = bpe_pre_name(tj, tok_cfg, path)
        return Vocab("gpt2", pre, tokens, None, types, merges, None, None, None, None,
                     add_bos=PRE_TOKENIZERS[pre].add_bos, add_eos=False, add_space_prefix=None)
    # llama.cpp's SPM tokenizer merges the bigram whose result scores highest,
    # HF's BPE the pair with the lowest merge rank: score = -(first rank making it).
    scores = [0.0] * n
    for rank in range(len(merges) - 1, -1, -1):
        merged = merges[rank].replace(" ", "", 1)
        if merged in vocab:
            scores[vocab[merged]] = -float(rank)
    for i, text in enumerate(tokens):
        if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            types[i] = BYTE
    unk = vocab.get(_token_text(tok_cfg.get("unk_token")) or "<unk>")
    if unk is not None:
        types[unk] = UNKNOWN
    # The "▁" prefix is a Prepend normalizer, or a Metaspace pre-tokenizer
    # that prepends (HF's two spellings of SentencePiece's add_dummy_prefix).
    spec = json.dumps([tj.get("normalizer"), tj.get("pre_tokenizer")])
    prefix = ('"Prepend"' in spec or '"prepend_scheme": "first"' in spec
              or '"prepend_scheme": "always"' in spec or '"add_prefix_space": true' in spec)
    return Vocab("llama", "default", tokens, scores, types, None, vocab.get("<s>"), vocab.get("</s>"),
                 unk, None, add_bos=True, add_eos=False, add_space_prefix=prefix)


def _token_text(entry) -> str | None:
    """tokenizer_config.json's "eos_token" and friends: a text, or {"content": text, ...}."""
    text = entry.get("content") if isinstance(entry, dict) else entry
    return text if isinstance(text, str) else None


def apply_special_tokens(vocab: Vocab, model_dir: Path, tok_cfg: dict) -> None:
    """The checkpoint's special token ids and add_bos / add_eos, over the tokenizer's own.

    First as llama.cpp's converter (gguf.SpecialVocab): an id is tokenizer_config.json's
    ``bos_token`` (...) text among tokenizer.json's added tokens, else config.json's
    ``bos_token_id`` (...); add_bos / add_eos are tokenizer_config.json's
    ``add_bos_token`` / ``add_eos_token``, else what tokenizer.json's post_processor
    template adds. An id that finds none is the text among all tokens (so the tokens of
    added_tokens.json count), else the tokenizer's own. The chat template (one text, or
    a list of named ones) is tokenizer_config.json's, else chat_template.jinja's or
    chat_template.json's, as gguf.SpecialVocab reads it.
    """
    import gguf

    # its warnings (template tokens it cannot place, ids it skips) would break the
    # one-line error output; what it skips is covered by the fallbacks below
    quiet = logging.getLogger("gguf.vocab")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        special = gguf.SpecialVocab(model_dir, n_vocab=len(vocab.tokens))
    except (ValueError, TypeError, AttributeError, KeyError, IndexError) as e:
        raise ConvertError(f"{model_dir}: cannot read the special tokens ({e})") from None
    finally:
        quiet.setLevel(level)
    ids: dict[str, int] = {}
    for i, text in enumerate(vocab.tokens):
        ids.setdefault(text, i)
    for kind in ("bos", "eos", "unk", "pad"):
        tid = special.special_token_ids.get(kind)
        if tid is None:
            tid = ids.get(_token_text(tok_cfg.get(f"{kind}_token")))
        if tid is not None:
            setattr(vocab, f"{kind}_id", tid)
    vocab.add_bos = special.add_special_token.get("bos", vocab.add_bos)
    vocab.add_eos = special.add_special_token.get("eos", vocab.add_eos)
    template = special.chat_template
    if isinstance(template, list) and not all(
            isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("template"), str)
            for c in template):
        raise ConvertError(f"{model_dir}: chat_template: a list must hold "
                           '{"name": text, "template": text} objects')
    vocab.chat_template = template


def read_vocab(model_dir: Path, p: LlamaParams, log=print) -> Vocab:
    """The checkpoint's tokenizer (tokenizer.model, else tokenizer.json), padded with
    [PAD<i>] tokens to config.json's vocab_size, its added tokens and special ids applied."""
    tok_cfg = _tokenizer_config(model_dir)
    if (model_dir / "tokenizer.model").is_file():
        vocab = vocab_from_sentencepiece(model_dir / "tokenizer.model")
        added = sentencepiece_added_tokens(model_dir, tok_cfg)
    elif (model_dir / "tokenizer.json").is_file():
        vocab = vocab_from_tokenizer_json(model_dir / "tokenizer.json", tok_cfg, p.n_vocab)
        added = {}      # tokenizer.json holds its added tokens
    else:
        raise ConvertError(f"{model_dir}: no tokenizer (tokenizer.model or tokenizer.json)")
    if len(vocab.tokens) > p.n_vocab:
        raise ConvertError(f"tokenizer has {len(vocab.tokens)} tokens, config.json vocab_size is {p.n_vocab}")
    for i in range(len(vocab.tokens), p.n_vocab):     # pad to the embedding rows, as llama.cpp does
        vocab.tokens.append(f"[PAD{i}]")
        vocab.types.append(UNUSED)
        if vocab.scores is not None:
            vocab.scores.append(-10000.0)   # llama.cpp's converter's score for these
    for i, (text, kind) in sorted(added.items()):
        if i >= p.n_vocab:      # llama.cpp's converter skips these too
            log(f"warning: added token {text!r} has id {i}, not below vocab_size {p.n_vocab}: skipped")
            continue
        vocab.tokens[i], vocab.types[i], vocab.scores[i] = text, kind, -1000.0
    apply_special_tokens(vocab, model_dir, tok_cfg)
    return vocab


# ----------------------------------------------------------------------------- writer

def _to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), round to nearest even, NaN kept quiet, like ggml."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u.astype(np.uint64) + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((u >> 16) | 64).astype(np.uint16), rounded)


def write_gguf(path: Path, p: LlamaParams, tensors: dict[str, CheckpointTensor], vocab: Vocab,
               outtype: str, name: str, log=print) -> None:
    """Write a llama GGUF to `path`: hyper-parameters, tokenizer, then the tensors as
    `outtype` (1-D tensors stay F32), one at a time; `log` gets one line per tensor."""
    import gguf

    from ggml_py.files.gguf_writer import add_llama_hparams

    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "bf16": gguf.LlamaFileType.MOSTLY_BF16}[outtype]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_file_type(file_type)
    add_llama_hparams(w, n_vocab=p.n_vocab, n_ctx=p.n_ctx, n_embd=p.n_embd, n_layer=p.n_layer,
                      n_ff=p.n_ff, n_head=p.n_head, n_head_kv=p.n_head_kv, rms_eps=p.rms_eps,
                      rope_freq_base=p.rope_theta, rope_dim=p.rope_dim,
                      rope_scale_linear=p.rope_scaling_linear)

    w.add_tokenizer_model(vocab.model)
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(vocab.tokens)
    if vocab.scores is not None:
        w.add_token_scores(vocab.scores)
    w.add_token_types(vocab.types)
    if vocab.merges is not None:
        w.add_token_merges(vocab.merges)
    for value, add in ((vocab.bos_id, w.add_bos_token_id), (vocab.eos_id, w.add_eos_token_id),
                       (vocab.unk_id, w.add_unk_token_id), (vocab.pad_id, w.add_pad_token_id)):
        if value is not None:
            add(value)
    w.add_add_bos_token(vocab.add_bos)
    w.add_add_eos_token(vocab.add_eos)
    if vocab.add_space_prefix is not None:
        w.add_add_space_prefix(vocab.add_space_prefix)
    if vocab.chat_template:
        w.add_chat_template(vocab.chat_template)

    def stored(tname: str, t: CheckpointTensor):
        """(gguf type, make) of a tensor: 1-D tensors (norms) stay F32 in every output
        type, as in llama.cpp."""
        kind = outtype if len(t.shape) > 1 else "f32"
        change = {"f32": lambda x: x, "f16": lambda x: x.astype(np.float16), "bf16": _to_bf16}[kind]

        def make():
            data = change(t.load())
            log(f"  {tname:<28} {str(list(t.shape)):<14} {kind.upper()}")
            return data
        return gguf.GGMLQuantizationType[kind.upper()], make

    write_streamed(w, [(tname, t.shape, *stored(tname, t)) for tname, t in tensors.items()])


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The files of a checkpoint directory that ``convert`` reads."""
    names = ("config.json", "tokenizer.model", "tokenizer.json", "tokenizer_config.json",
             "added_tokens.json", *(index for _, index, _ in _WEIGHT_FORMATS))
    files = [model_dir / n for n in names]
    files += [*model_dir.glob("*.safetensors"), *model_dir.glob("pytorch_model*.bin")]
    return [f for f in files if f.is_file()]


def convert(model_dir: str | Path, outfile: str | Path | None = None, outtype: str = "f16",
            log=print, vocab_only: bool = False) -> Path:
    """Convert an HF-style llama checkpoint directory to a GGUF file; returns its path.

    ``vocab_only`` writes the metadata and tokenizer without tensors (no weights needed).
    """
    model_dir = Path(model_dir)
    if outtype not in OUTTYPES:
        raise ConvertError(f"unknown --outtype {outtype!r} (choose from {', '.join(OUTTYPES)})")
    if not model_dir.is_dir():
        raise ConvertError(f"{model_dir}: not a directory")
    out = outfile if outfile is not None else model_dir / f"{model_dir.resolve().name}-{outtype}.gguf"
    inputs = {f: f"the checkpoint's {f.name}" for f in checkpoint_files(model_dir)}
    try:
        check_output_path(out, inputs)    # the path as given: Path() would drop a trailing '/'
    except OutputPathError as e:
        raise ConvertError(str(e)) from None
    out = Path(out)
    params = read_config(model_dir)
    vocab = read_vocab(model_dir, params, log)
    tensors = {} if vocab_only else map_tensors(read_weights(model_dir), params)
    log(f"{model_dir}: llama, {params.n_layer} layers, {params.n_embd} wide, vocab {params.n_vocab}, "
        f"rope pairs {'adjacent (kept)' if params.adjacent_rope else 'half (q/k permuted)'}")
    try:
        # the weights are memory-mapped from the checkpoint: never write over a file
        # in use, and let a failed run leave no half-written output
        with atomic_output(out, inputs) as tmp:
            write_gguf(Path(tmp), params, tensors, vocab, outtype, model_dir.resolve().name, log)
    except BrokenPipeError:
        raise   # `log`'s reader went away, not the output file (for the console script)
    except OutputPathError as e:   # (the path changed since it was checked)
        raise ConvertError(str(e)) from None
    except OSError as e:
        raise ConvertError(f"{out}: cannot write ({e.strerror or e})") from None
    n_params = sum(math.prod(t.shape) for t in tensors.values())
    log(f"wrote {out}: {len(tensors)} tensors, {n_params:,} parameters, "
        f"{out.stat().st_size / 1e6:.2f} MB ({outtype.upper()})")
    return out
