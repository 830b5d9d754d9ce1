"""What the readers of a checkpoint directory share: the error a bad input raises, and
JSON files read into it."""

from __future__ import annotations

import json
from pathlib import Path


class ConvertError(ValueError):
    """A bad input; ``main`` prints it as one line and exits non-zero."""


def read_json(path: Path):
    """The value of a JSON file; an error naming the file when it is not valid JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConvertError(f"{path}: not valid JSON ({e})") from None


def json_object(path: Path) -> dict:
    """A JSON file that must hold an object (config.json, tokenizer_config.json, ...)."""
    value = read_json(path)
    if not isinstance(value, dict):
        raise ConvertError(f"{path}: not a JSON object")
    return value


def is_count(n) -> bool:
    """Whether `n` is a non-negative int (an id, a size, an offset; True is not one)."""
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0
