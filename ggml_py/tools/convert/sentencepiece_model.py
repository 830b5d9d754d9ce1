"""A SentencePiece ``tokenizer.model`` read with a small protobuf reader, so that
converting does not need the ``sentencepiece`` package."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Iterator

from ggml_py.tools.convert.common import ConvertError


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _proto_fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """Yield (field number, value) of a protobuf message; value is int or bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = int.from_bytes(buf[pos:pos + 8], "little"), pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = int.from_bytes(buf[pos:pos + 4], "little"), pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > len(buf):
            raise ValueError("truncated message")
        yield field, value


def _int32(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def read_sentencepiece_model(path: Path) -> dict:
    """Parse the fields of a SentencePiece ``ModelProto`` that GGUF needs.

    ModelProto: pieces = 1 (piece 1, score 2, type 3), trainer_spec = 2
    (model_type 3, byte_fallback 35, unk/bos/eos/pad id 40-43), normalizer_spec = 3
    (add_dummy_prefix 3). proto2 defaults apply to absent fields.
    """
    buf = path.read_bytes()
    model = {"pieces": [], "scores": [], "types": [], "model_type": 1, "byte_fallback": False,
             "unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": -1, "add_dummy_prefix": True}
    try:
        for field, value in _proto_fields(buf):
            if field == 1:
                piece, score, kind = "", 0.0, 1
                for f, v in _proto_fields(value):
                    if f == 1:
                        piece = v.decode("utf-8")
                    elif f == 2:
                        score = struct.unpack("<f", v.to_bytes(4, "little"))[0]
                    elif f == 3:
                        kind = v
                model["pieces"].append(piece)
                model["scores"].append(score)
                model["types"].append(kind)
            elif field == 2:
                names = {3: "model_type", 35: "byte_fallback", 40: "unk_id", 41: "bos_id",
                         42: "eos_id", 43: "pad_id"}
                for f, v in _proto_fields(value):
                    if f in names:
                        model[names[f]] = bool(v) if f == 35 else _int32(v)
            elif field == 3:
                for f, v in _proto_fields(value):
                    if f == 3:
                        model["add_dummy_prefix"] = bool(v)
    except (ValueError, UnicodeDecodeError, AttributeError, TypeError) as e:
        raise ConvertError(f"{path}: not a SentencePiece model ({e})") from None
    if not model["pieces"]:
        raise ConvertError(f"{path}: not a SentencePiece model (no pieces)")
    return model
