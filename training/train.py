"""Train the bundled Shakespeare llama (~5 M parameters) on CPU with PyTorch.

Reads top to bottom: config, model, data, evaluation, checkpoint, training loop.

The model is a plain llama: RMSNorm (eps 1e-5) -> attention with rotary
position embeddings -> RMSNorm -> SwiGLU, tied input/output embeddings.
RoPE rotates *adjacent* pairs ``(x[2i], x[2i+1])`` by ``pos * base**(-2i/d)``,
which is llama.cpp's "normal" rope mode, so the weights go into a GGUF without
the q/k row permutation that Hugging Face checkpoints need (``config.json``
says ``"rope_pairing": "adjacent"``, and ``ggml-convert`` honours it).

Usage (the exact command of the bundled model is in training/README.md)::

    python training/data.py && python training/tokenizer.py
    python training/train.py --steps 3000 --out training/out/shakespeare-5m

Outputs in ``--out``: a Hugging Face-style checkpoint (``config.json``,
``model.safetensors``, ``tokenizer.model``), ``log.jsonl`` (loss curve),
``loss.png`` and ``results.json`` (test perplexity and bits per byte).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- config

@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 2048
    dim: int = 256
    n_layers: int = 6
    n_heads: int = 8
    n_kv_heads: int = 8
    hidden_dim: int = 704
    max_seq_len: int = 256
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    bos_id: int = 1
    eos_id: int = 2

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


# ----------------------------------------------------------------------------- model

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (max_seq_len, head_dim // 2): angle pos * theta**(-2i/d)."""
    inv_freq = cfg.rope_theta ** (-torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim)
    angles = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of x (B, n_head, T, head_dim); cos/sin (T, head_dim // 2)."""
    x0, x1 = x[..., 0::2], x[..., 1::2]                       # (B, H, T, head_dim/2)
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)     # (B, H, T, hd)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.n_kv_heads != self.n_heads)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))                       # (B, T, dim)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.down_proj = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """Named like Hugging Face's ``LlamaModel`` so state-dict keys are HF's."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)


class Llama(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():            # GPT-2: scale residual outputs
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, T) token ids -> logits (B, T, vocab_size)."""
        T = idx.shape[1]
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        x = self.model.embed_tokens(idx)                                   # (B, T, dim)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        return x @ self.model.embed_tokens.weight.T                        # tied output


# ----------------------------------------------------------------------------- data

def encode_file(sp, path: Path) -> np.ndarray:
    """The whole file as one token stream (no BOS), as llama.cpp tokenizes it."""
    return np.asarray(sp.encode(path.read_text(encoding="utf-8")), dtype=np.int64)


def sample_batch(tokens: np.ndarray, batch: int, seq_len: int, bos: int,
                 rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows, each starting with BOS like llama.cpp's perplexity chunks.

    x = [BOS, t_i .. t_{i+T-2}], y = [t_i .. t_{i+T-1}]; both (batch, T).
    """
    starts = rng.integers(0, len(tokens) - seq_len, size=batch)
    y = np.stack([tokens[s:s + seq_len] for s in starts])
    x = np.concatenate([np.full((batch, 1), bos), y[:, :-1]], axis=1)
    return torch.from_numpy(x), torch.from_numpy(y)


# ----------------------------------------------------------------------------- evaluation

@torch.no_grad()
def mean_loss(model: Llama, tokens: np.ndarray, seq_len: int, bos: int, batch: int = 16) -> float:
    """Mean next-token loss over non-overlapping windows built like ``sample_batch``."""
    n = len(tokens) // seq_len
    rows = tokens[:n * seq_len].reshape(n, seq_len)                        # (n, T)
    total = 0.0
    for b0 in range(0, n, batch):
        y = torch.from_numpy(rows[b0:b0 + batch])
        x = torch.cat([torch.full((len(y), 1), bos), y[:, :-1]], dim=1)
        total += F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum").item()
    return total / rows.size


@torch.no_grad()
def llama_cpp_perplexity(model: Llama, tokens_with_bos: np.ndarray, n_ctx: int, bos: int,
                         batch: int = 16) -> tuple[float, float, int]:
    """Perplexity the way llama.cpp's ``perplexity`` computes it.

    The text (tokenized with BOS) is cut into chunks of ``n_ctx`` tokens; each
    chunk's first token is replaced by BOS and only the second half of each chunk
    is scored (token j+1 predicted from logits j for j in [n_ctx/2, n_ctx-1)).
    Returns (perplexity, mean nll in nats, scored token count).
    """
    n_chunk = len(tokens_with_bos) // n_ctx
    first = n_ctx // 2
    chunks = tokens_with_bos[:n_chunk * n_ctx].reshape(n_chunk, n_ctx).copy()
    chunks[:, 0] = bos
    nll, count = 0.0, 0
    for b0 in range(0, n_chunk, batch):
        x = torch.from_numpy(chunks[b0:b0 + batch])
        logp = F.log_softmax(model(x).double(), dim=-1)                      # (B, n_ctx, vocab)
        target = x[:, first + 1:]
        nll -= logp[:, first:n_ctx - 1].gather(-1, target.unsqueeze(-1)).sum().item()
        count += target.numel()
    return math.exp(nll / count), nll / count, count


# ----------------------------------------------------------------------------- checkpoint

def hf_config(cfg: ModelConfig) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.hidden_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": True,
        "bos_token_id": cfg.bos_id,
        "eos_token_id": cfg.eos_id,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        # Not a Hugging Face key: q/k rows are in llama.cpp's adjacent-pair RoPE
        # order, so converters must not apply HF's rotate-half permutation.
        "rope_pairing": "adjacent",
    }


def save_checkpoint(model: Llama, out: Path, tokenizer_model: Path, extra: dict) -> None:
    """Write config.json, model.safetensors and tokenizer.model, atomically per directory."""
    from safetensors.torch import save_file

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(hf_config(model.cfg), indent=2) + "\n")
    (tmp / "training_state.json").write_text(json.dumps(extra, indent=2) + "\n")
    shutil.copyfile(tokenizer_model, tmp / "tokenizer.model")
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def plot_curve(log: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in log if "train_loss" in r]
    val = [r for r in log if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot([r["step"] for r in train], [r["train_loss"] for r in train], lw=0.8, label="train (running mean)")
    ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", ms=3, label="validation (Macbeth)")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title("shakespeare-5m training loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ----------------------------------------------------------------------------- training

def lr_at(step: int, progress: float, lr: float, warmup: int, min_lr: float) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``min_lr`` at progress 1."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Train the Shakespeare llama on CPU")
    p.add_argument("--data", type=Path, default=REPO / "training" / "data")
    p.add_argument("--tokenizer", type=Path, default=REPO / "training" / "out" / "tokenizer.model")
    p.add_argument("--out", type=Path, default=REPO / "training" / "out" / "shakespeare-5m")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--eval-tokens", type=int, default=8192,
                   help="validation tokens used by the periodic evaluation (all at the end)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--time-budget", type=float, default=0.0,
                   help="seconds; when > 0 the schedule runs on max(step/steps, time/budget) "
                        "and training stops when either reaches 1 (for a shared CPU)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)

    import sentencepiece as spm

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    sp = spm.SentencePieceProcessor(model_file=str(args.tokenizer))
    cfg = ModelConfig(vocab_size=sp.vocab_size(), max_seq_len=args.seq_len,
                      bos_id=sp.bos_id(), eos_id=sp.eos_id())
    train_tokens = encode_file(sp, args.data / "train.txt")
    val_tokens = encode_file(sp, args.data / "val.txt")
    model = Llama(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params:,}  train tokens {len(train_tokens):,}  val tokens {len(val_tokens):,}",
          flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    log_path = args.out.with_name(args.out.name + ".log.jsonl")
    log: list[dict] = []
    log_file = log_path.open("w")
    t0, running = time.time(), None

    def evaluate(step: int, final: bool = False) -> None:
        model.eval()
        tokens = val_tokens if final else val_tokens[:args.eval_tokens]
        val = mean_loss(model, tokens, cfg.max_seq_len, cfg.bos_id)
        model.train()
        rec = {"step": step, "val_loss": val, "elapsed_s": time.time() - t0}
        log.append(rec)
        log_file.write(json.dumps(rec) + "\n")
        log_file.flush()
        print(f"step {step:5d}  val {val:.4f}  ({rec['elapsed_s']:.0f} s)", flush=True)
        save_checkpoint(model, args.out, args.tokenizer,
                        {"step": step, "val_loss": val, "args": {k: str(v) for k, v in vars(args).items()}})

    model.train()
    step, eval_time = 0, 0.0
    while True:
        progress = step / args.steps
        if args.time_budget > 0:
            progress = max(progress, (time.time() - t0 - eval_time) / args.time_budget)
        if progress >= 1.0:
            break
        if step % args.eval_every == 0 and step > 0:
            t_eval = time.time()
            evaluate(step)
            eval_time += time.time() - t_eval
        for group in opt.param_groups:
            group["lr"] = lr_at(step, progress, args.lr, args.warmup, args.min_lr)
        x, y = sample_batch(train_tokens, args.batch, cfg.max_seq_len, cfg.bos_id, rng)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        if step % 25 == 0:
            rec = {"step": step, "train_loss": running, "lr": opt.param_groups[0]["lr"],
                   "elapsed_s": time.time() - t0}
            log.append(rec)
            log_file.write(json.dumps(rec) + "\n")
            log_file.flush()
            if step % 100 == 0:
                print(f"step {step:5d}  train {running:.4f}  lr {rec['lr']:.2e}  ({rec['elapsed_s']:.0f} s)",
                      flush=True)
        step += 1
    rec = {"step": step, "train_loss": running, "lr": opt.param_groups[0]["lr"], "elapsed_s": time.time() - t0}
    log.append(rec)
    log_file.write(json.dumps(rec) + "\n")
    evaluate(step, final=True)
    train_time = time.time() - t0

    # Test perplexity the way llama.cpp measures it, and bits per byte.
    model.eval()
    test_text = (args.data / "test.txt").read_text(encoding="utf-8")
    test_tokens = np.asarray([cfg.bos_id] + sp.encode(test_text), dtype=np.int64)
    ppl, nll, scored = llama_cpp_perplexity(model, test_tokens, cfg.max_seq_len, cfg.bos_id)
    bytes_per_token = len(test_text.encode()) / (len(test_tokens) - 1)
    results = {
        "steps": step, "seed": args.seed, "params": n_params,
        "train_wall_s": round(train_time, 1),
        "final_train_loss": running, "final_val_loss": log[-1]["val_loss"],
        "test_ppl": ppl, "test_nll": nll, "test_scored_tokens": scored,
        "test_bytes_per_token": bytes_per_token,
        "test_bits_per_byte": nll / math.log(2) / bytes_per_token,
        "n_ctx": cfg.max_seq_len, "config": asdict(cfg), "command": " ".join(sys.argv),
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    plot_curve(log, args.out / "loss.png")
    shutil.copyfile(log_path, args.out / "log.jsonl")
    print(json.dumps(results, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
