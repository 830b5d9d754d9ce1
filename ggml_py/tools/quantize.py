"""ggml-quantize: re-type the weights of a llama GGUF file with ggml_py's own
quantizers, in llama.cpp's type mixes.

    ggml-quantize model-f32.gguf model-q4_k_m.gguf Q4_K_M

Which tensor gets which type follows llama.cpp's rules for a llama model
(`llama_tensor_get_type` in src/llama-quant.cpp); `tensor_type` is the table.
Float targets (F32, F16, BF16) apply no mix. For quantized targets 1-D
tensors (norms) stay as they are; the output matrix (or the token embeddings
when the output is tied to them) takes Q6_K, or Q8_0 when the target is Q8_0
or its row length is not a multiple of 256; attn_v, attn_output and ffn_down
take more bits in Q2_K, Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M and Q5_K_M. A row
length a type's blocks do not divide falls back as llama.cpp does (Q2_K, Q3_K ->
Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0; then F16, as for a 32-element type
on such a row). Q3_K, Q4_K and Q5_K are llama.cpp's aliases of Q3_K_M, Q4_K_M and
Q5_K_M. An input holding NaN or inf is refused, as llama.cpp checks the model
it quantizes, and so is a re-typed tensor holding a value that is not finite (a
weight beyond F16's range, also in Q4_1 / Q5_1 block minimums), as llama.cpp
validates what it quantized.

As in llama.cpp, a tensor already in its new type is copied unchanged, and a
quantized tensor is re-encoded into another type only with --allow-requantize.
Metadata is copied byte for byte (general.alignment included, with the data
laid out to it). Files in the other byte order and shards of a split model are
refused.

The output is written to a temporary file beside it and renamed into place
when complete; an output that is the input file is refused.

The program, ggml-quantize, is ggml_py.cli.quantize.
"""
import collections
import functools
import os
import re
import sys
from dataclasses import dataclass, replace

import gguf
import numpy as np
from tqdm import tqdm

from ggml_py.files.gguf_file import ARRAY, STRING, tensor_type_name
from ggml_py.files.gguf_reader import GGUFModelFile, ModelLoadError, open_reader
from ggml_py.files.gguf_writer import write_streamed
from ggml_py.files.output import OutputPathError, atomic_output, check_output_path
from ggml_py.core.quants import dequantize, quantize
from ggml_py.core.types import Type, type_traits
from ggml_py.tokenizer.tokenizer import Tokenizer


@dataclass(frozen=True)
class Target:
    """A file type: llama.cpp's name of its mix, the default tensor type and the ftype id."""
    name: str
    default: Type
    ftype: int


MIXES = (
    Target("F32", Type.F32, gguf.LlamaFileType.ALL_F32),
    Target("F16", Type.F16, gguf.LlamaFileType.MOSTLY_F16),
    Target("BF16", Type.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    Target("Q4_0", Type.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    Target("Q4_1", Type.Q4_1, gguf.LlamaFileType.MOSTLY_Q4_1),
    Target("Q5_0", Type.Q5_0, gguf.LlamaFileType.MOSTLY_Q5_0),
    Target("Q5_1", Type.Q5_1, gguf.LlamaFileType.MOSTLY_Q5_1),
    Target("Q8_0", Type.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    Target("Q2_K", Type.Q2_K, gguf.LlamaFileType.MOSTLY_Q2_K),
    Target("Q3_K_S", Type.Q3_K, gguf.LlamaFileType.MOSTLY_Q3_K_S),
    Target("Q3_K_M", Type.Q3_K, gguf.LlamaFileType.MOSTLY_Q3_K_M),
    Target("Q3_K_L", Type.Q3_K, gguf.LlamaFileType.MOSTLY_Q3_K_L),
    Target("Q4_K_S", Type.Q4_K, gguf.LlamaFileType.MOSTLY_Q4_K_S),
    Target("Q4_K_M", Type.Q4_K, gguf.LlamaFileType.MOSTLY_Q4_K_M),
    Target("Q5_K_S", Type.Q5_K, gguf.LlamaFileType.MOSTLY_Q5_K_S),
    Target("Q5_K_M", Type.Q5_K, gguf.LlamaFileType.MOSTLY_Q5_K_M),
    Target("Q6_K", Type.Q6_K, gguf.LlamaFileType.MOSTLY_Q6_K),
)
# llama.cpp's quantize (QUANT_OPTIONS): the bare K names are the _M mixes
ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}
TARGETS = {t.name: t for t in MIXES}
TARGETS.update({alias: TARGETS[mix] for alias, mix in ALIASES.items()})

FLOAT_TYPES = (Type.F32, Type.F16, Type.BF16)
FALLBACK = {Type.Q4_K: Type.Q5_0, Type.Q5_K: Type.Q5_1, Type.Q6_K: Type.Q8_0,
            Type.Q2_K: Type.Q4_0, Type.Q3_K: Type.Q4_0}


@dataclass(frozen=True)
class ModelInfo:
    """What llama.cpp's rules read besides a tensor's name and row length."""
    n_layer: int
    n_head: int = 1
    n_head_kv: int = 1
    tied_output: bool = False

    @property
    def n_gqa(self):
        """Query heads per key/value head (llama.cpp's hparams.n_gqa())."""
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self):
        """llama.cpp's LLM_TYPE_70B for a llama: 80 layers, fewer kv heads than heads."""
        return self.n_layer == 80 and self.n_head != self.n_head_kv


HELP_MIXES = """\
types (llama.cpp's mixes for a llama model; 1-D tensors always stay as they are):
  F32 F16 BF16           every matrix in that type, no mix
  Q4_0 Q4_1 Q5_0 Q5_1    that type; output (or tied token_embd) Q6_K
  Q8_0                   Q8_0 throughout
  Q6_K Q5_K_S Q3_K_S     that type; output Q6_K
  Q2_K                   Q2_K; attn_v Q3_K (Q4_K when heads/kv heads >= 4),
                         attn_output and ffn_down Q3_K; output Q6_K
  Q3_K_M (= Q3_K)        Q3_K; attn_v Q5_K in layers 0-1, else Q4_K; attn_output Q4_K;
                         ffn_down Q5_K in the first 1/16 of layers, else Q4_K; output Q6_K
  Q3_K_L                 Q3_K; attn_v, attn_output, ffn_down Q5_K; output Q6_K
  Q4_K_S                 Q4_K; attn_v of layers 0-3 and ffn_down of the first 1/8 Q5_K;
                         output Q6_K
  Q4_K_M (= Q4_K)        Q4_K; attn_v and ffn_down Q6_K in the layers use_more_bits picks
                         (first and last 1/8, every third between); output Q6_K
  Q5_K_M (= Q5_K)        the same with Q5_K
80-layer GQA models (70B) take Q5_K for a Q3_K/Q4_K attn_v. The output takes Q8_0 when its
row length is not a multiple of 256; a row length a K type does not divide falls back to
Q4_0 (Q2_K, Q3_K), Q5_0 (Q4_K), Q5_1 (Q5_K), Q8_0 (Q6_K), then F16, as llama.cpp.
"""


class QuantizeError(ValueError):
    """Input that cannot be quantized (one line, names the file)."""


def use_more_bits(i_layer, n_layer):
    """llama.cpp's choice of layers that get more bits in the _M mixes."""
    return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2


def layer_of(name):
    """The block index of a tensor name (blk.N.*), or -1."""
    m = re.match(r"blk\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def mix_type(name, row_len, target, model):
    """The type target's mix gives a 2-D weight, before the row-length fallback."""
    mix, new = target.name, target.default
    i, n = layer_of(name), model.n_layer
    if name == "output.weight" or (model.tied_output and name == "token_embd.weight"):
        if row_len % type_traits(new)["blck_size"] != 0:
            return Type.Q8_0
        return new if new == Type.Q8_0 else Type.Q6_K
    if "attn_v.weight" in name:
        if mix == "Q2_K":
            new = Type.Q4_K if model.n_gqa >= 4 else Type.Q3_K
        elif mix == "Q3_K_M":
            new = Type.Q5_K if i < 2 else Type.Q4_K
        elif mix == "Q3_K_L":
            new = Type.Q5_K
        elif mix in ("Q4_K_M", "Q5_K_M") and use_more_bits(i, n):
            new = Type.Q6_K
        elif mix == "Q4_K_S" and i < 4:
            new = Type.Q5_K
        if model.is_70b and new in (Type.Q3_K, Type.Q4_K):
            new = Type.Q5_K     # 8 heads share attn_v: more bits cost little
    elif "attn_output.weight" in name:
        new = {"Q2_K": Type.Q3_K, "Q3_K_M": Type.Q4_K, "Q3_K_L": Type.Q5_K}.get(mix, new)
    elif "ffn_down" in name:
        if mix == "Q2_K":
            new = Type.Q3_K
        elif mix == "Q3_K_M":
            new = Type.Q5_K if i < n // 16 else Type.Q4_K
        elif mix == "Q3_K_L":
            new = Type.Q5_K
        elif mix in ("Q4_K_M", "Q5_K_M") and use_more_bits(i, n):
            new = Type.Q6_K
        elif mix == "Q4_K_S" and i < n // 8:
            new = Type.Q5_K
    return new


def tensor_type(name, row_len, target, model):
    """The type llama.cpp's rules give tensor `name` (a 2-D weight, rows of
    `row_len`) under `target` in `model` (a ModelInfo)."""
    if target.default in FLOAT_TYPES:
        return target.default           # llama.cpp mixes only quantized file types
    new = mix_type(name, row_len, target, model)
    while row_len % type_traits(new)["blck_size"] != 0:
        # a K type falls back to a 32-element one, that to F16 (llama.cpp's rule)
        new = FALLBACK.get(new, Type.F16)
    return new


class Writer(gguf.GGUFWriter):
    """gguf's writer, which also writes empty arrays: valid GGUF (`general.tags = []`),
    which llama.cpp copies and gguf refuses to write."""

    def _pack_val(self, val, vtype, add_vtype, sub_type=None):
        if vtype == gguf.GGUFValueType.ARRAY and len(val) == 0:
            head = self._pack("I", vtype) if add_vtype else b""
            return head + self._pack("I", sub_type) + self._pack("Q", 0)
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def field_types(field):
    """(value type, item type or None) of a metadata field (a gguf_file.Field), as
    gguf's writer takes them; an empty array keeps its item type."""
    if field.type != ARRAY:
        return gguf.GGUFValueType(field.type), None
    return gguf.GGUFValueType(ARRAY), gguf.GGUFValueType(field.item_type)


def field_value(field):
    """A metadata value as the file holds it: strings as their raw bytes (old
    conversions stored tokens that are not UTF-8; llama.cpp copies the bytes, which
    the reader kept as surrogate escapes)."""
    if field.type == STRING:
        return field.value.encode("utf-8", "surrogateescape")
    if field.item_type == STRING:
        return [text.encode("utf-8", "surrogateescape") for text in field.value]
    return field.value


def copy_metadata(reader, writer, file_type):
    """Every key/value of the input, in its order, but the ones the writer owns or we change."""
    for key, field in reader.fields.items():
        if key in ("general.architecture", "general.file_type", "general.quantization_version"):
            continue
        if key == "general.alignment":
            # the writer lays the tensor data out to its own alignment, not to the key
            writer.add_custom_alignment(reader.alignment)
            continue
        vtype, sub_type = field_types(field)
        if sub_type == gguf.GGUFValueType.ARRAY:
            raise QuantizeError(f"metadata {key!r} is an array of arrays, which cannot be "
                                f"written here")
        writer.add_key_value(key, field_value(field), vtype, sub_type)
    # last, in llama.cpp's order: its output and ours are then the same bytes
    writer.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)
    writer.add_uint32("general.file_type", int(file_type))


def to_f32(t):
    """A GGUF tensor's values as float32, numpy shape (rows, row length)."""
    qtype = gguf.GGMLQuantizationType(t.type)
    return gguf.quants.dequantize(t.data, qtype).astype(np.float32, copy=False)


def dequantizable(qtype):
    """Whether gguf reads tensors of `qtype` as floats (probed on one zero block)."""
    type_size = gguf.GGML_QUANT_SIZES[qtype][1]
    try:
        gguf.quants.dequantize(np.zeros((1, type_size), np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def is_weight(t):
    """Whether llama.cpp re-types tensor `t`: a matrix whose name ends in .weight."""
    return len(t.shape) >= 2 and t.name.endswith(".weight")


def runnable_config(src, reader):
    """The LlamaConfig of an input ggml_py's model loader accepts, else ModelLoadError
    (architecture, hyper-parameters, tensor set and shapes, vocabulary): the output
    would be refused too, so none is written. The weights' types are not checked:
    they are to be re-typed (an IQ4_NL input quantized to Q8_0 runs)."""
    from ggml_py.model.config import LlamaConfig
    from ggml_py.model.weights import LlamaWeights
    f = GGUFModelFile(src, reader, shapes_only=True)
    config = LlamaConfig.from_gguf(f)
    LlamaWeights.from_gguf(f, config)
    Tokenizer.from_model_file(f)
    return config


def open_input(src, dst):
    """Read and check `src` (a llama GGUF) and that `dst` may be written (files.output's
    rules: not `src`): (reader, ModelInfo)."""
    try:
        check_output_path(dst, inputs={src: "the input file"})
    except OutputPathError as exc:
        raise QuantizeError(str(exc)) from None
    try:
        reader = open_reader(src)     # the header checked as the model loader checks it
        config = runnable_config(src, reader)
    except ModelLoadError as exc:
        raise QuantizeError(str(exc)) from None
    for t in reader.tensors:
        if is_weight(t) and not dequantizable(gguf.GGMLQuantizationType(t.type)):
            raise QuantizeError(f"{src}: tensor {t.name} is {tensor_type_name(t.type)}, "
                                "which cannot be read as floats to re-type")
    model = ModelInfo(n_layer=config.n_layer, n_head=config.n_head, n_head_kv=config.n_head_kv,
                      tied_output="output.weight" not in {t.name for t in reader.tensors})
    return reader, model


def new_types(reader, target, model):
    """{tensor name: its type in the output}: llama.cpp's rules for the weights; the
    other tensors keep theirs."""
    return {t.name: tensor_type(t.name, t.shape[-1], target, model) if is_weight(t)
            else gguf.GGMLQuantizationType(t.type) for t in reader.tensors}


def check_requantize(src, reader, types):
    """As llama.cpp without --allow-requantize: no quantized tensor re-encoded into another type."""
    for t in reader.tensors:
        if int(types[t.name]) != t.type and t.type not in FLOAT_TYPES:
            raise QuantizeError(f"{src}: requantizing from type {tensor_type_name(t.type)} is "
                                f"disabled ({t.name} -> {types[t.name].name}); pass "
                                f"--allow-requantize to re-type quantized weights")


@functools.cache
def block_scales(type):
    """((byte offset, numpy dtype), ...) of the scales in a block of `type`: where ggml's row
    validation (ggml_validate_row_data, which llama.cpp's quantize runs over its input)
    looks. Found, not listed: they are the fields whose NaN reaches the block's values, which
    the C de-quantizer (its block layout the only copy) shows on a block of zeros. Empty for
    a type without blocks."""
    traits = type_traits(type)
    if not traits["is_quantized"]:
        return ()
    size, n = traits["type_size"], traits["blck_size"]
    for dtype in (np.float16, np.float32):     # half scales, else a float one (Q8_K)
        nan = np.frombuffer(np.array(np.nan, dtype).tobytes(), np.uint8)
        found = []
        for offset in range(0, size - nan.size + 1, nan.size):
            block = np.zeros((1, size), np.uint8)
            block[0, offset:offset + nan.size] = nan
            if not np.isfinite(dequantize(block, type, (1, n))).all():
                found.append((offset, dtype))
        if found:
            return tuple(found)
    return ()


FLOAT_DTYPES = {Type.F32: np.float32, Type.F16: np.float16, Type.F64: np.float64}
CHECK_CHUNK = 1 << 22     # values checked at a time (a bool per value: 4 MiB)


def _non_finite(chunks):
    """(count, index of the first) of the NaN / inf values of an iterable of 1-D
    (values, is_finite function) pieces, taken in order."""
    n_bad, first, start = 0, None, 0
    for values, finite in chunks:
        bad = np.flatnonzero(~finite(values))
        if bad.size and first is None:
            first = start + int(bad[0])
        n_bad += bad.size
        start += values.size
    return n_bad, first


def invalid_data(type, data):
    """What ggml's row validation finds wrong in a tensor's bytes `data` (uint8, whole
    blocks) of `type`: a NaN or inf among a float tensor's values, or among a quantized
    tensor's block scales. None when nothing is, and for types this does not know the
    blocks of (check_input de-quantizes those) or that hold integers."""
    if int(type) not in Type._value2member_map_:
        return None
    type = Type(int(type))
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if block_scales(type):
        size = type_traits(type)["type_size"]
        if raw.size % size:
            raise ValueError(f"invalid_data: {raw.size} bytes are not whole {type.name} blocks")
        blocks = raw.reshape(-1, size)
        for offset, dtype in block_scales(type):
            width = np.dtype(dtype).itemsize
            scales = np.ascontiguousarray(blocks[:, offset:offset + width]).view(dtype).reshape(-1)
            bad = np.flatnonzero(~np.isfinite(scales))
            if bad.size:
                return (f"{bad.size} of its {scales.size} blocks have a scale of NaN or inf "
                        f"(the first: block {int(bad[0])}, {float(scales[bad[0]])})")
        return None
    if type == Type.BF16:    # no numpy dtype: NaN and inf are the all-ones exponent
        values, finite = raw.view(np.uint16), lambda v: (v & 0x7F80) != 0x7F80
    elif type in FLOAT_DTYPES:
        values, finite = raw.view(FLOAT_DTYPES[type]), np.isfinite
    else:
        return None
    n_bad, first = _non_finite((values[i:i + CHECK_CHUNK], finite)
                               for i in range(0, values.size, CHECK_CHUNK))
    if n_bad:
        return f"{n_bad} of its {values.size} values are NaN or inf (the first: value {first})"
    return None


def check_input(t):
    """Refuse a GGUF tensor as llama.cpp's quantize refuses a model whose data fails
    ggml's row validation: the block quantizers pass over a NaN, zeroing part of the
    block silently (QuantizeError). A type ggml_py has no blocks of (IQ4_NL, ...) is
    de-quantized by gguf, a slice of rows at a time, where gguf can."""
    problem = invalid_data(t.type, t.data)
    qtype = gguf.GGMLQuantizationType(t.type)
    if problem is None and t.type not in Type._value2member_map_ and dequantizable(qtype):
        rows = t.data.reshape(-1, t.data.shape[-1])
        step = max(1, CHECK_CHUNK // max(1, rows.shape[1]))
        n_bad, first = _non_finite(
            (gguf.quants.dequantize(rows[i:i + step], qtype).reshape(-1), np.isfinite)
            for i in range(0, len(rows), step))
        if n_bad:
            problem = (f"{n_bad} of its {t.n_elements} values de-quantize to NaN or inf "
                       f"(the first: value {first})")
    if problem:
        raise QuantizeError(f"tensor {t.name} has invalid data: {problem}; llama.cpp "
                            f"refuses such a file too")


def check_finite(name, type, data, shape=None):
    """data, a tensor re-typed to `type` (float values, or blocks of numpy `shape`),
    after checking, as llama.cpp validates what it quantized, that every value it
    holds is finite: a weight beyond the type's range (65504 for F16, and for the
    block minimum of Q4_1 / Q5_1) is a QuantizeError (NaN and inf of the input are
    refused before, by check_input)."""
    values = data if shape is None else dequantize(data, type, shape)
    bad = values.size - int(np.count_nonzero(np.isfinite(values)))
    if bad:
        raise QuantizeError(f"tensor {name}: {bad} of its {values.size} values are not finite "
                            f"in {type.name} (weights beyond the type's range); llama.cpp "
                            f"refuses such data too")
    return data


def read_tensor(fd, t):
    """t with its bytes read into memory from the open file fd, not through the mapping
    (as llama.cpp's quantize reads): a file cut short since it was opened is a
    QuantizeError here, where a read of the mapping past its new end would kill the
    process (SIGBUS)."""
    buf = bytearray(t.nbytes)
    view, done = memoryview(buf), 0
    while done < t.nbytes:
        try:
            n = os.preadv(fd, [view[done:]], t.offset + done)
        except OSError as exc:
            raise QuantizeError(f"cannot read tensor {t.name} ({exc.strerror or exc})") from None
        if n == 0:     # (the file may now end before the tensor starts)
            size = os.fstat(fd).st_size
            raise QuantizeError(f"the file ends at byte {size}, before the end of tensor "
                                f"{t.name} (bytes {t.offset} .. {t.offset + t.nbytes}): it "
                                f"was cut short while being read")
        done += n
    return replace(t, data=np.frombuffer(buf, np.uint8).reshape(t.data.shape))


def tensor_plan(reader, types, made=lambda: None, fd=None):
    """[(name, numpy-order shape, gguf type, make)] for gguf_write.write_streamed: every
    tensor of `reader` in its type of `types` ({name: type}), in llama.cpp's order; make()
    re-types the tensor (or copies it, where the type stays) when it is written, then
    calls made(). fd: the input file open, each tensor read from it (read_tensor) rather
    than from the reader's mapping."""
    def make(mapped, new, shape):
        def data():
            t = mapped if fd is None else read_tensor(fd, mapped)
            check_input(t)
            if int(new) == t.type:
                out = t.data
            else:
                values = to_f32(t).reshape(shape)
                if new == Type.F32:
                    out = check_finite(t.name, new, values)
                elif new == Type.F16:
                    with np.errstate(over="ignore"):      # reported by check_finite, in one line
                        out = check_finite(t.name, new, values.astype(np.float16))
                else:
                    out = check_finite(t.name, new, quantize(values, new), shape)
            made()
            return out
        return data

    plan = []
    for t in sorted(reader.tensors, key=lambda t: (layer_of(t.name), t.name)):  # llama.cpp's order
        shape = t.shape
        new = types[t.name]
        plan.append((t.name, shape, gguf.GGMLQuantizationType(int(new)), make(t, new, shape)))
    return plan


def unknown_type(name):
    """The message for a type name that is not one of TARGETS."""
    return f"unknown type {name!r}; choose one of {', '.join(TARGETS)}"


def quantize_file(src, dst, target_name, progress=True, log=print, allow_requantize=False):
    """Write `dst`: `src` with its weights re-typed to target_name. Returns (in bytes, out bytes).

    `dst` appears only once complete (a temporary file beside it is renamed); a
    `dst` that is `src` is refused, as `src` is memory-mapped while it is read.
    A quantized weight of `src` is re-encoded into another type only with
    `allow_requantize` (QuantizeError otherwise, before anything is written).
    """
    target = TARGETS.get(target_name.upper())
    if target is None:
        raise QuantizeError(unknown_type(target_name))
    reader, model = open_input(src, dst)
    types = new_types(reader, target, model)
    if not allow_requantize:
        check_requantize(src, reader, types)
    try:
        source = open(src, "rb")
    except OSError as exc:
        raise QuantizeError(f"{src}: cannot read ({exc.strerror or exc})") from None
    try:
        with source as f, atomic_output(dst, inputs={src: "the input file"}) as tmp:
            writer = Writer(tmp, "llama")
            copy_metadata(reader, writer, target.ftype)
            with tqdm(total=len(types), unit="tensor", desc="quantize", file=sys.stderr,
                      disable=None if progress else True) as bar:   # (none in a file)
                write_streamed(writer, tensor_plan(reader, types, made=bar.update, fd=f.fileno()))
    except BrokenPipeError:
        raise   # the progress bar's reader went away, not the output (for the console script)
    except OutputPathError as exc:   # (the path changed since open_input checked it)
        raise QuantizeError(str(exc)) from None
    except OSError as exc:
        raise QuantizeError(f"{dst}: cannot write ({exc.strerror or exc})") from None
    except QuantizeError as exc:     # a tensor's data: name the input file too
        raise QuantizeError(f"{src}: {exc}") from None
    counts = collections.Counter(t.name for t in types.values())
    size_in, size_out = os.path.getsize(src), os.path.getsize(dst)
    log(f"ggml-quantize: {src} ({size_in / 2**20:.2f} MiB) -> {dst} ({size_out / 2**20:.2f} MiB), "
        f"{target.name}; tensors: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return size_in, size_out
