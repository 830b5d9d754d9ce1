"""Reading the ``tokenizer.ggml.*`` metadata: each value checked to be of its kind.

A value of the wrong kind (``tokens`` that are not an array of strings, an
``add_bos_token`` that is the string ``"false"``) is a :class:`TokenizerError`
naming the source and the key; :class:`TokenizerWarning` is for what llama.cpp
accepts with a warning.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Mapping

from ggml_py.files.gguf_metadata import plain_value
# ggml_py's own package __init__ has imported this already; no extra cost.
from ggml_py.files.gguf_reader import ModelLoadError

KEY = "tokenizer.ggml."


class TokenizerError(ModelLoadError):
    """Metadata without a usable tokenizer; the message is '<source>: <problem>'.

    A ``ModelLoadError`` (so a ``ValueError``): the model loader passes it on
    unchanged and the command-line programs print it as their one-line error.
    """


class TokenizerWarning(UserWarning):
    """Metadata llama.cpp accepts with a warning, and so is accepted here with one
    (a special token id past the vocabulary: ignored)."""


# Metadata value kinds ("x[]": an array of x): how messages name them, and the
# Python types that are one. A bool is an int to Python but not to GGUF.
_KINDS = {
    "str": ("a string", "strings", (str,)),
    # the numeric ABCs admit numpy scalars (a list of np.float32 loads as a list of
    # floats does); np.bool_ is neither Integral nor Real, and bool is excluded below
    "int": ("an integer", "integers", (numbers.Integral,)),
    "bool": ("a bool", "bools", (bool,)),
    "number": ("a number", "numbers", (numbers.Real,)),
}


def _is_kind(value_type: type, kind: str) -> bool:
    return issubclass(value_type, _KINDS[kind][2]) and (kind == "bool" or not issubclass(value_type, bool))


def _kind_of(value: Any) -> str:
    """How an error message names what a metadata value turned out to be."""
    for kind in ("bool", "int", "str"):
        if _is_kind(type(value), kind):
            return _KINDS[kind][0]
    if isinstance(value, numbers.Real):
        return "a float"
    if isinstance(value, (list, tuple)):
        return "an array"
    return f"a {type(value).__name__}"


def check_kind(value: Any, kind: str, key: str, source: str) -> Any:
    """``value`` if it is of ``kind`` ('int', 'str[]', ...), else a TokenizerError naming ``key``."""
    if not kind.endswith("[]"):
        if not _is_kind(type(value), kind):
            raise TokenizerError(f"{source}: {key} must be {_KINDS[kind][0]}, got {_kind_of(value)}")
        return value
    item_kind = kind[:-2]
    plural = _KINDS[item_kind][1]
    if not isinstance(value, (list, tuple)):
        raise TokenizerError(f"{source}: {key} must be an array of {plural}, got {_kind_of(value)}")
    # Check the few distinct item types, not every item (128k-entry arrays).
    bad = {t for t in set(map(type, value)) if not _is_kind(t, item_kind)}
    if bad:
        index = next(i for i, item in enumerate(value) if type(item) in bad)
        raise TokenizerError(f"{source}: {key} must be an array of {plural}, "
                             f"got {_kind_of(value[index])} at index {index}")
    return value


def field_getter(fields: Mapping[str, Any], source: str) -> Callable[..., Any]:
    """A function ``get(name, kind, default=None, prefix=KEY)`` reading ``fields``
    (key -> value: plain, numpy or ``gguf.ReaderField``) for the file ``source``."""
    def get(name: str, kind: str, default: Any = None, prefix: str = KEY) -> Any:
        """The value of key ``prefix + name`` (``default`` if absent), checked to be of ``kind``."""
        value = fields.get(prefix + name)
        if value is None:
            return default
        return check_kind(plain_value(value), kind, prefix + name, source)
    return get
