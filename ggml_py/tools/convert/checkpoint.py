"""A checkpoint's weights: ``*.safetensors`` (read here with numpy, memory-mapped) or
``pytorch_model*.bin`` (needs PyTorch), sharded by an index or not, each tensor read
only when its values are needed."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ggml_py.tools.convert.common import ConvertError, is_count, json_object


_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
              "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
              "BOOL": np.bool_}


def _safetensors_entry(info) -> tuple:
    """(numpy dtype, begin, end, shape) of a header entry; (None, ...) when malformed:
    an unknown dtype, offsets that are not two counts in order, a shape not of counts."""
    bad = (None, 0, 0, ())
    if not isinstance(info, dict):
        return bad
    dtype = _ST_DTYPES.get(info.get("dtype")) if isinstance(info.get("dtype"), str) else None
    offsets, shape = info.get("data_offsets"), info.get("shape")
    if (dtype is None or not isinstance(offsets, list) or len(offsets) != 2
            or not all(map(is_count, offsets)) or offsets[0] > offsets[1]
            or not isinstance(shape, list) or not all(map(is_count, shape))):
        return bad
    return dtype, offsets[0], offsets[1], tuple(shape)


@dataclass(frozen=True)
class CheckpointTensor:
    """A checkpoint's tensor, read when its values are needed, so that a conversion holds
    one tensor in memory at a time: its numpy-order shape now, float32 values from load()."""
    shape: tuple
    load: Callable[[], np.ndarray]

    def then(self, change: Callable[[np.ndarray], np.ndarray]) -> CheckpointTensor:
        """This tensor with `change` applied to its values when they are loaded."""
        return CheckpointTensor(self.shape, lambda: change(self.load()))


def _widened(array: np.ndarray, bf16: bool) -> np.ndarray:
    """float32 values of a stored array (BF16: its uint16 bits widened by a 16-bit shift)."""
    if bf16:
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return np.asarray(array, dtype=np.float32)


def read_safetensors(path: Path) -> Iterator[tuple[str, CheckpointTensor]]:
    """Yield (name, CheckpointTensor) from a .safetensors file (memory-mapped).

    The format is an 8-byte little-endian header length, a JSON header
    ``{name: {"dtype", "shape", "data_offsets": [begin, end]}}`` and the raw
    little-endian bytes; BF16 is widened to F32 by a 16-bit shift.
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            (n_header,) = struct.unpack("<Q", f.read(8) or b"\0" * 8)
            if n_header <= 0 or 8 + n_header > size:
                raise ConvertError(f"{path}: not a safetensors file (bad header length)")
            header = json.loads(f.read(n_header))
    except (json.JSONDecodeError, UnicodeDecodeError, struct.error):
        raise ConvertError(f"{path}: not a safetensors file (bad header)") from None
    if not isinstance(header, dict):
        raise ConvertError(f"{path}: not a safetensors file (the header is not a JSON object)")
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n_header)
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, begin, end, shape = _safetensors_entry(info)
        if dtype is None:
            raise ConvertError(f"{path}: tensor {name!r}: bad entry {info!r}")
        count = math.prod(shape)
        if end - begin != count * np.dtype(dtype).itemsize or end > len(data):
            raise ConvertError(f"{path}: tensor {name!r}: data size does not match its shape")
        array = data[begin:end].view(dtype).reshape(shape)
        yield name, CheckpointTensor(shape, lambda a=array, bf16=info["dtype"] == "BF16":
                                     _widened(a, bf16))


def read_pytorch_bin(path: Path) -> Iterator[tuple[str, CheckpointTensor]]:
    """Yield (name, CheckpointTensor) from a pytorch_model.bin (needs PyTorch; the file
    is loaded whole, its tensors widened to float32 one at a time)."""
    try:
        import torch
    except ImportError:
        raise ConvertError(f"{path}: reading pytorch_model.bin needs PyTorch "
                           "(pip install torch), or convert the checkpoint to safetensors") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a bad file
        raise ConvertError(f"{path}: cannot load ({type(e).__name__}: {e})") from None
    for name, tensor in state.items():
        yield name, CheckpointTensor(tuple(tensor.shape),
                                     lambda t=tensor: t.detach().to(torch.float32).numpy())


# (files, their index, reader), tried in this order
_WEIGHT_FORMATS = (("*.safetensors", "model.safetensors.index.json", read_safetensors),
                   ("pytorch_model*.bin", "pytorch_model.bin.index.json", read_pytorch_bin))


def _read_files(files: list[Path], reader) -> tuple[dict[str, CheckpointTensor], dict[str, Path]]:
    """({HF name: array}, {HF name: its file}) of `files`; a name in two files is an error
    (a stale copy beside the real weights must not win silently)."""
    weights: dict[str, CheckpointTensor] = {}
    source: dict[str, Path] = {}
    for f in files:
        for name, array in reader(f):
            if name in source:
                raise ConvertError(f"tensor {name!r} is in both {source[name].name} and {f.name}; "
                                   "remove the stale file")
            weights[name], source[name] = array, f
    return weights, source


def _read_indexed(index: Path, reader) -> dict[str, CheckpointTensor]:
    """The tensors of a sharded checkpoint: exactly the files the index's weight_map names,
    each tensor in the file it names, and no tensor it does not list."""
    weight_map = json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise ConvertError(f"{index}: no weight_map of tensor names to file names")
    files = sorted({index.parent / f for f in weight_map.values()})
    for f in files:
        if not f.is_file():
            raise ConvertError(f"{index}: its weight_map names {f.name}, which is missing")
    weights, source = _read_files(files, reader)
    for name, fname in weight_map.items():
        if source.get(name) != index.parent / fname:
            raise ConvertError(f"{index}: tensor {name!r} is not in {fname}, where its weight_map puts it")
    extra = sorted(weights.keys() - weight_map.keys())
    if extra:
        raise ConvertError(f"{index}: tensor {extra[0]!r} of {source[extra[0]].name} is not in its weight_map")
    return weights


def read_weights(model_dir: Path) -> dict[str, CheckpointTensor]:
    """Every tensor of the checkpoint, {HF name: CheckpointTensor}: with an index
    (model.safetensors.index.json) the files it names, else all *.safetensors files;
    else the same for pytorch_model*.bin (pytorch_model.bin.index.json)."""
    for pattern, index_name, reader in _WEIGHT_FORMATS:
        if (model_dir / index_name).is_file():
            return _read_indexed(model_dir / index_name, reader)
        files = sorted(model_dir.glob(pattern))
        if files:
            return _read_files(files, reader)[0]
    raise ConvertError(f"{model_dir}: no weights (*.safetensors or pytorch_model.bin)")


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The files of a checkpoint directory that ``convert`` reads."""
    names = ("config.json", "tokenizer.model", "tokenizer.json", "tokenizer_config.json",
             "added_tokens.json", *(index for _, index, _ in _WEIGHT_FORMATS))
    files = [model_dir / n for n in names]
    files += [*model_dir.glob("*.safetensors"), *model_dir.glob("pytorch_model*.bin")]
    return [f for f in files if f.is_file()]
