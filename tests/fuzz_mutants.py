"""Seeded mutants of GGUF and tune files, for tests/test_fuzz_loaders.py.

Each mutant comes from its kind and a seed alone (numpy's generator seeded with both), so
a seed makes the same file on every run. A mutant function returns what it did, in words,
and the file's bytes (a tune mutant: its text, and whether to load it checking the system):

* gguf_mutant: structured edits of a tiny llama model — an array's length, a value's GGUF
  type, a count or other value, a key removed, renamed, added or twice; a tensor's shape,
  type, offset or name, the alignment; now and then the header's counts or version, or a cut;
* bytes_mutant: random bit flips and byte changes, half of them in the key/value pairs,
  most of the rest in the tensor infos (the data is only ever numbers), now and then a
  run deleted or a cut;
* shapes_mutant: random hyper-parameters, odd ones too, with every weight of the shape
  they ask for, so that what is tried is the sizes against each other and the forward pass;
* tune_mutant: a tune file as ggml-tune writes it, with a value, its JSON type, a key, the
  nesting or a list changed, or its text cut, flipped, nested deep or given a key twice.

The base models are a SentencePiece one (F32) and a byte-level BPE one (Q8_0, tied output,
rope_freqs): 300 tokens, 32 wide, one block, so that each load takes milliseconds.
"""
import functools
import json
import math
import os
import struct

import gguf
import numpy as np

import ggml_py as gg
from ggml_py.tune import data as tune
from ggml_py.files.gguf_metadata import read_gguf_metadata
from ggml_py.core.profiles import STAGES
from ggml_py.tools.random_model import RandomLlamaSpec, spm_vocab_from_gguf, write_random_llama
from llama_models import DATA, SPM_VOCAB, V, gguf_bytes, gguf_parts, scratch_path

N_VOCAB = 300          # the 259 control and byte tokens, and some pieces
KINDS = ("gguf", "bytes", "tune", "shapes")    # each kind's seeds are its own


# ---- base files ------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def spm_base():
    """A tiny SentencePiece llama model (F32): its bytes."""
    path = scratch_path("fuzz-spm.gguf")
    spec = RandomLlamaSpec(n_vocab=N_VOCAB, n_embd=32, n_layer=1, n_head=2, n_head_kv=1,
                           n_ff=64, n_ctx_train=64)
    write_random_llama(path, spec, vocab=spm_vocab_from_gguf(SPM_VOCAB, N_VOCAB))
    return open(path, "rb").read()


@functools.lru_cache(maxsize=None)
def bpe_base():
    """A tiny byte-level BPE llama model (Q8_0, tied output, rope_freqs): its bytes. The
    vocabulary is GPT-2's first 300 tokens, with the merges among them."""
    path = scratch_path("fuzz-bpe-spm.gguf")
    spec = RandomLlamaSpec(n_vocab=N_VOCAB, n_embd=32, n_layer=1, n_head=2, n_head_kv=1,
                           n_ff=64, n_ctx_train=64, weight_type="Q8_0", tied_output=True,
                           rope_freqs=True, seed=1)
    write_random_llama(path, spec, vocab=spm_vocab_from_gguf(SPM_VOCAB, N_VOCAB))
    meta = read_gguf_metadata(os.path.join(DATA, "ggml-vocab-gpt-2.gguf"))
    tokens = meta["tokenizer.ggml.tokens"][:N_VOCAB]
    known = set(tokens)
    merges = [m for m in meta["tokenizer.ggml.merges"]
              if m.replace(" ", "", 1) in known and all(p in known for p in m.split(" ", 1))]
    kvs, tensors = gguf_parts(path)
    kvs = [kv for kv in kvs if not kv[0].startswith("tokenizer.")] + [
        ("tokenizer.ggml.model", [V.STRING], "gpt2"),
        ("tokenizer.ggml.pre", [V.STRING], "gpt-2"),
        ("tokenizer.ggml.tokens", [V.ARRAY, V.STRING], tokens),
        ("tokenizer.ggml.token_type", [V.ARRAY, V.INT32], [1] * N_VOCAB),
        ("tokenizer.ggml.merges", [V.ARRAY, V.STRING], merges),
        ("tokenizer.ggml.eos_token_id", [V.UINT32], 13),
    ]
    return gguf_bytes(kvs, tensors)


@functools.lru_cache(maxsize=None)
def base_parts(name):
    """(kvs, tensors) of a base model, as llama_models.gguf_parts gives them."""
    path = scratch_path(f"fuzz-{name}.gguf")
    with open(path, "wb") as f:
        f.write(spm_base() if name == "spm" else bpe_base())
    return gguf_parts(path)


@functools.lru_cache(maxsize=None)
def tune_base():
    """A tune file's JSON as ggml-tune writes it (this build's profiles, each benched at
    the thread counts ggml-tune benches it at), with made-up times."""
    m_values, thread_counts = [1, 2, 4, 8, 16, 32], [1, 2]
    shapes = []
    for n, k, wtype in ((64, 64, gg.F32), (64, 96, gg.Q8_0)):
        profiles = gg.task_profiles(gg.Op.MUL_MAT, wtype)
        timed = []
        for p in profiles:
            stages = [st for st, flags in zip(STAGES, p.stages) if flags.valid]
            times = {t: {st: [(p.id + 1) * 10.0 * m / t + 2.0 for m in m_values] for st in stages}
                     for t in thread_counts if p in tune.distinct_profiles(profiles, t)}
            if times:
                timed.append(tune.ProfileTimes(p, times))
        shapes.append(tune.ShapeTimes(n, k, wtype, timed))
    return json.dumps(tune.TuneData("fuzz", m_values, thread_counts, shapes).to_json(), indent=1)


# ---- GGUF mutants ----------------------------------------------------------------------

INT_RANGES = {V.UINT8: (0, 2 ** 8 - 1), V.INT8: (-2 ** 7, 2 ** 7 - 1),
              V.UINT16: (0, 2 ** 16 - 1), V.INT16: (-2 ** 15, 2 ** 15 - 1),
              V.UINT32: (0, 2 ** 32 - 1), V.INT32: (-2 ** 31, 2 ** 31 - 1),
              V.UINT64: (0, 2 ** 64 - 1), V.INT64: (-2 ** 63, 2 ** 63 - 1)}
SCALAR_TYPES = list(INT_RANGES) + [V.FLOAT32, V.FLOAT64, V.BOOL, V.STRING]
FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-5, 1e4, 1e-45, 1e38, 3.4028234e38, math.inf,
          -math.inf, math.nan]
STRINGS = ["", "llama", "gpt2", "bert", "mamba", "linear", "yarn", "none", "gpt-2",
           "llama-bpe", "a b", "\u2581", "<0x4G>", "<s>", "x" * 300, b"\xff\xfe"]
# keys a llama file may have, to add where the base has none
EXTRA_KEYS = ["llama.vocab_size", "llama.attention.key_length", "llama.attention.value_length",
              "llama.expert_count", "llama.expert_used_count", "llama.rope.scaling.type",
              "llama.rope.scaling.factor", "llama.rope.scale_linear",
              "llama.rope.scaling.attn_factor", "general.alignment", "split.count",
              "tokenizer.ggml.merges", "tokenizer.ggml.scores", "tokenizer.ggml.pre",
              "tokenizer.ggml.eot_token_id", "tokenizer.ggml.padding_token_id",
              "tokenizer.ggml.prefix_token_id", "tokenizer.ggml.add_eos_token",
              "tokenizer.ggml.add_space_prefix", "general.file_type"]
TENSOR_TYPES = [0, 1, 2, 8, 12, 14, 30, 24, 26, 16, 4, 99, 2 ** 31]   # F32 ... unknown ids


def pick(rng, items):
    """One of items, drawn with rng."""
    return items[int(rng.integers(len(items)))]


def random_scalar(rng, t, like=None):
    """A value of GGUF type t: edges of its range, near `like`, or anything."""
    if t == V.STRING:
        if isinstance(like, str) and like and rng.random() < 0.3:
            at = int(rng.integers(len(like)))
            return like[:at] + pick(rng, ["", " ", "x", "\u2581", "\u00e9"]) + like[at + 1:]
        return pick(rng, STRINGS)
    if t == V.BOOL:
        return bool(rng.integers(2))
    if t in (V.FLOAT32, V.FLOAT64):
        return pick(rng, FLOATS + [float(rng.normal(0, 1e3))])     # each one a float32 too
    low, high = INT_RANGES[t]
    near = [like - 1, like + 1, 2 * like, like // 2] if isinstance(like, int) else []
    value = pick(rng, [low, high, 0, 1, 2, 3, -1, int(rng.integers(0, 1000))] + near)
    return min(max(value, low), high)


def random_typed(rng):
    """A random (types, value) pair: a scalar, or an array of a few items."""
    t = pick(rng, SCALAR_TYPES)
    if rng.random() < 0.3:
        return [V.ARRAY, t], [random_scalar(rng, t) for _ in range(int(rng.integers(0, 5)))]
    return [t], random_scalar(rng, t)


def mutate_item(rng, types, value):
    """An array with one item changed (a duplicate text, a NaN score, a bad merge...)."""
    if not value:
        return [random_scalar(rng, types[1])]
    value = list(value)
    i = int(rng.integers(len(value)))
    if types[1] == V.STRING and rng.random() < 0.3:
        value[i] = value[int(rng.integers(len(value)))]
    else:
        value[i] = random_scalar(rng, types[1], value[i])
    return value


def kv_array_length(rng, kvs, tensors):
    """An array key with items dropped or repeated (none, one, one more, twice as many...)."""
    arrays = [i for i, kv in enumerate(kvs) if kv[1][0] == V.ARRAY]
    i = pick(rng, arrays)
    key, types, value = kvs[i]
    n = len(value)
    new_n = pick(rng, [0, 1, n - 1, n + 1, n // 2, 2 * n, n + int(rng.integers(2, 40))])
    items = value or [random_scalar(rng, types[1])]
    kvs[i] = (key, types, (items * (new_n // len(items) + 1))[:max(new_n, 0)])
    return f"{key} of {new_n} items, not {n}"


def kv_type(rng, kvs, tensors):
    """A key of another GGUF type: its numbers in another width, or any value of any type."""
    i = int(rng.integers(len(kvs)))
    key, types, value = kvs[i]
    if types[0] == V.ARRAY and types[1] in INT_RANGES and rng.random() < 0.5:
        # the same numbers in another integer width (refused only where they do not fit)
        t = pick(rng, list(INT_RANGES))
        low, high = INT_RANGES[t]
        kvs[i] = (key, [V.ARRAY, t], [min(max(v, low), high) for v in value])
    elif types[0] in INT_RANGES and rng.random() < 0.5:
        t = pick(rng, list(INT_RANGES) + [V.FLOAT32, V.FLOAT64])
        low, high = INT_RANGES.get(t, (-2 ** 63, 2 ** 63))
        value = float(value) if t in (V.FLOAT32, V.FLOAT64) else min(max(value, low), high)
        kvs[i] = (key, [t], value)
    else:
        kvs[i] = (key, *random_typed(rng))
    return f"{key} as {[t.name for t in kvs[i][1]]}"


def kv_value(rng, kvs, tensors):
    """A key's value, or one item of an array, changed within its type."""
    i = int(rng.integers(len(kvs)))
    key, types, value = kvs[i]
    if types[0] == V.ARRAY:
        kvs[i] = (key, types, mutate_item(rng, types, value))
    else:
        kvs[i] = (key, types, random_scalar(rng, types[0], value))
    return f"{key} changed"


def kv_removed(rng, kvs, tensors):
    """A key removed."""
    key = kvs.pop(int(rng.integers(len(kvs))))[0]
    return f"{key} removed"


def kv_twice(rng, kvs, tensors):
    """A key written twice, with the same value or another."""
    key, types, value = pick(rng, kvs)
    if rng.random() < 0.5:
        types, value = random_typed(rng)
    kvs.insert(int(rng.integers(len(kvs) + 1)), (key, types, value))
    return f"{key} twice"


def kv_renamed(rng, kvs, tensors):
    """A key under a near-miss name, another key's name or none."""
    i = int(rng.integers(len(kvs)))
    key, types, value = kvs[i]
    new = pick(rng, [key + "s", key.upper(), key.replace(".", "_"), pick(rng, EXTRA_KEYS), ""])
    kvs[i] = (new, types, value)
    return f"{key} renamed {new!r}"


def kv_added(rng, kvs, tensors):
    """A key a llama file may have, added where the base has none, of some type."""
    key = pick(rng, EXTRA_KEYS)
    types, value = random_typed(rng)
    if key == "general.alignment" or rng.random() < 0.5:
        types = [pick(rng, list(INT_RANGES))]
        value = random_scalar(rng, types[0], 32)
    kvs.insert(int(rng.integers(len(kvs) + 1)), (key, types, value))
    return f"{key} added"


def tensor_nbytes(ne, type_id):
    """Bytes of a tensor of ggml shape ne and type id, or None (unknown type, partial block)."""
    try:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(type_id)]
    except (ValueError, KeyError):
        return None
    n = int(np.prod(ne or [1], dtype=object))
    return n // block * size if ne and ne[0] % block == 0 else None


def resized(rng, tensor):
    """Maybe give tensor's data the size its (edited) shape and type need, so that the
    offsets stay right and the checks after them are reached."""
    nbytes = tensor_nbytes(tensor[1], tensor[2])
    if nbytes is not None and nbytes <= 1 << 22 and rng.random() < 0.7:
        raw = tensor[3] or b"\0"
        tensor[3] = (raw * (nbytes // len(raw) + 1))[:nbytes]


def tensor_shape(rng, kvs, tensors):
    """A tensor of another shape: dimensions reversed, grown, halved, added, dropped..."""
    t = pick(rng, tensors)
    ne = list(t[1])
    j = int(rng.integers(len(ne)))
    edit = int(rng.integers(7))
    if edit == 0:
        ne = ne[::-1]
    elif edit == 1:
        ne[j] += pick(rng, [-1, 1, 32])
    elif edit == 2:
        ne[j] *= 2
    elif edit == 3:
        ne[j] = max(ne[j] // 2, 0)
    elif edit == 4:
        ne = ne + [1]
    elif edit == 5:
        ne = ne[:-1]
    else:
        ne = pick(rng, [[], [1, 1, 1, 1, 1], [0] + ne[1:], [2 ** 40] + ne[1:]])
    t[1] = ne
    resized(rng, t)
    return f"{t[0]} shaped {ne}"


def tensor_type(rng, kvs, tensors):
    """A tensor of another type id: another ggml type, or one ggml_py does not know."""
    t = pick(rng, tensors)
    t[2] = pick(rng, TENSOR_TYPES)
    resized(rng, t)
    return f"{t[0]} of type id {t[2]}"


def tensor_name(rng, kvs, tensors):
    """A tensor renamed, written twice or removed, or a bias added."""
    i = int(rng.integers(len(tensors)))
    edit = int(rng.integers(4))
    if edit == 0:
        old = tensors[i][0]
        tensors[i][0] = pick(rng, ["blk.1.attn_q.weight", "output.weight", "token_embd.weight",
                                   "rope_freqs.weight", "foo", "", tensors[i - 1][0]])
        return f"{old} renamed {tensors[i][0]!r}"
    if edit == 1:
        tensors.insert(i, list(tensors[i]))
        return f"{tensors[i][0]} twice"
    if edit == 2:
        return f"{tensors.pop(i)[0]} removed"
    tensors.insert(i, ["blk.0.attn_q.bias", [pick(rng, [32, 64])], 0, b"\0" * 4 * 32])
    return "a bias added"


def natural_offsets(tensors, alignment):
    """The offsets gguf_bytes writes: each tensor at the running sum, aligned."""
    offsets, at = [], 0
    for _, _, _, raw in tensors:
        offsets.append(at)
        at += -(-len(raw) // alignment) * alignment
    return offsets


def tensor_offset(rng, kvs, tensors):
    """A tensor's offset moved off its place (its data stays where it was)."""
    offsets = natural_offsets(tensors, 32)
    i = int(rng.integers(len(offsets)))
    offsets[i] = max(0, pick(rng, [offsets[i] + 1, offsets[i] - 32, offsets[i] + 32,
                                   offsets[i - 1], 2 ** 62]))
    return f"{tensors[i][0]} at offset {offsets[i]}", {"offsets": offsets}


def alignment(rng, kvs, tensors):
    """The data aligned to another size, with a general.alignment that says so, or not."""
    written = pick(rng, [1, 2, 4, 8, 16, 32, 64])
    stated = pick(rng, [written, written, 0, 3, 48, 2 ** 31, 32])
    kvs.append(("general.alignment", [pick(rng, [V.UINT32, V.UINT32, V.UINT64])], stated))
    return f"aligned to {written}, general.alignment {stated}", {"alignment": written}


# each edits kvs and tensors (as gguf_parts gives them) in place and says what it did; a
# layout edit returns gguf_bytes' keyword arguments with it
STRUCTURED = [kv_array_length, kv_type, kv_value, kv_value, kv_removed, kv_twice, kv_renamed,
              kv_added, tensor_shape, tensor_type, tensor_name, tensor_offset, alignment]


def header_edit(rng, data):
    """The tensor count, key/value count or version of the serialized file."""
    at, fmt, what = pick(rng, [(8, "<Q", "tensor count"), (16, "<Q", "key/value count"),
                               (4, "<I", "version")])
    old = struct.unpack_from(fmt, data, at)[0]
    new = pick(rng, [0, old - 1, old + 1, 2 * old, 2 ** 32 - 1, int(rng.integers(0, 100))])
    new = min(max(new, 0), 2 ** 32 - 1 if fmt == "<I" else 2 ** 64 - 1)
    data = bytearray(data)
    struct.pack_into(fmt, data, at, new)
    return bytes(data), f"{what} {new}, not {old}"


def gguf_mutant(seed):
    """(what was done, the file's bytes) of structured GGUF mutant number seed."""
    rng = np.random.default_rng([KINDS.index("gguf"), seed])
    name = pick(rng, ["spm", "bpe"])
    kvs, tensors = base_parts(name)
    kvs = [(k, list(t), list(v) if isinstance(v, list) else v) for k, t, v in kvs]
    tensors = [list(t) for t in tensors]
    done, layout = [], {}
    for _ in range(1 + int(rng.random() < 0.3)):      # now and then two edits
        result = pick(rng, STRUCTURED)(rng, kvs, tensors)
        if isinstance(result, tuple):
            result, extra = result
            layout.update(extra)
        done.append(result)
    if "alignment" in layout and "offsets" in layout:
        del layout["offsets"]
    data = gguf_bytes(kvs, tensors, **layout)
    if rng.random() < 0.1:
        data, what = header_edit(rng, data)
        done.append(what)
    if rng.random() < 0.1:
        cut = int(rng.integers(len(data)))
        data = data[:cut]
        done.append(f"cut at {cut}")
    return f"{name}: " + "; ".join(done), data


@functools.lru_cache(maxsize=None)
def regions(name):
    """(start, end) of a base model's key/value pairs, tensor infos and tensor data."""
    path = scratch_path(f"fuzz-{name}-regions.gguf")
    with open(path, "wb") as f:
        f.write(gguf_bytes(*base_parts(name)))
    reader = gguf.GGUFReader(path)
    infos, data = int(reader.tensors[0].field.offset), int(reader.data_offset)
    return (24, infos), (infos, data), (data, os.path.getsize(path))


def bytes_mutant(seed):
    """(what was done, the file's bytes) of random-bytes mutant number seed: most edits
    in the key/value pairs and the tensor infos, as the data is only ever numbers."""
    rng = np.random.default_rng([KINDS.index("bytes"), seed])
    name = pick(rng, ["spm", "bpe"])
    data = bytearray(gguf_bytes(*base_parts(name)))
    done = []
    for _ in range(int(rng.integers(1, 5))):
        start, end = regions(name)[int(rng.choice(3, p=[0.5, 0.4, 0.1]))]
        at = int(rng.integers(start, end))
        if rng.random() < 0.6:
            data[at] ^= 1 << int(rng.integers(8))
        else:
            data[at] = int(rng.integers(256))
        done.append(at)
    what = f"{name}: bytes {done} changed"
    if rng.random() < 0.1:
        at, n = int(rng.integers(regions(name)[1][1])), int(rng.integers(1, 16))
        del data[at:at + n]
        what += f"; {n} deleted at {at}"
    if rng.random() < 0.1:
        cut = int(rng.integers(len(data)))
        del data[cut:]
        what += f"; cut at {cut}"
    return what, bytes(data)


def shapes_mutant(seed):
    """(what was done, the file's bytes) of hyper-parameter mutant number seed: random
    sizes (odd ones too) with every weight of the shape they ask for, so that the checks
    of the sizes against each other and the forward pass are what is tried."""
    rng = np.random.default_rng([KINDS.index("shapes"), seed])
    E, H = pick(rng, [1, 2, 3, 4, 6, 8, 16, 32]), pick(rng, [1, 2, 3, 4, 8])
    Hkv = pick(rng, [d for d in range(1, H + 1) if H % d == 0] + [3])
    key_length = pick(rng, [None, None, 1, 2, 3, 4, 6, 8])
    D = key_length or max(E // H, 1)
    F, L = pick(rng, [1, 2, 3, 8, 32]), pick(rng, [1, 2])
    keys = {"llama.embedding_length": E, "llama.attention.head_count": H,
            "llama.attention.head_count_kv": Hkv, "llama.block_count": L,
            "llama.feed_forward_length": F, "llama.context_length": pick(rng, [0, 1, 8, 64])}
    if key_length:
        keys.update({"llama.attention.key_length": key_length, "llama.attention.value_length":
                     pick(rng, [key_length, key_length, max(E // H, 1)])})
    if rng.random() < 0.5:
        keys["llama.rope.dimension_count"] = pick(rng, [D, D, D + 2])
    kvs = [kv for kv in base_parts("spm")[0] if not kv[0].startswith("llama.")]
    kvs += [(key, [V.UINT32], value) for key, value in keys.items()]
    kvs += [("llama.attention.layer_norm_rms_epsilon", [V.FLOAT32], pick(rng, [0.0, 1e-5, 1e-30])),
            ("llama.rope.freq_base", [V.FLOAT32], pick(rng, [1.0, 1e-3, 1e4, 1e30]))]
    f16 = rng.random() < 0.3

    def weight(name, *shape):       # numpy-order shape; matrices F16 now and then
        dtype = np.float16 if f16 and len(shape) == 2 else np.float32
        values = rng.standard_normal(shape).astype(dtype)
        return [name, list(shape[::-1]), 1 if values.dtype == np.float16 else 0, values.tobytes()]
    tensors = [weight("token_embd.weight", N_VOCAB, E)]
    for i in range(L):
        tensors += [weight(f"blk.{i}.{name}.weight", *shape) for name, shape in [
            ("attn_norm", (E,)), ("attn_q", (H * D, E)), ("attn_k", (Hkv * D, E)),
            ("attn_v", (Hkv * D, E)), ("attn_output", (E, H * D)), ("ffn_norm", (E,)),
            ("ffn_gate", (F, E)), ("ffn_up", (F, E)), ("ffn_down", (E, F))]]
    tensors.append(weight("output_norm.weight", E))
    if rng.random() < 0.5:
        tensors.append(weight("output.weight", N_VOCAB, E))
    if rng.random() < 0.3:
        tensors.append(weight("rope_freqs.weight", max(D // 2, 1)))
    what = ", ".join(f"{key.split('.')[-1]} {value}" for key, value in keys.items())
    return what, gguf_bytes(kvs, tensors)


# ---- tune mutants ----------------------------------------------------------------------

JSON_VALUES = [0, 1, -1, 2, 7, 2 ** 31, 2 ** 31 - 1, 10 ** 400, 0.5, -0.0, 1e308, math.nan,
               math.inf, "", "1", "F32", "Q9_9", "cpu", True, False, None, [], [1], [[1, 2]],
               {}, {"compute": [1.0]}]


def walk(rng, obj):
    """(container, key) of a random place in obj: each level stops there with some chance."""
    parent, key = None, None
    node = obj
    while isinstance(node, (dict, list)) and node and (parent is None or rng.random() < 0.7):
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        parent, key = node, pick(rng, keys)
        node = parent[key]
    return parent, key


def tune_value(rng, obj):
    parent, key = walk(rng, obj)
    old = parent[key]
    if isinstance(old, (int, float)) and not isinstance(old, bool) and rng.random() < 0.5:
        parent[key] = pick(rng, [old + 1, old - 1, -old, old * 1000, float(old), old / 3])
    else:
        parent[key] = pick(rng, JSON_VALUES)
    return f"{key!r} = {parent[key]!r:.30}"


def nodes(value):
    """Every object and list in a JSON value, the value first."""
    if isinstance(value, (dict, list)):
        yield value
        for child in (value.values() if isinstance(value, dict) else value):
            yield from nodes(child)


def tune_key(rng, obj):
    """A key of some object removed or renamed, or one added."""
    parents = [node for node in nodes(obj) if isinstance(node, dict)]
    node = pick(rng, parents)
    key = pick(rng, list(node) or ["x"])
    edit = int(rng.integers(3))
    if edit == 0 and key in node:
        del node[key]
        return f"{key!r} removed"
    if edit == 1 and key in node:
        node[pick(rng, [key + "s", key.upper(), "3", "0", "-1", "compute", "init"])] = node.pop(key)
        return f"{key!r} renamed"
    node[pick(rng, ["extra", "n", "k", "type", "profiles", "compute", "1", "4"])] = \
        pick(rng, JSON_VALUES)
    return "a key added"


def tune_nesting(rng, obj):
    parent, key = walk(rng, obj)
    old = parent[key]
    if isinstance(old, list) and old and rng.random() < 0.4:
        parent[key] = old[0]
        return f"{key!r} unwrapped"
    parent[key] = [old] if rng.random() < 0.5 else {"value": old}
    return f"{key!r} wrapped"


def tune_list(rng, obj):
    """Some list with an item dropped or repeated, reversed or emptied."""
    lists = [node for node in nodes(obj) if isinstance(node, list)]
    items = pick(rng, lists)
    edit = int(rng.integers(4))
    if edit == 0 and items:
        del items[int(rng.integers(len(items)))]
    elif edit == 1 and items:
        items.append(items[int(rng.integers(len(items)))])
    elif edit == 2:
        items.reverse()
    else:
        items.clear()
    return f"a list of {len(items)} edited"


def tune_text(rng, text):
    edit = int(rng.integers(4))
    if edit == 0:
        cut = int(rng.integers(len(text)))
        return text[:cut], f"cut at {cut}"
    if edit == 1:
        data = bytearray(text.encode())
        for _ in range(int(rng.integers(1, 6))):
            data[int(rng.integers(len(data)))] ^= 1 << int(rng.integers(8))
        return bytes(data), "bytes flipped"
    if edit == 2:
        key = pick(rng, ['"model": ', '"n": ', '"version": ', '"compute": ', '"1": '])
        return text.replace(key, f"{key}{pick(rng, ['1', '[]', '2.5', 'null'])}, {key}", 1), \
            f"{key}twice"
    return "[" * 5000 + text + "]" * 5000, "nested deep"


TUNE_EDITS = [tune_value, tune_value, tune_key, tune_nesting, tune_list]


def tune_mutant(seed):
    """(what was done, the file's text or bytes, check_system) of tune mutant number seed."""
    rng = np.random.default_rng([KINDS.index("tune"), seed])
    obj = json.loads(tune_base())
    done = [pick(rng, TUNE_EDITS)(rng, obj) for _ in range(1 + int(rng.random() < 0.3))]
    text = json.dumps(obj, indent=1)
    if rng.random() < 0.25:
        text, what = tune_text(rng, text)
        done.append(what)
    return "; ".join(done), text, bool(rng.random() < 0.7)


MUTANTS = {"gguf": gguf_mutant, "bytes": bytes_mutant, "shapes": shapes_mutant,
           "tune": tune_mutant}
