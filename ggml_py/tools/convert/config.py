"""config.json -> LlamaParams: every hyper-parameter checked, each error naming its key."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ggml_py.tools.convert.common import ConvertError, json_object


# Hugging Face classes of the llama architecture (llama.cpp converts Mistral's as llama too:
# the same weights and graph; its sliding window, which llama.cpp's llama graph does not apply,
# is not written either)
LLAMA_CLASSES = ("LlamaForCausalLM", "LLaMAForCausalLM", "MistralForCausalLM")
LLAMA_MODEL_TYPES = ("llama", "mistral")


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


def read_config(model_dir: Path) -> LlamaParams:
    """config.json -> LlamaParams; every value checked, errors name the key. (The special
    token ids in it are read with the tokenizer: see read_vocab.)"""
    path = model_dir / "config.json"
    if not path.is_file():
        raise ConvertError(f"{model_dir}: no config.json")
    cfg = json_object(path)
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
