"""Open a GGUF model file: metadata, and weights used in place (memory-mapped).

`gguf.GGUFReader` maps the file; each weight is a numpy view of the mapping, which
`Context.from_buffer` wraps without a copy, so the weights a forward pass never
touches never enter memory. GGUF stores ggml `ne` order for tensor shapes; the
shapes here are numpy order (reversed).

Every problem with a file becomes one `ModelLoadError` naming the file and the
problem; command-line programs print its message and exit non-zero.
"""
import os
from dataclasses import dataclass

import numpy as np

from ggml_py.tensor import row_bytes, type_traits
from ggml_py.types import Type

REQUIRED = object()

# What a weight is used for decides which kernels its type needs.
USE_MATMUL = "matmul"      # left operand of mul_mat: needs a dot product
USE_ROWS = "rows"          # get_rows (embeddings): needs to_float
USE_NORM = "norm"          # element-wise multiplier: F32 (small; converted if F16/BF16)


class ModelLoadError(ValueError):
    """A model file that cannot be used: message is '<file>: <problem>'."""


@dataclass(frozen=True)
class Weight:
    """One tensor of the file: numpy-order shape and its bytes, in place."""
    name: str
    type: Type
    shape: tuple
    data: np.ndarray     # a read-only view of the mapped file (or a small converted copy)

    @property
    def nbytes(self):
        return self.data.nbytes


def _reader_class():
    """gguf.GGUFReader, with its per-item read made ~3x cheaper.

    The reader parses every metadata item (32k-128k vocabulary strings) with
    one numpy slice each; slicing the np.memmap subclass costs most of that
    time. Reading through a plain ndarray view of the same mapping gives the
    same arrays, still memory-mapped.
    """
    import gguf

    class Reader(gguf.GGUFReader):
        _itemsizes = {}

        def _get(self, offset, dtype, count=1, override_order=None):
            plain = self.__dict__.get("_plain")
            if plain is None or plain.base is not self.data:
                plain = self.__dict__["_plain"] = self.data.view(np.ndarray)
            count = int(count)
            itemsize = self._itemsizes.get(dtype)
            if itemsize is None:
                itemsize = self._itemsizes[dtype] = np.dtype(dtype).itemsize
            arr = plain[offset:offset + itemsize * count].view(dtype)[:count]
            order = self.byte_order if override_order is None else override_order
            return arr if order == "I" else arr.view(arr.dtype.newbyteorder(order))

    return Reader if hasattr(gguf.GGUFReader, "_get") else gguf.GGUFReader


def _gguf_type_name(raw):
    import gguf
    try:
        return gguf.GGMLQuantizationType(raw).name
    except ValueError:
        return f"type id {raw}"


class GGUFModelFile:
    """A GGUF file opened for inference: `get(key)` metadata, `weight(name)` tensors."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self.reader = self._open(self.path)
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.architecture = self.get("general.architecture", type=str)

    def _open(self, path):
        if not os.path.exists(path):
            raise ModelLoadError(f"{path}: no such file")
        if os.path.isdir(path):
            raise ModelLoadError(f"{path}: is a directory, not a GGUF file")
        try:
            with open(path, "rb") as f:
                magic = f.read(4)
        except OSError as e:
            raise ModelLoadError(f"{path}: cannot read ({e.strerror})") from None
        if magic != b"GGUF":
            raise ModelLoadError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        try:
            reader = _reader_class()(path)
        except Exception as e:   # the reader reports truncation as ValueError, IndexError, ...
            raise ModelLoadError(f"{path}: truncated or corrupt GGUF file ({_short(e)})") from None
        size = os.path.getsize(path)
        for t in reader.tensors:
            if t.data_offset + t.n_bytes > size:
                raise ModelLoadError(f"{path}: truncated: tensor {t.name!r} ends at byte "
                                     f"{t.data_offset + t.n_bytes}, the file has {size}")
        return reader

    def error(self, problem):
        """A ModelLoadError about this file."""
        return ModelLoadError(f"{self.path}: {problem}")

    # ---- metadata -------------------------------------------------------------

    def has(self, key):
        return key in self.reader.fields

    def get(self, key, default=REQUIRED, type=None):
        """Metadata value of `key` (plain Python), or default; `type` checks/converts it."""
        field = self.reader.fields.get(key)
        if field is None:
            if default is REQUIRED:
                raise self.error(f"missing metadata key {key!r}")
            return default
        value = field.contents()
        if type is not None:
            try:
                if type is str and not isinstance(value, str):
                    raise TypeError
                value = type(value)
            except (TypeError, ValueError):
                raise self.error(f"metadata {key!r} = {value!r} is not {type.__name__}") from None
        return value

    def metadata(self):
        """All metadata as plain values (large arrays included)."""
        return {k: f.contents() for k, f in self.reader.fields.items()}

    # ---- tensors --------------------------------------------------------------

    def has_tensor(self, name):
        return name in self.tensors

    def weight(self, name, shape, use=USE_MATMUL, required=True):
        """Weight `name`, checked against numpy-order `shape` and usable for `use`.

        Returns None if it is absent and not required.
        """
        t = self.tensors.get(name)
        if t is None:
            if required:
                raise self.error(f"missing tensor {name!r}")
            return None
        raw = int(t.tensor_type)
        try:
            wtype = Type(raw)
        except ValueError:
            raise self.error(f"tensor {name!r} has type {_gguf_type_name(raw)}, "
                             f"which ggml_py does not support") from None
        file_shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if file_shape != tuple(shape):
            raise self.error(f"tensor {name!r} has shape {file_shape}, expected {tuple(shape)}")
        data = t.data
        if use == USE_NORM and wtype != Type.F32:
            if wtype not in (Type.F16, Type.BF16):
                raise self.error(f"tensor {name!r} is {wtype.name}; norm weights must be F32, "
                                 f"F16 or BF16")
            data, wtype = self._to_f32(t, wtype), Type.F32
        traits = type_traits(wtype)
        if use == USE_MATMUL and not traits["has_vec_dot"]:
            raise self.error(f"tensor {name!r} is {wtype.name}: this build has no dot-product "
                             f"kernel for {wtype.name}")
        if use == USE_ROWS and not traits["has_to_float"]:
            raise self.error(f"tensor {name!r} is {wtype.name}: this build cannot convert "
                             f"{wtype.name} rows to F32")
        try:
            expected = row_bytes(wtype, file_shape[-1]) * int(np.prod(file_shape[:-1], dtype=np.int64))
        except ValueError as e:
            raise self.error(f"tensor {name!r}: {e}") from None
        if data.nbytes != expected:
            raise self.error(f"tensor {name!r} has {data.nbytes} bytes, {wtype.name} "
                             f"{file_shape} needs {expected}")
        return Weight(name, wtype, file_shape, data)

    @staticmethod
    def _to_f32(t, wtype):
        if wtype == Type.F16:
            return np.asarray(t.data, np.float16).astype(np.float32)
        raw = np.asarray(t.data).view(np.uint16).astype(np.uint32) << 16
        return raw.view(np.float32).reshape(t.data.shape)

    @property
    def weights_nbytes(self):
        """Bytes of all tensors in the file."""
        return sum(int(t.n_bytes) for t in self.reader.tensors)

    @property
    def n_params(self):
        """Elements of all tensors in the file."""
        return sum(int(t.n_elements) for t in self.reader.tensors)

    def file_type_name(self):
        """The file type, like llama.cpp's ftype ('Q4_K_M', 'F16', ...): general.file_type
        when the file records it, else the weight type holding most bytes."""
        import gguf
        ftype = self.get("general.file_type", default=None)
        if ftype is not None:
            try:
                return gguf.LlamaFileType(int(ftype)).name.replace("MOSTLY_", "").replace("ALL_", "")
            except ValueError:
                pass
        counts = {}
        for t in self.reader.tensors:
            if len(t.shape) >= 2:
                name = _gguf_type_name(int(t.tensor_type))
                counts[name] = counts.get(name, 0) + int(t.n_bytes)
        return max(counts, key=counts.get) if counts else "?"

    def tokenizer(self):
        """The file's tokenizer (ggml_py.tokenizer.Tokenizer)."""
        from ggml_py.tokenizer import Tokenizer
        try:
            return Tokenizer.from_gguf(self.reader)
        except ModelLoadError:
            raise
        except ValueError as e:
            raise self.error(f"tokenizer: {_short(e)}") from None


def _short(e):
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
