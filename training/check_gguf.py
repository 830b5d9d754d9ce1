"""Check a converted GGUF against its PyTorch checkpoint: same logits.

A numpy llama forward that follows llama.cpp's conventions (tensor names,
"normal" adjacent-pair RoPE, tied output when ``output.weight`` is absent,
ggml's row-major weight layout) runs on the GGUF; ``training/train.py``'s
PyTorch model runs on the checkpoint; the logits must agree.

    python training/check_gguf.py CHECKPOINT_DIR MODEL.gguf [--tol 1e-4]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def gguf_forward(path: Path, tokens: list[int]) -> np.ndarray:
    """Logits (T, n_vocab) of a llama GGUF (F32/F16/BF16 tensors) for one sequence."""
    import gguf

    r = gguf.GGUFReader(str(path))
    f = {k: v.contents() for k, v in r.fields.items()}

    def weight(name: str) -> np.ndarray:
        t = next(t for t in r.tensors if t.name == name)
        return gguf.quants.dequantize(t.data, t.tensor_type).reshape(
            [int(n) for n in reversed(t.shape)]).astype(np.float64)

    names = {t.name for t in r.tensors}
    n_layer, n_head = f["llama.block_count"], f["llama.attention.head_count"]
    n_head_kv, eps = f["llama.attention.head_count_kv"], f["llama.attention.layer_norm_rms_epsilon"]
    base, n_rot = f["llama.rope.freq_base"], f["llama.rope.dimension_count"]
    emb = weight("token_embd.weight")                                     # (n_vocab, n_embd)
    T = len(tokens)
    x = emb[tokens]                                                       # (T, n_embd)
    hd = x.shape[1] // n_head
    ang = np.outer(np.arange(T), base ** (-np.arange(0, n_rot, 2) / n_rot))   # (T, n_rot/2)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rms(v, w):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w

    def rope(v):                                                          # (T, H, hd) adjacent pairs
        v0, v1 = v[..., 0::2], v[..., 1::2]
        return np.stack([v0 * cos - v1 * sin, v0 * sin + v1 * cos], -1).reshape(v.shape)

    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(n_layer):
        p = f"blk.{i}."
        h = rms(x, weight(p + "attn_norm.weight"))
        q = rope((h @ weight(p + "attn_q.weight").T).reshape(T, n_head, hd))
        k = rope((h @ weight(p + "attn_k.weight").T).reshape(T, n_head_kv, hd))
        v = (h @ weight(p + "attn_v.weight").T).reshape(T, n_head_kv, hd)
        k, v = np.repeat(k, n_head // n_head_kv, 1), np.repeat(v, n_head // n_head_kv, 1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask          # (H, T, T)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", s, v).reshape(T, -1)
        x = x + o @ weight(p + "attn_output.weight").T
        h = rms(x, weight(p + "ffn_norm.weight"))
        g = h @ weight(p + "ffn_gate.weight").T
        x = x + (g / (1 + np.exp(-g)) * (h @ weight(p + "ffn_up.weight").T)) @ weight(p + "ffn_down.weight").T
    x = rms(x, weight("output_norm.weight"))
    out = weight("output.weight") if "output.weight" in names else emb
    return x @ out.T


def load_torch_model(ckpt: Path):
    """training/train.py's model with a checkpoint directory's weights, in eval mode."""
    from safetensors.torch import load_file

    from train import Llama, ModelConfig

    c = json.loads((ckpt / "config.json").read_text())
    cfg = ModelConfig(vocab_size=c["vocab_size"], dim=c["hidden_size"], n_layers=c["num_hidden_layers"],
                      n_heads=c["num_attention_heads"], n_kv_heads=c["num_key_value_heads"],
                      hidden_dim=c["intermediate_size"], max_seq_len=c["max_position_embeddings"],
                      norm_eps=c["rms_norm_eps"], rope_theta=c["rope_theta"])
    model = Llama(cfg)
    model.load_state_dict(load_file(str(ckpt / "model.safetensors")))
    model.eval()
    return model


def torch_forward(ckpt: Path, tokens: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return load_torch_model(ckpt)(torch.tensor([tokens])).double().numpy()[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Compare GGUF logits with the PyTorch checkpoint")
    p.add_argument("checkpoint", type=Path)
    p.add_argument("gguf", type=Path)
    p.add_argument("--tol", type=float, default=1e-4, help="max |diff| allowed, relative to max |logit|")
    args = p.parse_args(argv)
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(args.checkpoint / "tokenizer.model"))
    tokens = [sp.bos_id()] + sp.encode("ROMEO.\nBut, soft! what light through yonder window breaks?\n"
                                       "It is the east, and Juliet is the sun.")
    ref, got = torch_forward(args.checkpoint, tokens), gguf_forward(args.gguf, tokens)
    err = np.abs(ref - got).max() / np.abs(ref).max()
    same_argmax = (ref.argmax(-1) == got.argmax(-1)).mean()
    print(f"{args.gguf.name}: {len(tokens)} tokens, max |diff| / max |logit| = {err:.2e}, "
          f"argmax agreement {same_argmax:.0%}")
    return 0 if err <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
