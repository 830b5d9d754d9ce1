"""Sample text from a training checkpoint with PyTorch (temperature + top-p).

    python training/sample.py CHECKPOINT_DIR [--prompt "ROMEO."] [-n 120] [--temp 0.8] [--top-p 0.95] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from check_gguf import load_torch_model  # noqa: E402


@torch.no_grad()
def generate(model, ids: list[int], n: int, temp: float, top_p: float, gen: torch.Generator) -> list[int]:
    ctx = model.cfg.max_seq_len
    for _ in range(n):
        logits = model(torch.tensor([ids[-ctx:]]))[0, -1]
        if temp <= 0:
            ids.append(int(logits.argmax()))
            continue
        probs = torch.softmax(logits / temp, -1)
        p, idx = probs.sort(descending=True)
        keep = (p.cumsum(0) - p) < top_p                       # smallest set with mass >= top_p
        p = p[keep] / p[keep].sum()
        ids.append(int(idx[keep][torch.multinomial(p, 1, generator=gen)]))
    return ids


def main(argv: list[str] | None = None) -> int:
    a = argparse.ArgumentParser(description="Sample from a checkpoint")
    a.add_argument("checkpoint", type=Path)
    a.add_argument("--prompt", default="ROMEO.")
    a.add_argument("-n", type=int, default=120)
    a.add_argument("--temp", type=float, default=0.8)
    a.add_argument("--top-p", type=float, default=0.95)
    a.add_argument("--seed", type=int, default=0)
    args = a.parse_args(argv)
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(args.checkpoint / "tokenizer.model"))
    model = load_torch_model(args.checkpoint)
    ids = generate(model, [sp.bos_id()] + sp.encode(args.prompt), args.n, args.temp, args.top_p,
                   torch.Generator().manual_seed(args.seed))
    print(sp.decode(ids[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
