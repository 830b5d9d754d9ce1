"""ggml-quantize: re-type the weights of a llama GGUF file with ggml_py's own
quantizers, including llama.cpp's K-quant mixes.

    ggml-quantize model-f32.gguf model-q4_k_m.gguf Q4_K_M

Which tensor gets which type follows llama.cpp's rules (llama-quant.cpp):
1-D tensors (norms) stay as they are; the output matrix (or the token
embeddings when the output is tied to them) takes Q6_K, unless the target is
Q8_0 or its rows do not fill K-quant blocks (then Q8_0); in the _M mixes,
attn_v and ffn_down of the layers `use_more_bits` picks take Q6_K; in Q4_K_S
the first four attn_v and the first eighth of ffn_down take Q5_K. A row length
a type's blocks do not divide falls back as llama.cpp does (Q4_K -> Q5_0,
Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0 here; then F16).
"""
import os
import re
import sys
import time
from dataclasses import dataclass

import gguf
import numpy as np

from ggml_py.cli.common import console_script
from ggml_py.quants import quantize
from ggml_py.tensor import type_traits
from ggml_py.types import Type

QK_K = 256


@dataclass(frozen=True)
class Target:
    """A file type: the default tensor type and llama.cpp's ftype id."""
    name: str
    default: Type
    ftype: int


TARGETS = {t.name: t for t in (
    Target("F32", Type.F32, gguf.LlamaFileType.ALL_F32),
    Target("F16", Type.F16, gguf.LlamaFileType.MOSTLY_F16),
    Target("BF16", Type.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    Target("Q4_0", Type.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    Target("Q4_1", Type.Q4_1, gguf.LlamaFileType.MOSTLY_Q4_1),
    Target("Q5_0", Type.Q5_0, gguf.LlamaFileType.MOSTLY_Q5_0),
    Target("Q5_1", Type.Q5_1, gguf.LlamaFileType.MOSTLY_Q5_1),
    Target("Q8_0", Type.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    Target("Q2_K", Type.Q2_K, gguf.LlamaFileType.MOSTLY_Q2_K),
    Target("Q3_K", Type.Q3_K, gguf.LlamaFileType.MOSTLY_Q3_K_M),
    Target("Q4_K", Type.Q4_K, gguf.LlamaFileType.MOSTLY_Q4_K_S),
    Target("Q5_K", Type.Q5_K, gguf.LlamaFileType.MOSTLY_Q5_K_S),
    Target("Q6_K", Type.Q6_K, gguf.LlamaFileType.MOSTLY_Q6_K),
    Target("Q4_K_S", Type.Q4_K, gguf.LlamaFileType.MOSTLY_Q4_K_S),
    Target("Q4_K_M", Type.Q4_K, gguf.LlamaFileType.MOSTLY_Q4_K_M),
    Target("Q5_K_M", Type.Q5_K, gguf.LlamaFileType.MOSTLY_Q5_K_M),
)}

FALLBACK = {Type.Q4_K: Type.Q5_0, Type.Q5_K: Type.Q5_1, Type.Q6_K: Type.Q8_0,
            Type.Q2_K: Type.Q4_0, Type.Q3_K: Type.Q4_0}


class QuantizeError(ValueError):
    """Input that cannot be quantized (one line, names the file)."""


def use_more_bits(i_layer, n_layer):
    """llama.cpp's choice of layers that get more bits in the _M mixes."""
    return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2


def layer_of(name):
    """The block index of a tensor name (blk.N.*), or -1."""
    m = re.match(r"blk\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def tensor_type(name, row_len, target, n_layer, tied_output):
    """The type llama.cpp's rules give tensor `name` (a 2-D weight) under `target`."""
    new = target.default
    is_output = name == "output.weight" or (tied_output and name == "token_embd.weight")
    i = layer_of(name)
    if is_output:
        if row_len % QK_K != 0:
            new = Type.Q8_0
        elif new != Type.Q8_0 and target.name not in ("F32", "F16", "BF16"):
            new = Type.Q6_K
    elif "attn_v.weight" in name:
        if target.name in ("Q4_K_M", "Q5_K_M") and use_more_bits(i, n_layer):
            new = Type.Q6_K
        elif target.name == "Q4_K_S" and i < 4:
            new = Type.Q5_K
    elif "ffn_down" in name:
        if target.name in ("Q4_K_M", "Q5_K_M") and use_more_bits(i, n_layer):
            new = Type.Q6_K
        elif target.name == "Q4_K_S" and i < n_layer // 8:
            new = Type.Q5_K
    while row_len % type_traits(new)["blck_size"] != 0:
        new = FALLBACK.get(new, Type.F16)
    return new


def copy_metadata(reader, writer, file_type):
    """Every key/value of the input but the ones the writer owns or we change."""
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type",
                                              "general.quantization_version"):
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type)
    writer.add_uint32("general.file_type", int(file_type))
    writer.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)


def to_f32(t):
    """A GGUF tensor's values as float32, numpy shape (rows, row length)."""
    return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)


def quantize_file(src, dst, target_name, progress=True, log=print):
    """Write `dst`: `src` with its weights re-typed to target_name. Returns (in bytes, out bytes)."""
    target = TARGETS.get(target_name.upper())
    if target is None:
        raise QuantizeError(f"unknown type {target_name!r}; choose one of {', '.join(TARGETS)}")
    if not os.path.isfile(src):
        raise QuantizeError(f"{src}: no such file")
    try:
        reader = gguf.GGUFReader(src)
    except Exception as exc:   # the reader raises many kinds on a bad file
        raise QuantizeError(f"{src}: not a readable GGUF file ({exc})") from None
    arch_field = reader.fields.get("general.architecture")
    arch = arch_field.contents() if arch_field is not None else None
    if arch != "llama":
        raise QuantizeError(f"{src}: architecture {arch!r} is not llama")
    n_layer = int(reader.fields["llama.block_count"].contents())
    names = {t.name for t in reader.tensors}
    tied = "output.weight" not in names

    writer = gguf.GGUFWriter(dst, arch)
    copy_metadata(reader, writer, target.ftype)
    counts = {}
    tensors = sorted(reader.tensors, key=lambda t: (layer_of(t.name), t.name))  # llama.cpp's order
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(tensors), unit="tensor", desc="quantize", file=sys.stderr)
    for t in tensors:
        shape = tuple(int(d) for d in reversed(t.shape))      # numpy order
        if len(shape) < 2 or not t.name.endswith(".weight"):
            writer.add_tensor(t.name, np.asarray(t.data), raw_shape=t.data.shape,
                              raw_dtype=t.tensor_type)
            new = Type(int(t.tensor_type))
        else:
            new = tensor_type(t.name, shape[-1], target, n_layer, tied)
            values = to_f32(t).reshape(shape)
            if new == Type.F32:
                writer.add_tensor(t.name, values)
            elif new == Type.F16:
                writer.add_tensor(t.name, values.astype(np.float16))
            else:
                data = quantize(values, new)
                writer.add_tensor(t.name, data, raw_shape=data.shape,
                                  raw_dtype=gguf.GGMLQuantizationType(int(new)))
        counts[new.name] = counts.get(new.name, 0) + 1
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    size_in, size_out = os.path.getsize(src), os.path.getsize(dst)
    log(f"ggml-quantize: {src} ({size_in / 2**20:.2f} MiB) -> {dst} ({size_out / 2**20:.2f} MiB), "
        f"{target.name}; tensors: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return size_in, size_out


@console_script
def main(argv=None):
    """Entry point of the ggml-quantize console script."""
    import argparse
    p = argparse.ArgumentParser(prog="ggml-quantize",
                                description="Quantize a llama GGUF file with ggml_py's quantizers.")
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("type", help="one of " + ", ".join(TARGETS))
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    try:
        start = time.perf_counter()
        quantize_file(args.input, args.output, args.type, progress=not args.quiet)
        print(f"ggml-quantize: done in {time.perf_counter() - start:.1f} s")
        return 0
    except BrokenPipeError:
        raise   # for console_script
    except (QuantizeError, OSError) as exc:
        print(f"ggml-quantize: error: {exc}", file=sys.stderr)
        return 1
