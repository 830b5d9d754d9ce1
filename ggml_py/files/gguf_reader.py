"""Open a GGUF model file: metadata, and weights used in place (memory-mapped).

open_reader reads the file with the one GGUF reader (files/gguf_file.py), which maps
it; each weight is a numpy view of the mapping, which `Context.from_buffer` wraps
without a copy, so the weights a forward pass never touches never enter memory.
Shapes are numpy order (GGUF stores ggml's `ne`, reversed).

Every problem with a file becomes one `ModelLoadError` naming the file and the
problem; command-line programs print its message and exit non-zero.
"""
import contextlib
import os
import stat
import warnings
import sys
from dataclasses import dataclass

import numpy as np

from ggml_py.core.types import Type, data_alignment, row_bytes, type_traits
from ggml_py.files import gguf_file as gf

REQUIRED = object()

# What a weight is used for decides which kernels its type needs.
USE_MATMUL = "matmul"      # left operand of mul_mat: needs a dot product
USE_ROWS = "rows"          # get_rows (embeddings): needs to_float
USE_NORM = "norm"          # element-wise multiplier: F32 (small; converted if F16/BF16)


class ModelLoadError(ValueError):
    """A model file that cannot be used: message is '<file>: <problem>'."""


class ModelFileWarning(UserWarning):
    """A memory-mapped model file that others may change while it is in use."""


@dataclass(frozen=True)
class Weight:
    """One tensor of the file: numpy-order shape and its bytes, in place."""
    name: str
    type: Type
    shape: tuple
    data: np.ndarray     # a read-only view of the mapped file (or a small converted copy)
    rows8: np.ndarray = None   # Q4_0, Q4_K, Q5_K, Q6_K: the same weights interleaved for MUL_MAT (gg.interleave_rows8)

    @property
    def nbytes(self):
        """Bytes of data: in the file, or of the F32 copy of a converted norm weight."""
        return self.data.nbytes


def layout_problem(reader):
    """Why the file `reader` (a GGUFFile) cannot be used alone, as llama.cpp cannot use
    it here, or None: a byte order not this host's (its weights would be read
    byte-swapped), or one shard of a split model (the others hold the rest)."""
    if reader.byte_order != sys.byteorder:
        return (f"{reader.byte_order}-endian GGUF file: ggml_py, like llama.cpp, reads only "
                f"files in this host's byte order ({sys.byteorder}-endian)")
    field = reader.fields.get("split.count")
    count = field.value if field is not None else 1
    if isinstance(count, int) and count > 1:
        return (f"one shard of a split GGUF model (split.count = {count}): split GGUF files are "
                f"not supported; merge them first (llama.cpp's gguf-split --merge)")
    return None


# GGUF value types a `get(key, type=...)` accepts, by Python type: as llama.cpp, a key of
# another type is refused (here integers of any width are accepted as int, and integers
# or floats as float)
_INTS = {gf.UINT8, gf.INT8, gf.UINT16, gf.INT16, gf.UINT32, gf.INT32, gf.UINT64, gf.INT64}
_VALUE_TYPES = {int: _INTS, float: _INTS | {gf.FLOAT32, gf.FLOAT64}, str: {gf.STRING},
                bool: {gf.BOOL}}
_NUMPY_DTYPES = {Type.F32: np.float32, Type.F16: np.float16}


def open_reader(path, use_mmap=True):
    """The GGUFFile of the GGUF file `path`, checked as llama.cpp checks it (the reader's
    checks, then layout_problem); ModelLoadError saying why not.

    use_mmap False: the file is first read whole into memory of this process's own
    (a memfd), which the reader maps instead, so that nothing done to the file later
    reaches the loaded model."""
    if not os.path.exists(path):
        if os.path.lexists(path):
            raise ModelLoadError(f"{path}: a symbolic link that leads to no file (its target "
                                 f"is missing, or the links form a loop)")
        raise ModelLoadError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ModelLoadError(f"{path}: is a directory, not a GGUF file")
    if not os.path.isfile(path):   # a FIFO would block the open; it cannot be memory-mapped
        raise ModelLoadError(f"{path}: not a regular file (a GGUF file is memory-mapped)")
    try:
        with contextlib.nullcontext(path) if use_mmap else _in_memory(path) as mapped:
            reader = gf.GGUFFile(mapped)
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read ({e.strerror})") from None
    except gf.GGUFError as e:
        raise ModelLoadError(f"{path}: {e}") from None
    problem = layout_problem(reader)
    if problem:
        raise ModelLoadError(f"{path}: {problem}")
    return reader


@contextlib.contextmanager
def _in_memory(path):
    """A path that maps a copy of file `path` held in this process's memory (a memfd:
    no file system path leads to it; a mapping made within the block keeps it alive)."""
    if not hasattr(os, "memfd_create"):
        raise ModelLoadError(f"{path}: loading without mmap needs memfd_create (Linux)")
    copy = os.memfd_create("ggml_py-model", os.MFD_CLOEXEC)
    try:
        with open(path, "rb") as src:
            size, done = os.fstat(src.fileno()).st_size, 0
            while done < size:
                sent = os.sendfile(copy, src.fileno(), done, size - done)
                if sent == 0:    # the file shrank while it was read
                    raise ModelLoadError(f"{path}: the file changed while it was read")
                done += sent
        yield f"/proc/self/fd/{copy}"
    finally:
        os.close(copy)


def _identity(st):
    """(device, inode, size, modification time) of an os.stat result."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _warn_if_others_may_write(path):
    """ModelFileWarning when users other than the file's owner and root may write it,
    or the owner is another user: its mapped weights could change under a running model."""
    st = os.stat(path)
    owner_is_other = st.st_uid not in (0, os.geteuid()) and st.st_mode & stat.S_IWUSR
    if st.st_mode & stat.S_IWOTH or owner_is_other:
        who = "every user" if st.st_mode & stat.S_IWOTH else f"its owner (uid {st.st_uid})"
        warnings.warn(f"{path}: {who} may write this file, and its weights are memory-mapped: "
                      f"a change to it while the model runs gives wrong results or a bus error "
                      f"(--no-mmap reads it into memory)", ModelFileWarning, stacklevel=3)


def field_contents(key, field, path):
    """A metadata field's value; ModelLoadError naming the file and the key for a string
    (or a string of an array) that is not UTF-8 text."""
    value = field.value
    texts = [value] if field.type == gf.STRING else value if field.item_type == gf.STRING else ()
    for text in texts:
        if not text.isascii():   # the reader keeps bytes that are not UTF-8 as surrogates
            raw = text.encode("utf-8", "surrogateescape")
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ModelLoadError(f"{path}: metadata {key!r} is not UTF-8 text "
                                     f"(byte {raw[e.start]:#04x} at {e.start})") from None
    return value


class GGUFModelFile:
    """A GGUF file opened for inference: `get(key)` metadata, `weight(name)` tensors.

    The weights are memory-mapped (use_mmap, the default): a change made to the file
    in place while it is in use reaches them. check_unchanged() tells, and a file that
    users other than its owner (and root) may write gives a ModelFileWarning at load.
    """

    def __init__(self, path, reader=None, shapes_only=False, use_mmap=True):
        """reader: the file already opened with open_reader (None: open it now);
        shapes_only: weight() checks names and shapes, not whether this build can run
        the weights' types (a file whose weights are to be re-typed); use_mmap False:
        the whole file is read into memory (open_reader), and later changes to it do
        not matter."""
        self.path = os.fspath(path)
        self.use_mmap = use_mmap or reader is not None
        self.reader = open_reader(self.path, use_mmap) if reader is None else reader
        self._stat_path = os.path.abspath(self.path)    # the same file after a chdir
        self._loaded_stat = _identity(os.stat(self._stat_path)) if self.use_mmap else None
        if self.use_mmap:
            _warn_if_others_may_write(self.path)
        self.shapes_only = shapes_only
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.used = set()          # names of the tensors weight() has handed out
        self.architecture = self.get("general.architecture", type=str)

    def release_pages(self, array):
        """Drop the mapped pages wholly inside `array` (a weight's data) from this process's
        memory; they are read from the file again if used (GGUFFile.release_pages)."""
        self.reader.release_pages(array)

    def error(self, problem):
        """A ModelLoadError about this file."""
        return ModelLoadError(f"{self.path}: {problem}")

    def check_unchanged(self):
        """ModelLoadError if the mapped file was changed in place since it was loaded
        (truncated: reading the weights would die of SIGBUS; rewritten: they would be
        other numbers). A file replaced by a rename, or removed, leaves the mapped one
        whole: not an error."""
        if not self.use_mmap:
            return
        try:
            now = _identity(os.stat(self._stat_path))
        except OSError:
            return
        was = self._loaded_stat
        if now[:2] == was[:2] and now != was:
            raise self.error(f"the file was changed in place since it was loaded (size "
                             f"{was[2]:,} -> {now[2]:,} bytes, modification time "
                             f"{'changed' if now[3] != was[3] else 'kept'}); its memory-mapped "
                             f"weights are no longer the model's: load it again, or load with "
                             f"--no-mmap (use_mmap=False) to keep the weights in memory")

    # ---- metadata -------------------------------------------------------------

    def has(self, key):
        """Whether metadata key `key` is present."""
        return key in self.reader.fields

    def get(self, key, default=REQUIRED, type=None):
        """Metadata value of `key` (plain Python), or default.

        type: int, float, str or bool: the key's GGUF type must be one of that kind
        (int: an integer type; float: an integer or float type), else ModelLoadError.
        """
        field = self.reader.fields.get(key)
        if field is None:
            if default is REQUIRED:
                raise self.error(f"missing metadata key {key!r}")
            return default
        value = field_contents(key, field, self.path)
        if type is None:
            return value
        if field.type in _VALUE_TYPES[type]:
            return type(value)
        raise self.error(f"metadata {key!r} = {field.describe()} is not {type.__name__}")

    def array_len(self, key):
        """Number of items of array key `key`; None if it is absent or not an array."""
        field = self.reader.fields.get(key)
        if field is None or field.type != gf.ARRAY:
            return None
        return len(field.value)

    def metadata(self):
        """All metadata as plain values (large arrays included)."""
        return {k: field_contents(k, f, self.path) for k, f in self.reader.fields.items()}

    # ---- tensors --------------------------------------------------------------

    def has_tensor(self, name):
        """Whether the file has a tensor named `name`."""
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
        try:
            wtype = Type(t.type)
        except ValueError:
            if not self.shapes_only:
                raise self.error(f"tensor {name!r} has type {gf.tensor_type_name(t.type)}, "
                                 f"which ggml_py does not support") from None
        file_shape = t.shape
        if file_shape != tuple(shape):
            raise self.error(f"tensor {name!r} has shape {file_shape}, expected {tuple(shape)}")
        if self.shapes_only:
            self.used.add(name)
            return Weight(name, None, file_shape, None)
        data = t.data     # its bytes; F32 and F16 as their numpy values
        if wtype in _NUMPY_DTYPES:
            data = data.view(_NUMPY_DTYPES[wtype]).reshape(file_shape)
        if use == USE_NORM and wtype != Type.F32:
            if wtype not in (Type.F16, Type.BF16):
                raise self.error(f"tensor {name!r} is {wtype.name}; norm weights must be F32, "
                                 f"F16 or BF16")
            data, wtype = self._to_f32(data, wtype, file_shape), Type.F32
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
        if data.ctypes.data % data_alignment(wtype):
            # a file aligned to less than the type needs (general.alignment 1 or 2): the
            # kernels read through typed pointers, so this weight gets an aligned copy
            data = data.copy()
        self.used.add(name)
        return Weight(name, wtype, file_shape, data)

    def unused_tensors(self):
        """Names of the file's tensors weight() has not handed out, in file order."""
        return [t.name for t in self.reader.tensors if t.name not in self.used]

    @staticmethod
    def _to_f32(data, wtype, shape):
        """F16 values or BF16 bytes (uint8) as a new F32 array of numpy `shape`."""
        if wtype == Type.F16:
            return data.astype(np.float32)
        raw = data.view(np.uint16).astype(np.uint32) << 16    # BF16: float32's top half
        return raw.view(np.float32).reshape(shape)

    @property
    def weights_nbytes(self):
        """Bytes of all tensors in the file."""
        return sum(t.nbytes for t in self.reader.tensors)

    @property
    def n_params(self):
        """Elements of all tensors in the file."""
        return sum(t.n_elements for t in self.reader.tensors)

    def file_type_name(self):
        """The file type, like llama.cpp's ftype ('Q4_K_M', 'F16', ...): general.file_type
        when the file records it ('unknown type' if it is not a known integer), else the
        weight type holding most bytes."""
        import gguf
        if self.has("general.file_type"):
            try:
                ftype = gguf.LlamaFileType(self.get("general.file_type", type=int))
            except ValueError:    # ModelLoadError (not an integer) or an unknown value
                return "unknown type"
            return ftype.name.replace("MOSTLY_", "").replace("ALL_", "")
        counts = {}
        for t in self.reader.tensors:
            if len(t.shape) >= 2:
                name = gf.tensor_type_name(t.type)
                counts[name] = counts.get(name, 0) + t.nbytes
        return max(counts, key=counts.get) if counts else "?"

