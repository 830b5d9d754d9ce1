"""Open a GGUF model file: metadata, and weights used in place (memory-mapped).

`gguf.GGUFReader` maps the file; each weight is a numpy view of the mapping, which
`Context.from_buffer` wraps without a copy, so the weights a forward pass never
touches never enter memory. GGUF stores ggml `ne` order for tensor shapes; the
shapes here are numpy order (reversed).

Every problem with a file becomes one `ModelLoadError` naming the file and the
problem; command-line programs print its message and exit non-zero.
"""
import contextlib
import functools
import os
import stat
import warnings
import sys
from dataclasses import dataclass

import numpy as np

from ggml_py.core.types import Type, data_alignment, row_bytes, type_traits

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

    @property
    def nbytes(self):
        """Bytes of data: in the file, or of the F32 copy of a converted norm weight."""
        return self.data.nbytes


class _FileProblem(Exception):
    """A problem the reader's checks found in the file's header (message: the problem)."""


@functools.lru_cache(maxsize=None)
def _reader_class():
    """gguf.GGUFReader, checking the header as llama.cpp's gguf reader does, and with
    its per-item read made ~3x cheaper.

    The checks run before the reader builds its tensor views, so that each problem
    gets its own message (the reader itself stops at the first numpy error, or
    accepts overlapping and misaligned tensor data).

    The reader parses every metadata item (32k-128k vocabulary strings) with
    one numpy slice each; slicing the np.memmap subclass costs most of that
    time. Reading through a plain ndarray view of the same mapping gives the
    same arrays, still memory-mapped.
    """
    import gguf

    array_type = int(gguf.GGUFValueType.ARRAY)
    value_types = frozenset(int(t) for t in gguf.GGUFValueType)

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
            raw = plain[offset:offset + itemsize * count]
            if len(raw) < itemsize * count:   # (the reader would go on, item by item, past
                # the end, or numpy would fail to view a few odd bytes)
                what = "1 item" if count == 1 else f"{count} items"
                raise _FileProblem(f"truncated or corrupt GGUF file ({what} of "
                                   f"{np.dtype(dtype).name} at byte {offset} "
                                   f"run{'s' if count == 1 else ''} past its end)")
            arr = raw.view(dtype)
            order = self.byte_order if override_order is None else override_order
            return arr if order == "I" else arr.view(arr.dtype.newbyteorder(order))

        def _get_field_parts(self, orig_offs, raw_type):
            # an array's count is checked against the bytes left before the reader
            # walks it item by item (2^40 one-byte items would take hours)
            raw_type = int(raw_type)   # a numpy scalar against an enum is slow (and numpy
            # drops a KeyboardInterrupt raised while it compares them)
            if raw_type not in value_types:    # (called for every item of an array too)
                raise _bad_value_type(raw_type, orig_offs - 4)
            if raw_type == array_type:
                item_type = int(self._get(orig_offs, np.uint32)[0])
                if item_type not in value_types:
                    raise _bad_value_type(item_type, orig_offs)
                count = int(self._get(orig_offs + 4, np.uint64)[0])
                scalar = self.gguf_scalar_to_np.get(item_type)
                least = np.dtype(scalar).itemsize if scalar is not None else 8  # a string's length
                if count * least > len(self.data) - (orig_offs + 12):
                    raise _FileProblem(f"truncated or corrupt GGUF file (an array of {count} "
                                       f"items at byte {orig_offs} runs past its end)")
            return super()._get_field_parts(orig_offs, raw_type)

        def _push_field(self, field, skip_sum=False):
            if field.name in self.fields:
                raise _FileProblem(f"duplicate metadata key {field.name!r}")
            return super()._push_field(field, skip_sum)

        def _build_tensor_info(self, offs, count):
            # called once the metadata is read, before the reader uses general.alignment
            field = self.fields.get("general.alignment")
            if field is not None:
                value = field.contents()
                if field.types != [gguf.GGUFValueType.UINT32] or value == 0 or value & (value - 1):
                    raise _FileProblem(f"general.alignment = {_shown(field, value)} must be a "
                                       f"UINT32 power of two")
            return super()._build_tensor_info(offs, count)

        def _build_tensors(self, start_offs, fields):
            _check_tensor_infos(fields, int(self.alignment), start_offs, self.data.size)
            return super()._build_tensors(start_offs, fields)

    return Reader


def _bad_value_type(type_id, offset):
    """The error for a metadata value type id (at byte `offset`) that GGUF does not have."""
    return _FileProblem(f"truncated or corrupt GGUF file (the metadata value type at byte "
                        f"{offset} is {type_id}, which GGUF does not have)")


def _check_tensor_infos(fields, alignment, data_start, file_size):
    """Tensor infos as llama.cpp's gguf reader wants them: unique names, known types,
    whole blocks per row, and data laid out in order, each tensor at the running sum
    of the sizes before it padded to the alignment; then no tensor past the file's end."""
    import gguf
    seen, expected = set(), 0
    for field in fields:
        name, dims, raw_type, offset = field.name, field.parts[3], field.parts[4], field.parts[5]
        if name in seen:
            raise _FileProblem(f"duplicate tensor name {name!r}")
        seen.add(name)
        raw = int(raw_type[0])
        try:
            qtype = gguf.GGMLQuantizationType(raw)
            block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise _FileProblem(f"tensor {name!r} has type id {raw}, a tensor type ggml_py does "
                               f"not know") from None
        ne = [int(d) for d in dims.tolist()] or [1]   # no dimensions: one value, as llama.cpp
        if len(ne) > 4:
            raise _FileProblem(f"tensor {name!r} has {len(ne)} dimensions (at most 4)")
        if ne[0] % block:
            raise _FileProblem(f"tensor {name!r} of type {qtype.name} has {ne[0]} elements per "
                               f"row, not a multiple of its block size {block}")
        if int(offset[0]) != expected:
            raise _FileProblem(f"tensor {name!r} has offset {int(offset[0])}, expected {expected} "
                               f"(tensor data must follow in order, aligned to {alignment} bytes)")
        nbytes = int(np.prod(ne, dtype=object)) // block * type_size
        if data_start + expected + nbytes > file_size:
            raise _FileProblem(f"truncated: tensor {name!r} ends at byte "
                               f"{data_start + expected + nbytes}, the file has {file_size}")
        expected += -(-nbytes // alignment) * alignment


def layout_problem(reader):
    """Why the file `reader` (a gguf.GGUFReader) opened cannot be used alone, as llama.cpp
    cannot use it here, or None: a byte order not this host's (its weights would be read
    byte-swapped), or one shard of a split model (the others hold the rest)."""
    if reader.byte_order != "I":
        return (f"{reader.endianess.name.lower()}-endian GGUF file: ggml_py, like llama.cpp, "
                f"reads only files in this host's byte order ({sys.byteorder}-endian)")
    field = reader.fields.get("split.count")
    count = field.contents() if field is not None and len(field.types) == 1 else 1
    if isinstance(count, int) and count > 1:
        return (f"one shard of a split GGUF model (split.count = {count}): split GGUF files are "
                f"not supported; merge them first (llama.cpp's gguf-split --merge)")
    return None


def _shown(field, value):
    """A metadata value for a message: short, with its GGUF type."""
    types = [t.name for t in field.types]
    if len(types) > 1:
        return f"an array of {len(field.data)} {types[-1]}"
    text = repr(value)
    return f"{text[:40]}... ({types[0]})" if len(text) > 40 else f"{text} ({types[0]})"


@functools.lru_cache(maxsize=None)
def _value_types():
    """GGUF value types a `get(key, type=...)` accepts, by Python type: as llama.cpp, a
    key of another type is refused (here integers of any width are accepted as int,
    and integers or floats as float)."""
    from gguf import GGUFValueType as V
    ints = {V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64}
    return {int: ints, float: ints | {V.FLOAT32, V.FLOAT64}, str: {V.STRING}, bool: {V.BOOL}}


def _gguf_type_name(raw):
    import gguf
    try:
        return gguf.GGMLQuantizationType(raw).name
    except ValueError:
        return f"type id {raw}"


GGUF_VERSIONS = (2, 3)    # what llama.cpp reads (version 1 files predate its gguf reader)


def _gguf_version(raw):
    """The version of a GGUF header's 4 version bytes, in the file's byte order (a
    big-endian file's version reads as a multiple of 65536 the other way); None: too short."""
    if len(raw) < 4:
        return None
    version = int.from_bytes(raw, "little")
    return int.from_bytes(raw, "big") if version & 0xFFFF == 0 else version


def open_reader(path, use_mmap=True):
    """A gguf.GGUFReader of the GGUF file `path`, its header checked as llama.cpp checks
    it (layout_problem and the reader's own checks); ModelLoadError saying why not.

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
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read ({e.strerror})") from None
    magic = head[:4]
    if magic != b"GGUF":
        raise ModelLoadError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
    version = _gguf_version(head[4:])
    if version is not None and version not in GGUF_VERSIONS:
        raise ModelLoadError(f"{path}: GGUF version {version} is not supported (only "
                             f"{' and '.join(map(str, GGUF_VERSIONS))}, as llama.cpp)")
    try:
        with contextlib.nullcontext(path) if use_mmap else _in_memory(path) as mapped:
            reader = _reader_class()(mapped)
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read ({e.strerror})") from None
    except _FileProblem as e:
        raise ModelLoadError(f"{path}: {e}") from None
    except UnicodeDecodeError as e:   # the reader decodes key and tensor names
        raise ModelLoadError(f"{path}: truncated or corrupt GGUF file (a key or tensor name is "
                             f"not UTF-8 text: byte 0x{e.object[e.start]:02x})") from None
    except Exception as e:   # the reader reports truncation as ValueError, IndexError, ...
        raise ModelLoadError(f"{path}: truncated or corrupt GGUF file ({_short(e)})") from None
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


def field_contents(field, path):
    """A metadata field's value (gguf's contents()); ModelLoadError naming the file and
    the key for a string that is not UTF-8."""
    try:
        return field.contents()
    except UnicodeDecodeError as e:
        raise ModelLoadError(f"{path}: metadata {field.name!r} is not UTF-8 text "
                             f"(byte {e.object[e.start]:#04x} at {e.start})") from None


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
        self._loaded_stat = _identity(os.stat(self.path)) if self.use_mmap else None
        if self.use_mmap:
            _warn_if_others_may_write(self.path)
        self.shapes_only = shapes_only
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.used = set()          # names of the tensors weight() has handed out
        self.architecture = self.get("general.architecture", type=str)

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
            now = _identity(os.stat(self.path))
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
        value = field_contents(field, self.path)
        if type is None:
            return value
        if field.types and field.types[0] in _value_types()[type]:
            return type(value)
        raise self.error(f"metadata {key!r} = {_shown(field, value)} is not {type.__name__}")

    def array_len(self, key):
        """Number of items of array key `key`; None if it is absent or not an array."""
        import gguf
        field = self.reader.fields.get(key)
        if field is None or field.types[:1] != [gguf.GGUFValueType.ARRAY]:
            return None
        return len(field.data)

    def metadata(self):
        """All metadata as plain values (large arrays included)."""
        return {k: field_contents(f, self.path) for k, f in self.reader.fields.items()}

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
        raw = int(t.tensor_type)
        try:
            wtype = Type(raw)
        except ValueError:
            if not self.shapes_only:
                raise self.error(f"tensor {name!r} has type {_gguf_type_name(raw)}, "
                                 f"which ggml_py does not support") from None
        file_shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if file_shape != tuple(shape):
            raise self.error(f"tensor {name!r} has shape {file_shape}, expected {tuple(shape)}")
        if self.shapes_only:
            self.used.add(name)
            return Weight(name, None, file_shape, None)
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
    def _to_f32(t, wtype):
        """An F16 or BF16 tensor as a new F32 array (numpy-order shape)."""
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if wtype == Type.F16:
            return np.asarray(t.data, np.float16).astype(np.float32).reshape(shape)
        # the reader hands BF16 over as raw bytes: (2n,) uint8
        raw = np.ascontiguousarray(t.data).view(np.uint16).astype(np.uint32) << 16
        return raw.view(np.float32).reshape(shape)

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
                name = _gguf_type_name(int(t.tensor_type))
                counts[name] = counts.get(name, 0) + int(t.n_bytes)
        return max(counts, key=counts.get) if counts else "?"


def _short(e):
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
