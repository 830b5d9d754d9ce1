"""Train the SentencePiece BPE tokenizer on the train split.

Vocabulary 2048 (including ``<unk>``, ``<s>``, ``</s>`` and the 256 byte
pieces ``<0x00>``..``<0xFF>``), byte fallback so any input encodes, identity
normalisation (no NFKC, extra spaces kept) so the text the model sees is the
text in the file — which is also what llama.cpp's SPM tokenizer assumes.

The tokenizer is trained on the text line by line, *without* a dummy prefix
space: a newline is the byte token ``<0x0A>`` and the word after it has no
``▁`` in front, so a line start must look the same in training as in the
running text the model is trained on. The model file therefore says
``add_dummy_prefix = false``, which the GGUF records as
``tokenizer.ggml.add_space_prefix = false``; the start of a text is
tokenized like the start of any other line (``"ROMEO."`` -> ``ROM E O .``).

Usage::

    python training/tokenizer.py [--data training/data] [--out training/out/tokenizer]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VOCAB_SIZE = 2048


def train_tokenizer(train_txt: Path, prefix: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    """Train and return the path of ``<prefix>.model``."""
    import sentencepiece as spm

    prefix.parent.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(
        input=str(train_txt),
        model_prefix=str(prefix),
        model_type="bpe",
        vocab_size=vocab_size,
        byte_fallback=True,
        character_coverage=1.0,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=2,
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train the SentencePiece BPE tokenizer")
    parser.add_argument("--data", type=Path, default=REPO / "training" / "data")
    parser.add_argument("--out", type=Path, default=REPO / "training" / "out" / "tokenizer")
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = parser.parse_args(argv)
    model = train_tokenizer(args.data / "train.txt", args.out, args.vocab_size)

    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(model))
    for split in ("train", "val", "test"):
        text = (args.data / f"{split}.txt").read_text(encoding="utf-8")
        n = len(sp.encode(text))
        print(f"{split}: {n:,} tokens, {len(text.encode()) / n:.2f} bytes/token")
    print(f"wrote {model}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
