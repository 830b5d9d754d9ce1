"""A small reader of GGUF key/value metadata (tensor infos and data are not read).

``read_gguf_metadata(path)`` memory-maps the file and returns every key as a
plain Python value, several times faster than ``gguf.GGUFReader`` on a 100k+
entry vocabulary. ``tokenizer_fields`` and ``plain_value`` turn the fields
of an open ``gguf.GGUFReader`` into the same plain values. Standard library only.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any

__all__ = ["plain_value", "read_gguf_metadata", "tokenizer_fields"]

_GGUF_MAGIC = b"GGUF"
_GGUF_STRING = 8
_GGUF_ARRAY = 9
# struct codes of the fixed-size GGUF value types
_GGUF_SCALAR_CODES = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f",
                      7: "?", 10: "Q", 11: "q", 12: "d"}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def read_gguf_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """Read the key/value metadata of a GGUF file (tensors are not read).

    Returns a dict mapping each key to a plain Python value: ``int``,
    ``float``, ``bool``, ``str`` or a ``list`` of those. Strings that are not
    valid UTF-8 are decoded with ``surrogateescape`` so their bytes survive.
    Raises ``ValueError`` naming the file if it is not a GGUF file or its
    metadata is truncated; ``OSError`` if it cannot be opened.
    """
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):
        raise ValueError(f"{path}: not a regular file (a GGUF file is memory-mapped)")
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < 4 + 4 + 8 + 8:
            raise ValueError(f"{path}: not a GGUF file (too short)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse_gguf_kv(data, path)


def _parse_gguf_kv(data: mmap.mmap, path: str) -> dict[str, Any]:
    if data[:4] != _GGUF_MAGIC:
        raise ValueError(f"{path}: not a GGUF file (magic {data[:4]!r}, expected {_GGUF_MAGIC!r})")
    (version,) = _U32.unpack_from(data, 4)
    if version not in (2, 3):
        # version 1 used 32-bit lengths; a byte-swapped number means a
        # big-endian file. Neither is produced by current converters.
        raise ValueError(f"{path}: unsupported GGUF version {version}")
    (n_kv,) = _U64.unpack_from(data, 16)
    offset = 24
    fields: dict[str, Any] = {}
    key = None  # the key being read, for the message
    duplicate = None
    try:
        # A key/value pair takes at least 13 bytes: key length, value type, a u8.
        _check_count(data, offset, n_kv, 13, "key/value")
        for _ in range(n_kv):
            key = None
            key, offset = _read_gguf_string(data, offset)
            if key in fields:   # refused, as llama.cpp and gguf refuse it (not: the last wins)
                duplicate = key
                break
            (value_type,) = _U32.unpack_from(data, offset)
            fields[key], offset = _read_gguf_value(data, offset + 4, value_type)
    except (struct.error, IndexError, ValueError) as e:
        where = f"key {key!r}: " if key is not None else ""
        raise ValueError(f"{path}: truncated or corrupt GGUF metadata ({where}{e})") from e
    if duplicate is not None:
        raise ValueError(f"{path}: duplicate metadata key {duplicate!r}")
    return fields


def _check_count(data: mmap.mmap, offset: int, count: int, min_item_size: int, what: str) -> None:
    """Refuse a count the rest of the file cannot hold, before allocating for it.

    The count comes from the file; without this a corrupt one (2^40) makes a
    list of that many items, or fails with a bare MemoryError.
    """
    if count * min_item_size > len(data) - offset:
        raise ValueError(f"{what} count {count} is more than the file can hold")


def _read_gguf_string(data: mmap.mmap, offset: int) -> tuple[str, int]:
    (length,) = _U64.unpack_from(data, offset)
    end = offset + 8 + length
    if end > len(data):
        raise IndexError("string runs past the end of the file")
    return data[offset + 8:end].decode("utf-8", "surrogateescape"), end


def _scalar_code(value_type: int) -> str:
    code = _GGUF_SCALAR_CODES.get(value_type)
    if code is None:
        raise ValueError(f"unknown value type {value_type}")
    return code


def _read_gguf_value(data: mmap.mmap, offset: int, value_type: int) -> tuple[Any, int]:
    if value_type == _GGUF_STRING:
        return _read_gguf_string(data, offset)
    if value_type == _GGUF_ARRAY:
        (item_type,) = _U32.unpack_from(data, offset)
        (count,) = _U64.unpack_from(data, offset + 4)
        offset += 12
        if item_type == _GGUF_STRING:
            _check_count(data, offset, count, 8, "array")  # each string: its 8-byte length
            return _read_gguf_string_array(data, offset, count)
        if item_type == _GGUF_ARRAY:
            # Each item is an array without its own value type: item type, count, items.
            _check_count(data, offset, count, 12, "array")
            items = []
            for _ in range(count):
                item, offset = _read_gguf_value(data, offset, _GGUF_ARRAY)
                items.append(item)
            return items, offset
        code = _scalar_code(item_type)
        _check_count(data, offset, count, struct.calcsize("<" + code), "array")
        array = struct.Struct(f"<{count}{code}")
        return list(array.unpack_from(data, offset)), offset + array.size
    scalar = struct.Struct("<" + _scalar_code(value_type))
    return scalar.unpack_from(data, offset)[0], offset + scalar.size


def _read_gguf_string_array(data: mmap.mmap, offset: int, count: int) -> tuple[list[str], int]:
    # The hot loop of loading a 128k vocabulary: keep it to the bare minimum.
    # The caller has checked that the file can hold ``count`` strings.
    unpack_length = _U64.unpack_from
    items = [""] * count
    size = len(data)
    for i in range(count):
        (length,) = unpack_length(data, offset)
        offset += 8
        end = offset + length
        if end > size:
            raise IndexError("string array runs past the end of the file")
        items[i] = data[offset:end].decode("utf-8", "surrogateescape")
        offset = end
    return items, offset


def tokenizer_fields(reader: Any) -> dict[str, Any]:
    """Plain values of the tokenizer-related fields of a ``gguf.GGUFReader``."""
    return {name: plain_value(field) for name, field in reader.fields.items()
            if name.startswith("tokenizer.") or name.startswith("general.")}


def plain_value(value: Any) -> Any:
    """Turn a ``gguf.ReaderField``, numpy array or plain value into plain Python."""
    if hasattr(value, "parts") and hasattr(value, "types"):
        return _reader_field_value(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "surrogateescape")
    return value


def _reader_field_value(field: Any) -> Any:
    types = [int(t) for t in field.types]
    if not types:
        return None
    if types[0] == _GGUF_ARRAY:
        if len(types) > 2 and types[1] == _GGUF_ARRAY:
            # an array of arrays: no tokenizer key holds one; shown as such (the reader's
            # flat parts would otherwise read as one long array) so that it is refused
            return [[]]
        if types[-1] == _GGUF_STRING:
            return [bytes(field.parts[i]).decode("utf-8", "surrogateescape") for i in field.data]
        return [item for i in field.data for item in field.parts[i].tolist()]
    if types[0] == _GGUF_STRING:
        return bytes(field.parts[-1]).decode("utf-8", "surrogateescape")
    return field.parts[-1].tolist()[0]
