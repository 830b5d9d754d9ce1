"""ggml_py's GGUF reader (files/gguf_file.py) against gguf's, on files gguf wrote and on
files made byte by byte; the messages each bad file gets are in test_llama_model.py."""
import random
import struct
import subprocess
import sys

import gguf
import numpy as np
import pytest

from llama_models import V, edited_model, gguf_bytes, gguf_parts, model_path, scratch_path

from ggml_py.core.types import Type
from ggml_py.files import gguf_file as gf
from ggml_py.files.gguf_file import GGUFError, GGUFFile


def test_the_reader_reads_what_gguf_reads():
    path = model_path("q4_k")
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
    keys = [k for k in theirs.fields if not k.startswith("GGUF.")]   # (gguf's own entries)
    assert list(ours.fields) == keys
    for key in keys:
        field, other = ours.fields[key], theirs.fields[key]
        assert field.type == other.types[0] and field.value == other.contents(), key
        if field.type == gf.ARRAY:
            assert field.item_type == other.types[1]
    assert (ours.version, ours.byte_order, ours.alignment, ours.data_offset) == \
           (3, sys.byteorder, theirs.alignment, theirs.data_offset)
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for t, other in zip(ours.tensors, theirs.tensors):
        assert t.shape == tuple(reversed(other.shape.tolist())) and t.type == other.tensor_type
        assert (t.offset, t.nbytes, t.n_elements) == (other.data_offset, other.n_bytes,
                                                      other.n_elements)
        assert t.data.dtype == np.uint8 and t.data.tobytes() == other.data.tobytes()
        # its bytes in place: a read-only view of the mapping, rows of whole blocks
        assert np.shares_memory(t.data, ours.data) and not t.data.flags.writeable
        assert t.data.shape[:-1] == t.shape[:-1] and t.data.size == t.nbytes


def test_every_value_type_and_the_bytes_of_strings_that_are_not_utf8(tmp_path):
    values = {"u8": (V.UINT8, 255), "i8": (V.INT8, -128), "u16": (V.UINT16, 65535),
              "i16": (V.INT16, -32768), "u32": (V.UINT32, 2 ** 32 - 1), "i32": (V.INT32, -2 ** 31),
              "u64": (V.UINT64, 2 ** 64 - 1), "i64": (V.INT64, -2 ** 63), "f32": (V.FLOAT32, 0.5),
              "f64": (V.FLOAT64, 1e300), "b": (V.BOOL, True), "s": (V.STRING, "h\u00e9"),
              "raw": (V.STRING, b"\xff\xfe"), "empty": (V.STRING, "")}
    writer = gguf.GGUFWriter(str(tmp_path / "v.gguf"), "llama")
    for key, (vtype, value) in values.items():
        writer.add_key_value(key, value, vtype)
    writer.add_key_value("a.f32", [1.5, -2.0], V.ARRAY, V.FLOAT32)
    writer.add_key_value("a.str", ["x", b"\xe2\x96", ""], V.ARRAY, V.STRING)
    writer.add_key_value("a.nested", [[1, 2], [3]], V.ARRAY, V.ARRAY)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    fields = GGUFFile(tmp_path / "v.gguf").fields
    for key, (vtype, value) in values.items():
        field = fields[key]
        assert field.type == vtype and field.item_type is None
        if isinstance(value, bytes):      # kept as surrogate escapes: the bytes come back
            assert field.value.encode("utf-8", "surrogateescape") == value
        else:
            assert field.value == value and type(field.value) is type(value)
    assert fields["a.f32"] == gf.Field(gf.ARRAY, [1.5, -2.0], gf.FLOAT32)
    assert [s.encode("utf-8", "surrogateescape") for s in fields["a.str"].value] == \
           [b"x", b"\xe2\x96", b""]
    assert fields["a.nested"] == gf.Field(gf.ARRAY, [[1, 2], [3]], gf.ARRAY)
    assert fields["u32"].describe() == "4294967295 (UINT32)"
    assert fields["a.str"].describe() == "an array of 3 STRING"


def test_an_empty_array_keeps_its_item_type():
    kvs, tensors = gguf_parts(model_path("f32"))
    path = scratch_path("empty-array.gguf")
    open(path, "wb").write(gguf_bytes(kvs + [("x.ids", [V.ARRAY, V.INT32], [])], tensors))
    assert GGUFFile(path).fields["x.ids"] == gf.Field(gf.ARRAY, [], gf.INT32)


def test_a_big_endian_file_is_read_in_its_byte_order():
    # read whole (open_reader then refuses it: test_llama_model), values the same
    little, big = GGUFFile(model_path("f32")), GGUFFile(edited_model("be.gguf", order=">"))
    assert (little.byte_order, big.byte_order) == ("little", "big")
    assert big.fields == little.fields
    assert [(t.name, t.shape, t.type, t.offset) for t in big.tensors] == \
           [(t.name, t.shape, t.type, t.offset) for t in little.tensors]


def test_counts_the_file_cannot_hold_are_refused_before_the_loop():
    good = open(model_path("f32"), "rb").read()
    path = scratch_path("tensor-count.gguf")
    open(path, "wb").write(good[:8] + struct.pack("<Q", 2 ** 60) + good[16:])
    with pytest.raises(GGUFError, match=r"^truncated or corrupt GGUF file \(tensor count "
                                        r"1152921504606846976 is more than the file can hold\)$"):
        GGUFFile(path)


def test_more_elements_than_ggml_counts_and_arrays_nested_too_deep():
    kvs, tensors = gguf_parts(model_path("f32"))
    tensors[-1][1] = [2 ** 32, 2 ** 32]
    path = scratch_path("huge.gguf")
    open(path, "wb").write(gguf_bytes(kvs, tensors))
    with pytest.raises(GGUFError, match=f"tensor '{tensors[-1][0]}' of shape .* has more "
                                        f"elements than ggml can count"):
        GGUFFile(path)
    nested = struct.pack("<IQ", V.ARRAY, 1) * 100 + struct.pack("<IQ", V.UINT8, 0)
    good = open(model_path("f32"), "rb").read()
    n_kv = struct.unpack_from("<Q", good, 16)[0]
    key = b"x.deep"
    kv = struct.pack("<Q", len(key)) + key + struct.pack("<I", V.ARRAY) + nested
    open(path, "wb").write(good[:16] + struct.pack("<Q", n_kv + 1) + kv + good[24:])
    with pytest.raises(GGUFError, match=r"arrays nested more than 64 deep at byte \d+, in "
                                        r"key 'x.deep'\)$"):
        GGUFFile(path)


def test_a_damaged_header_is_a_gguf_error_or_a_file():
    # bytes of the header changed or cut at random: one GGUFError, never another exception
    good = open(model_path("f32"), "rb").read()
    end = GGUFFile(model_path("f32")).data_offset
    rng, path = random.Random(7), scratch_path("damaged.gguf")
    for _ in range(300):
        data = bytearray(good)
        for _ in range(rng.choice((1, 2, 4))):
            at = rng.randrange(end)
            if rng.random() < 0.8:
                data[at] = rng.randrange(256)
            else:
                del data[at:]
                break
        open(path, "wb").write(data)
        try:
            GGUFFile(path)
        except GGUFError as e:
            assert "\n" not in str(e)


def test_models_load_and_quantize_without_ggufs_reader(monkeypatch, tmp_path):
    # the gguf package is used to write and for its tables, never to read
    from ggml_py.model.llama import LlamaModel
    from ggml_py.tokenizer.tokenizer import Tokenizer
    from ggml_py.tools.quantize import quantize_file

    def refuse(*args, **kwargs):
        raise AssertionError("gguf.GGUFReader used")
    monkeypatch.setattr(gguf, "GGUFReader", refuse)
    monkeypatch.setattr(gguf.gguf_reader, "GGUFReader", refuse)
    model = LlamaModel(model_path("q4_0"), n_ctx=16, n_threads=1)
    assert model.forward(np.array([1, 2], np.int32), np.arange(2)).shape[-1] == 512
    from_path, from_file = (Tokenizer.from_gguf(model_path("f32")),
                            Tokenizer.from_gguf(GGUFFile(model_path("f32"))))
    assert from_path.n_vocab == 512 and from_file.source == model_path("f32")
    assert from_path.tokenize("To be, or not") == from_file.tokenize("To be, or not")
    quantize_file(model_path("f32"), tmp_path / "q.gguf", "Q8_0", progress=False,
                  log=lambda *a: None)
    matrices = [t.type for t in GGUFFile(tmp_path / "q.gguf").tensors if len(t.shape) == 2]
    assert matrices and set(matrices) == {Type.Q8_0}


def test_loading_a_model_does_not_import_gguf(tmp_path):
    # gguf takes longer to import than the bundled model takes to load; run from a neutral
    # folder (a checkout's unbuilt ggml_py/ must not shadow the installed one)
    code = ("import sys, ggml_py as gg; gg.Llama(n_threads=1).close(); "
            "print('gguf' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=tmp_path)
    assert out.stdout.split() == ["False"]
