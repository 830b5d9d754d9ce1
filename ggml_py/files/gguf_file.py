"""The GGUF reader: a file's header, metadata and tensor infos read in one pass and
checked as llama.cpp's gguf reader checks them; the tensor data left where it is.

    f = GGUFFile("model.gguf")
    f.fields["llama.block_count"].value       # 22 (Field: type, value, item_type)
    t = f.tensors[0]                          # TensorInfo
    t.name, t.shape, t.type                   # 'token_embd.weight', (32000, 2048), 1

The file is memory-mapped; each tensor's `data` is a numpy view of the mapping (its
bytes, uint8), so a weight is read from disk only when something reads it. Shapes
are numpy order (GGUF stores ggml's `ne`, reversed here).

A file that breaks a rule is a GGUFError whose message is the problem, in one line
(files.gguf_reader.open_reader puts the file's name in front). Metadata values are
plain Python: a string whose bytes are not UTF-8 keeps them as surrogate escapes, so
that `value.encode("utf-8", "surrogateescape")` gives the file's bytes back.

Standard library and numpy, and the block sizes of the tensor types: ggml_py's own
table (core/types), gguf's public one for a type ggml_py does not have.
"""
import functools
import math
import mmap
import os
import struct
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ggml_py.core.types import Type, type_traits

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)    # what llama.cpp reads (version 1 files predate its gguf reader)
DEFAULT_ALIGNMENT = 32

# GGUF's value types, as the file numbers them
(UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY,
 UINT64, INT64, FLOAT64) = range(13)
VALUE_TYPE_NAMES = ("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL",
                    "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64")
# the fixed-size ones: struct code and numpy name (for messages)
_SCALARS = {UINT8: ("B", "uint8"), INT8: ("b", "int8"), UINT16: ("H", "uint16"),
            INT16: ("h", "int16"), UINT32: ("I", "uint32"), INT32: ("i", "int32"),
            FLOAT32: ("f", "float32"), BOOL: ("?", "bool"), UINT64: ("Q", "uint64"),
            INT64: ("q", "int64"), FLOAT64: ("d", "float64")}
# the fewest bytes an array item of each type takes: a string its length, an
# array its item type and count
_LEAST_BYTES = {**{t: struct.calcsize(code) for t, (code, _) in _SCALARS.items()},
                STRING: 8, ARRAY: 12}
_MAX_NESTING = 64         # arrays of arrays of ...: deeper is a corrupt file, not data


class GGUFError(ValueError):
    """A GGUF file that breaks the format's rules; the message is the problem."""


class _Corrupt(Exception):
    """A read past the end or a value that cannot be: GGUFError 'truncated or corrupt
    GGUF file (<text>)', once the caller has said where (which key)."""


@dataclass(frozen=True)
class Field:
    """One metadata value: its GGUF value type, the value, and an array's item type.

    value: int, float, bool, str, or for an ARRAY a list of those (an array of
    arrays: a list of lists).
    """
    type: int
    value: Any
    item_type: "int | None" = None   # an ARRAY's item type (also when the array is empty)

    def describe(self):
        """The value for a message: short, with its GGUF type ('48 (UINT32)')."""
        if self.type == ARRAY:
            return f"an array of {len(self.value)} {VALUE_TYPE_NAMES[self.item_type]}"
        text = repr(self.value)
        name = VALUE_TYPE_NAMES[self.type]
        return f"{text[:40]}... ({name})" if len(text) > 40 else f"{text} ({name})"


@dataclass(frozen=True, eq=False)
class TensorInfo:
    """One tensor of the file: its numpy-order shape, ggml type id and bytes in place."""
    name: str
    shape: tuple          # numpy order; () for a tensor of no dimensions (one value)
    type: int             # ggml's type number (ggml_py's Type, where it has the type)
    offset: int           # of its first byte in the file
    nbytes: int
    data: np.ndarray      # read-only uint8 view of the mapping: shape[:-1] + (bytes a row,)

    @property
    def n_elements(self):
        """Number of values (a tensor of no dimensions holds one)."""
        return math.prod(self.shape)


class GGUFFile:
    """A GGUF file, mapped and read: `fields` {key: Field} in file order, `tensors`
    [TensorInfo] in file order, and `version`, `byte_order` ('little' or 'big'),
    `alignment`, `data_offset` (where tensor data starts), `data` (the whole file, a
    read-only uint8 array over the mapping)."""

    def __init__(self, path):
        """Map and read the file at `path`: GGUFError for a file that breaks the format
        (OSError for one that cannot be opened or mapped)."""
        self.path = os.fspath(path)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            # (an empty file cannot be mapped; it is refused by its magic)
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        self._mapping = buf if size else None
        self.data = np.frombuffer(buf, np.uint8)
        try:
            self._read(buf)
        except _Corrupt as e:
            raise GGUFError(f"truncated or corrupt GGUF file ({e})") from None

    def release_pages(self, array):
        """Let the mapping's pages that lie wholly inside `array` (a view of `data`) go
        from this process's memory (madvise DONTNEED): they stay in the file (a file read
        into memory, --no-mmap, keeps them there: nothing is freed) and are read back if
        used again. No-op for an array outside the mapping, or where madvise is refused."""
        start = array.ctypes.data - self.data.ctypes.data
        if self._mapping is None or start < 0 or start + array.nbytes > self.data.nbytes:
            return
        page = mmap.PAGESIZE
        first, end = -(-start // page) * page, (start + array.nbytes) // page * page
        if end > first:
            try:
                self._mapping.madvise(mmap.MADV_DONTNEED, first, end - first)
            except (AttributeError, OSError):   # no madvise here (Windows), or refused: keep them
                pass

    def _read(self, buf):
        """Read the header, metadata and tensor infos from the file's bytes `buf`, each
        part checked as it is read."""
        magic = bytes(buf[:4])
        if magic != GGUF_MAGIC:
            raise GGUFError(f"not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        self.version = _gguf_version(buf[4:8])
        if self.version is None:
            raise _Corrupt(_past_end(4, "uint32"))
        if self.version not in GGUF_VERSIONS:
            raise GGUFError(f"GGUF version {self.version} is not supported (only "
                            f"{' and '.join(map(str, GGUF_VERSIONS))}, as llama.cpp)")
        self.byte_order = _byte_order(buf[4:8])
        reader = _Reader(buf, "<" if self.byte_order == "little" else ">")
        if reader.size < 24:
            raise _Corrupt(_past_end(8, "uint64", 2))
        n_tensors, n_kv = struct.unpack_from(reader.order + "QQ", buf, 8)
        # a count beyond the bytes left, even at one byte an item, is no file cut short
        # but a corrupt number: refused before a loop that long (a file cut short is
        # told where a read runs past its end)
        if n_kv > reader.size - 24:
            raise _Corrupt(f"key/value count {n_kv} is more than the file can hold")
        self.fields, offset = reader.fields(24, n_kv)
        self.alignment = _alignment(self.fields)
        if n_tensors > reader.size - offset:
            raise _Corrupt(f"tensor count {n_tensors} is more than the file can hold")
        infos, offset = reader.tensor_infos(offset, n_tensors)
        self.data_offset = -(-offset // self.alignment) * self.alignment
        self.tensors = _tensors(infos, self.alignment, self.data_offset, self.data)


def _gguf_version(raw):
    """The version of a GGUF header's 4 version bytes, in the file's byte order (a
    big-endian file's version reads as a multiple of 65536 the other way); None: too short."""
    order = _byte_order(raw)
    return None if order is None else int.from_bytes(raw[:4], order)


def _byte_order(raw):
    """A GGUF file's byte order ('little' or 'big') from its 4 version bytes, as gguf and
    llama.cpp tell it: this host's, unless the low 16 bits of the version read in it are
    zero (no version is a multiple of 65536); None: too short."""
    if len(raw) < 4:
        return None
    if int.from_bytes(raw[:4], sys.byteorder) & 0xFFFF:
        return sys.byteorder
    return "big" if sys.byteorder == "little" else "little"


def _alignment(fields):
    """general.alignment, or the default; GGUFError unless a UINT32 power of two."""
    field = fields.get("general.alignment")
    if field is None:
        return DEFAULT_ALIGNMENT
    value = field.value
    if field.type != UINT32 or value == 0 or value & (value - 1):
        raise GGUFError(f"general.alignment = {field.describe()} must be a UINT32 power of two")
    return value


def _past_end(offset, dtype, count=1):
    """What a read of `count` items of `dtype` at byte `offset` past the file's end is."""
    what = "1 item" if count == 1 else f"{count} items"
    return f"{what} of {dtype} at byte {offset} run{'s' if count == 1 else ''} past its end"


def _name(raw):
    """A key or tensor name: UTF-8 text, as llama.cpp and gguf require."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Corrupt(f"a key or tensor name is not UTF-8 text: byte "
                       f"0x{e.object[e.start]:02x}") from None


class _Reader:
    """Reads GGUF's parts from the mapped bytes `buf` in byte order `order` ('<', '>'),
    each checked against the file's end before it is used."""

    def __init__(self, buf, order):
        self.buf, self.size, self.order = buf, len(buf), order
        self.u32 = struct.Struct(order + "I")
        self.u64 = struct.Struct(order + "Q")
        self.scalars = {t: struct.Struct(order + code) for t, (code, _) in _SCALARS.items()}

    def number(self, st, offset, dtype):
        """The one value of struct `st` at `offset`."""
        if offset + st.size > self.size:
            raise _Corrupt(_past_end(offset, dtype))
        return st.unpack_from(self.buf, offset)[0]

    def raw_string(self, offset):
        """(a GGUF string's bytes, the offset after it)."""
        n = self.number(self.u64, offset, "uint64")
        start = offset + 8
        if start + n > self.size:
            raise _Corrupt(_past_end(start, "uint8", n))
        return self.buf[start:start + n], start + n

    def fields(self, offset, count):
        """({key: Field} of the `count` key/value pairs at `offset`, the offset after them)."""
        fields = {}
        for _ in range(count):
            raw, offset = self.raw_string(offset)
            key = _name(raw)
            try:
                vtype = self.number(self.u32, offset, "uint32")
                field, offset = self.field(offset + 4, vtype)
            except _Corrupt as e:
                raise _Corrupt(f"{e}, in key {key!r}") from None
            if key in fields:     # refused, as llama.cpp and gguf refuse it (not: the last wins)
                raise GGUFError(f"duplicate metadata key {key!r}")
            fields[key] = field
        return fields, offset

    def field(self, offset, vtype):
        """(the Field of value type `vtype` at `offset`, the offset after it)."""
        if vtype == STRING:
            raw, offset = self.raw_string(offset)
            return Field(STRING, raw.decode("utf-8", "surrogateescape")), offset
        st = self.scalars.get(vtype)
        if st is not None:
            return Field(vtype, self.number(st, offset, _SCALARS[vtype][1])), offset + st.size
        if vtype != ARRAY:
            raise _Corrupt(_bad_value_type(vtype, offset - 4))
        item_type, count, offset = self.array_head(offset)
        value, offset = self.array_items(offset, item_type, count)
        return Field(ARRAY, value, item_type), offset

    def array_head(self, offset):
        """(item type, count, offset of the first item) of the array at `offset`: the
        count checked against the bytes left before any item is read (2^40 items of
        a corrupt count would take hours and all memory)."""
        item_type = self.number(self.u32, offset, "uint32")
        if item_type not in _LEAST_BYTES:
            raise _Corrupt(_bad_value_type(item_type, offset))
        count = self.number(self.u64, offset + 4, "uint64")
        if count * _LEAST_BYTES[item_type] > self.size - (offset + 12):
            raise _Corrupt(f"an array of {count} items at byte {offset} runs past its end")
        return item_type, count, offset + 12

    def array_items(self, offset, item_type, count, depth=1):
        """(the list of `count` items of `item_type` at `offset`, the offset after them)."""
        if item_type == STRING:
            return self.strings(offset, count)
        if item_type == ARRAY:    # each item: item type, count, items (no value type)
            if depth >= _MAX_NESTING:
                raise _Corrupt(f"arrays nested more than {_MAX_NESTING} deep at byte {offset}")
            items = []
            for _ in range(count):
                inner_type, inner_count, offset = self.array_head(offset)
                item, offset = self.array_items(offset, inner_type, inner_count, depth + 1)
                items.append(item)
            return items, offset
        st = struct.Struct(f"{self.order}{count}{_SCALARS[item_type][0]}")
        return list(st.unpack_from(self.buf, offset)), offset + st.size   # (count checked)

    def strings(self, offset, count):
        """(`count` strings at `offset`, the offset after them). The hot loop of a
        128k-token vocabulary: kept to the bare minimum."""
        buf, size, unpack = self.buf, self.size, self.u64.unpack_from
        items = []
        append = items.append
        try:
            for _ in range(count):
                (n,) = unpack(buf, offset)
                start = offset + 8
                offset = start + n
                if offset > size:
                    raise _Corrupt(_past_end(start, "uint8", n))
                append(buf[start:offset].decode("utf-8", "surrogateescape"))
        except struct.error:      # the length itself runs past the end
            raise _Corrupt(_past_end(offset, "uint64")) from None
        return items, offset

    def tensor_infos(self, offset, count):
        """([(name, ne, type id, data offset)] of the `count` tensor infos at `offset`,
        the offset after them)."""
        infos = []
        for _ in range(count):
            raw, offset = self.raw_string(offset)
            name = _name(raw)
            n_dims = self.number(self.u32, offset, "uint32")
            offset += 4
            if offset + 8 * n_dims > self.size:
                raise _Corrupt(_past_end(offset, "uint64", n_dims))
            ne = struct.unpack_from(f"{self.order}{n_dims}Q", self.buf, offset)
            offset += 8 * n_dims
            type_id = self.number(self.u32, offset, "uint32")
            data_offset = self.number(self.u64, offset + 4, "uint64")
            infos.append((name, ne, type_id, data_offset))
            offset += 12
        return infos, offset


def _bad_value_type(type_id, offset):
    """The problem of a metadata value type id (at byte `offset`) that GGUF does not have."""
    return f"the metadata value type at byte {offset} is {type_id}, which GGUF does not have"


def _tensors(infos, alignment, data_start, data):
    """TensorInfos, checked as llama.cpp's gguf reader wants them: unique names, known
    types, at most 4 dimensions of whole blocks per row, and data laid out in order,
    each tensor at the running sum of the sizes before it padded to the alignment;
    then no tensor past the file's end."""
    tensors, seen, expected = [], set(), 0
    for name, ne, type_id, offset in infos:
        if name in seen:
            raise GGUFError(f"duplicate tensor name {name!r}")
        seen.add(name)
        layout = block_layout(type_id)
        if layout is None:
            raise GGUFError(f"tensor {name!r} has type id {type_id}, a tensor type ggml_py "
                            f"does not know")
        block, type_size = layout
        dims = list(ne) or [1]     # no dimensions: one value, as llama.cpp reads it
        if len(dims) > 4:
            raise GGUFError(f"tensor {name!r} has {len(dims)} dimensions (at most 4)")
        if dims[0] % block:
            raise GGUFError(f"tensor {name!r} of type {tensor_type_name(type_id)} has {dims[0]} "
                            f"elements per row, not a multiple of its block size {block}")
        if offset != expected:
            raise GGUFError(f"tensor {name!r} has offset {offset}, expected {expected} (tensor "
                            f"data must follow in order, aligned to {alignment} bytes)")
        # ggml counts elements in an int64 (llama.cpp checks the same)
        if max(dims) >= 2 ** 63 or math.prod(dims) >= 2 ** 63:
            raise GGUFError(f"tensor {name!r} of shape {tuple(reversed(ne))} has more elements "
                            f"than ggml can count")
        nbytes = math.prod(dims) // block * type_size
        start = data_start + expected
        if start + nbytes > data.size:
            raise GGUFError(f"truncated: tensor {name!r} ends at byte {start + nbytes}, the "
                            f"file has {data.size}")
        shape = tuple(reversed(ne))
        row = dims[0] // block * type_size
        view = data[start:start + nbytes].reshape(shape[:-1] + (row,) if shape else (nbytes,))
        tensors.append(TensorInfo(name, shape, type_id, start, nbytes, view))
        expected += -(-nbytes // alignment) * alignment
    return tensors


@functools.lru_cache(maxsize=None)
def block_layout(type_id):
    """(elements a block, bytes a block) of ggml type `type_id`; None for a type neither
    ggml_py nor gguf knows. ggml_py's table first: its types are what it runs (and gguf's
    table is wrong for Q8_1), gguf's for the types files may hold that ggml_py cannot run."""
    if type_id in Type._value2member_map_:
        traits = type_traits(type_id)
        return traits["blck_size"], traits["type_size"]
    import gguf    # (imported only here: it takes longer to import than a model to load)
    try:
        return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(type_id)]
    except (ValueError, KeyError):
        return None


def tensor_type_name(type_id):
    """The name of ggml type `type_id` ('Q4_K'), or 'type id N' for one nobody knows."""
    if type_id in Type._value2member_map_:
        return Type(type_id).name
    import gguf
    try:
        return gguf.GGMLQuantizationType(type_id).name
    except ValueError:
        return f"type id {type_id}"
