"""Hugging Face tensor names -> llama.cpp's, every shape checked against config.json.

RoPE pairing. Hugging Face's llama rotates the two *halves* of each head
(``x[i]`` with ``x[i + d/2]``); llama.cpp's "normal" rope rotates *adjacent*
pairs (``x[2i]`` with ``x[2i+1]``). A standard HF checkpoint therefore has its
q and k rows permuted back per head (row ``2i`` <- ``i``, ``2i+1`` <- ``i+d/2``),
as llama.cpp's converter does. A checkpoint whose ``config.json`` says
``"rope_pairing": "adjacent"`` (the ones ``training/train.py`` writes) is already
in llama.cpp's order and is written unchanged.
"""

from __future__ import annotations

import numpy as np

from ggml_py.tools.convert.checkpoint import CheckpointTensor
from ggml_py.tools.convert.common import ConvertError
from ggml_py.tools.convert.config import LlamaParams


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
