"""GGUF key/value metadata as plain Python values, for the tokenizer and the tools.

``read_gguf_metadata(path)`` opens the file with the one GGUF reader
(``gguf_reader.open_reader``: every check the model loader makes) and returns
every key's value. ``tokenizer_fields`` and ``plain_value`` turn the fields of
an open file into the same plain values: a ``GGUFFile`` of ours, or a
``gguf.GGUFReader`` that a caller opened (its public ``ReaderField``).
"""

from __future__ import annotations

import os
from typing import Any

from ggml_py.files.gguf_file import ARRAY, STRING, Field
from ggml_py.files.gguf_reader import open_reader

__all__ = ["plain_value", "read_gguf_metadata", "tokenizer_fields"]


def read_gguf_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """Read the key/value metadata of a GGUF file.

    Returns a dict mapping each key to a plain Python value: ``int``,
    ``float``, ``bool``, ``str`` or a ``list`` of those (an array of arrays: a
    list of lists). Strings that are not valid UTF-8 are decoded with
    ``surrogateescape`` so their bytes survive. Raises ``ModelLoadError`` (a
    ``ValueError``) naming the file if it cannot be read or is not a usable
    GGUF file.
    """
    return {key: field.value for key, field in open_reader(os.fspath(path)).fields.items()}


def tokenizer_fields(reader: Any) -> dict[str, Any]:
    """Plain values of the tokenizer-related fields of an open GGUF file (a
    ``GGUFFile`` or a ``gguf.GGUFReader``)."""
    return {name: plain_value(field) for name, field in reader.fields.items()
            if name.startswith("tokenizer.") or name.startswith("general.")}


def plain_value(value: Any) -> Any:
    """A ``Field``, ``gguf.ReaderField``, numpy array or plain value as plain Python."""
    if isinstance(value, Field):
        return value.value
    if hasattr(value, "parts") and hasattr(value, "types"):
        return _reader_field_value(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "surrogateescape")
    return value


def _reader_field_value(field: Any) -> Any:
    """The value of a gguf.ReaderField, read through its public parts, types and data."""
    types = [int(t) for t in field.types]
    if not types:
        return None
    if types[0] == ARRAY:
        if len(types) > 2 and types[1] == ARRAY:
            # an array of arrays: no tokenizer key holds one; shown as such (the reader's
            # flat parts would otherwise read as one long array) so that it is refused
            return [[]]
        if types[-1] == STRING:
            return [bytes(field.parts[i]).decode("utf-8", "surrogateescape") for i in field.data]
        return [item for i in field.data for item in field.parts[i].tolist()]
    if types[0] == STRING:
        return bytes(field.parts[-1]).decode("utf-8", "surrogateescape")
    return field.parts[-1].tolist()[0]
