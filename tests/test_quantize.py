"""ggml-quantize: llama.cpp's type rules, end-to-end files, bad input."""
import os
import subprocess
import sys
import tempfile

import gguf
import numpy as np
import pytest

from llama_models import GgmlRule, V, edited_model, gguf_bytes, gguf_parts, model_path, scratch_path
from llama_reference import ReferenceLlama

import ggml_py as gg
from ggml_py.model.llama import LlamaModel
from ggml_py.cli.quantize import main
from ggml_py.tools.quantize import (TARGETS, ModelInfo, QuantizeError, block_scales, invalid_data,
                                    quantize_file, tensor_type, use_more_bits)
from ggml_py.tools.random_model import RandomLlamaSpec, write_random_llama
from ggml_py.core.types import Type

import llama_models


def test_use_more_bits_matches_llama_cpp_for_22_layers():
    assert [i for i in range(22) if use_more_bits(i, 22)] == [0, 1, 4, 7, 10, 13, 16, 19, 20, 21]


LLAMA_22 = ModelInfo(n_layer=22, n_head=32, n_head_kv=32)


@pytest.mark.parametrize("name, target, expected", [
    ("blk.0.attn_v.weight", "Q4_K_M", Type.Q6_K),
    ("blk.2.attn_v.weight", "Q4_K_M", Type.Q4_K),
    ("blk.4.ffn_down.weight", "Q5_K_M", Type.Q6_K),
    ("blk.5.ffn_down.weight", "Q5_K_M", Type.Q5_K),
    ("blk.3.attn_v.weight", "Q4_K_S", Type.Q5_K),
    ("blk.4.attn_v.weight", "Q4_K_S", Type.Q4_K),
    ("blk.1.ffn_down.weight", "Q4_K_S", Type.Q5_K),
    ("blk.3.ffn_down.weight", "Q4_K_S", Type.Q4_K),
    ("blk.7.attn_q.weight", "Q4_K_M", Type.Q4_K),
    ("output.weight", "Q4_K_M", Type.Q6_K),
    ("output.weight", "Q4_0", Type.Q6_K),
    ("output.weight", "Q8_0", Type.Q8_0),
    ("output.weight", "F16", Type.F16),
    ("token_embd.weight", "Q4_K_M", Type.Q4_K),
    # Q2_K (llama.cpp's LLAMA_FTYPE_MOSTLY_Q2_K rules; 32 heads / 32 kv heads)
    ("blk.0.attn_v.weight", "Q2_K", Type.Q3_K),
    ("blk.9.attn_output.weight", "Q2_K", Type.Q3_K),
    ("blk.21.ffn_down.weight", "Q2_K", Type.Q3_K),
    ("blk.9.ffn_up.weight", "Q2_K", Type.Q2_K),
    ("blk.9.attn_q.weight", "Q2_K", Type.Q2_K),
    ("token_embd.weight", "Q2_K", Type.Q2_K),
    ("output.weight", "Q2_K", Type.Q6_K),
    # Q3_K_M: attn_v Q5_K in the first two layers, ffn_down Q5_K in the first 1/16
    ("blk.1.attn_v.weight", "Q3_K_M", Type.Q5_K),
    ("blk.2.attn_v.weight", "Q3_K_M", Type.Q4_K),
    ("blk.0.ffn_down.weight", "Q3_K_M", Type.Q5_K),
    ("blk.1.ffn_down.weight", "Q3_K_M", Type.Q4_K),
    ("blk.5.attn_output.weight", "Q3_K_M", Type.Q4_K),
    ("blk.5.ffn_gate.weight", "Q3_K_M", Type.Q3_K),
    ("output.weight", "Q3_K_M", Type.Q6_K),
    # Q3_K_L, Q3_K_S, Q5_K_S
    ("blk.7.attn_v.weight", "Q3_K_L", Type.Q5_K),
    ("blk.7.attn_output.weight", "Q3_K_L", Type.Q5_K),
    ("blk.7.ffn_down.weight", "Q3_K_L", Type.Q5_K),
    ("blk.7.ffn_up.weight", "Q3_K_L", Type.Q3_K),
    ("blk.0.attn_v.weight", "Q3_K_S", Type.Q3_K),
    ("blk.0.ffn_down.weight", "Q3_K_S", Type.Q3_K),
    ("output.weight", "Q3_K_S", Type.Q6_K),
    ("blk.0.attn_v.weight", "Q5_K_S", Type.Q5_K),
    ("blk.0.ffn_down.weight", "Q5_K_S", Type.Q5_K),
    ("output.weight", "Q5_K_S", Type.Q6_K),
])
def test_tensor_types_follow_llama_cpp(name, target, expected):
    assert tensor_type(name, 2048, TARGETS[target], LLAMA_22) == expected


def test_aliases_are_the_m_mixes():
    # llama.cpp's quantize: Q3_K, Q4_K, Q5_K name LLAMA_FTYPE_MOSTLY_Q3_K_M / Q4_K_M / Q5_K_M
    for alias, ftype in [("Q3_K", gguf.LlamaFileType.MOSTLY_Q3_K_M),
                         ("Q4_K", gguf.LlamaFileType.MOSTLY_Q4_K_M),
                         ("Q5_K", gguf.LlamaFileType.MOSTLY_Q5_K_M)]:
        assert TARGETS[alias] is TARGETS[alias + "_M"]
        assert TARGETS[alias].ftype == ftype
    assert tensor_type("blk.0.attn_v.weight", 2048, TARGETS["Q4_K"], LLAMA_22) == Type.Q6_K
    assert tensor_type("blk.0.attn_output.weight", 2048, TARGETS["Q3_K"], LLAMA_22) == Type.Q4_K
    assert tensor_type("blk.4.ffn_down.weight", 2048, TARGETS["Q5_K"], LLAMA_22) == Type.Q6_K


def test_gqa_and_70b_rules():
    gqa8 = ModelInfo(n_layer=32, n_head=32, n_head_kv=4)
    assert tensor_type("blk.5.attn_v.weight", 4096, TARGETS["Q2_K"], gqa8) == Type.Q4_K
    assert tensor_type("blk.5.attn_v.weight", 4096, TARGETS["Q2_K"],
                       ModelInfo(n_layer=32, n_head=32, n_head_kv=16)) == Type.Q3_K
    # llama.cpp's LLM_TYPE_70B (80 layers, GQA): a Q3_K / Q4_K attn_v becomes Q5_K
    l70 = ModelInfo(n_layer=80, n_head=64, n_head_kv=8)
    assert tensor_type("blk.5.attn_v.weight", 8192, TARGETS["Q3_K_S"], l70) == Type.Q5_K
    assert tensor_type("blk.11.attn_v.weight", 8192, TARGETS["Q4_K_M"], l70) == Type.Q5_K
    assert tensor_type("blk.12.attn_v.weight", 8192, TARGETS["Q4_K_M"], l70) == Type.Q6_K
    assert tensor_type("blk.5.attn_q.weight", 8192, TARGETS["Q4_K_M"], l70) == Type.Q4_K
    l65 = ModelInfo(n_layer=80, n_head=64, n_head_kv=64)
    assert tensor_type("blk.5.attn_v.weight", 8192, TARGETS["Q3_K_S"], l65) == Type.Q3_K
    # a GQA factor of exactly 4 is enough; 81 layers are not llama.cpp's 70B
    gqa4 = ModelInfo(n_layer=32, n_head=32, n_head_kv=8)
    assert tensor_type("blk.5.attn_v.weight", 4096, TARGETS["Q2_K"], gqa4) == Type.Q4_K
    l81 = ModelInfo(n_layer=81, n_head=64, n_head_kv=8)
    assert tensor_type("blk.5.attn_v.weight", 8192, TARGETS["Q3_K_S"], l81) == Type.Q3_K
    # Q4_K_S: ffn_down takes Q5_K in the first n_layer / 8 layers (22 // 8 = 2) only
    assert tensor_type("blk.1.ffn_down.weight", 5632, TARGETS["Q4_K_S"], LLAMA_22) == Type.Q5_K
    assert tensor_type("blk.2.ffn_down.weight", 5632, TARGETS["Q4_K_S"], LLAMA_22) == Type.Q4_K


def test_tied_output_and_row_length_fallbacks():
    tied = ModelInfo(n_layer=22, tied_output=True)
    assert tensor_type("token_embd.weight", 2048, TARGETS["Q4_K_M"], tied) == Type.Q6_K
    assert tensor_type("output.weight", 704, TARGETS["Q4_K_M"], LLAMA_22) == Type.Q8_0
    assert tensor_type("blk.3.ffn_up.weight", 704, TARGETS["Q4_K_M"], LLAMA_22) == Type.Q5_0
    assert tensor_type("blk.0.ffn_down.weight", 704, TARGETS["Q4_K_M"], LLAMA_22) == Type.Q8_0
    assert tensor_type("blk.3.ffn_up.weight", 704, TARGETS["Q3_K_M"], LLAMA_22) == Type.Q4_0
    assert tensor_type("blk.3.ffn_up.weight", 704, TARGETS["Q2_K"], LLAMA_22) == Type.Q4_0
    assert tensor_type("blk.3.ffn_up.weight", 704, TARGETS["Q5_K_M"], LLAMA_22) == Type.Q5_1
    assert tensor_type("blk.3.ffn_up.weight", 48, TARGETS["Q4_0"], LLAMA_22) == Type.F16


@pytest.mark.parametrize("target", ["F32", "F16", "BF16"])
def test_float_targets_apply_no_mix(target):
    # llama.cpp chooses per-tensor types only for quantized file types
    expected = TARGETS[target].default
    tied = ModelInfo(n_layer=22, tied_output=True)
    for row_len in (704, 64, 2048, 48):
        assert tensor_type("output.weight", row_len, TARGETS[target], LLAMA_22) == expected
        assert tensor_type("token_embd.weight", row_len, TARGETS[target], tied) == expected
        assert tensor_type("blk.0.attn_v.weight", row_len, TARGETS[target], LLAMA_22) == expected


@pytest.fixture(scope="module")
def f32_k_model():
    path = scratch_path("k-f32.gguf")
    write_random_llama(path, RandomLlamaSpec(n_vocab=llama_models.N_VOCAB, n_embd=256, n_head=4,
                                             n_head_kv=2, n_ff=512, n_layer=4, seed=7),
                       vocab=llama_models.vocab())
    return path


@pytest.mark.parametrize("target", ["Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "Q4_K_S", "Q6_K", "F16",
                                    "Q2_K", "Q3_K"])
def test_quantized_file_loads_and_matches_its_reference(f32_k_model, target):
    out = scratch_path(f"k-{target}.gguf")
    size_in, size_out = quantize_file(f32_k_model, out, target, progress=False, log=lambda *a: None)
    assert size_out < size_in
    reader = gguf.GGUFReader(out)
    assert int(reader.fields["general.file_type"].contents()) == int(TARGETS[target].ftype)
    types = {t.name: Type(int(t.tensor_type)) for t in reader.tensors}
    assert types["blk.0.attn_norm.weight"] == Type.F32
    if target == "Q4_K_M":
        # use_more_bits(i, 4) picks layers 2 and 3
        assert [types[f"blk.{i}.attn_v.weight"] for i in range(4)] == [Type.Q4_K] * 2 + [Type.Q6_K] * 2
        assert types["output.weight"] == Type.Q6_K
    if target == "Q3_K":    # = Q3_K_M
        assert [types[f"blk.{i}.attn_v.weight"] for i in range(4)] == [Type.Q5_K] * 2 + [Type.Q4_K] * 2
        assert types["blk.1.attn_output.weight"] == types["blk.1.ffn_down.weight"] == Type.Q4_K
        assert types["blk.1.attn_q.weight"] == Type.Q3_K and types["output.weight"] == Type.Q6_K
    if target == "Q2_K":    # 4 heads / 2 kv heads: attn_v Q3_K
        assert {types[f"blk.{i}.{n}.weight"] for i in range(4)
                for n in ("attn_v", "attn_output", "ffn_down")} == {Type.Q3_K}
        assert types["blk.1.ffn_up.weight"] == Type.Q2_K and types["output.weight"] == Type.Q6_K
    # the quantized file runs, and agrees with a float64 forward of its own weights
    # (40 tokens on the BLAS profiles by ggml's rule: f32 sgemm on the de-quantized weights,
    # so the weights' own error shows, not the activations' rounding to Q8)
    tokens = np.arange(1, 41, dtype=np.int32)
    model = LlamaModel(out, n_ctx=64, kv_type=Type.F32, n_threads=1)
    model.set_tune(GgmlRule())
    logits = model.forward(tokens, np.arange(40)).copy()
    expected = ReferenceLlama(out).forward(tokens)
    assert np.abs(logits - expected).max() <= 1e-4 * np.abs(expected).max()


def run_cli(*args):
    # the ggml_py under test, from a neutral folder (a checkout's ggml_py/ must not shadow it)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(gg.__file__))))
    return subprocess.run([sys.executable, "-c", "import sys; from ggml_py.cli.quantize import main; "
                           "sys.exit(main(sys.argv[1:]))", *map(str, args)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tempfile.gettempdir())


def test_float_target_keeps_a_tied_embedding_whose_rows_are_not_k_blocks(tmp_path):
    out = tmp_path / "f16.gguf"
    quantize_file(model_path("variant"), out, "F16", progress=False, log=lambda *a: None)
    types = {t.name: Type(int(t.tensor_type)) for t in gguf.GGUFReader(out).tensors}
    assert types["token_embd.weight"] == Type.F16     # 64-wide rows: was Q8_0


def one_line_error(capsys, *argv):
    assert main([*map(str, argv), "-q"]) == 1
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and err.startswith("ggml-quantize: error: "), err
    return err


def test_ctrl_c_stops_in_one_line_and_leaves_no_output(tmp_path, capsys, monkeypatch):
    import ggml_py.tools.quantize as qm
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:                     # a few tensors in
            raise KeyboardInterrupt
        return original(*args, **kwargs)
    original = qm.quantize
    monkeypatch.setattr(qm, "quantize", interrupted)
    out = tmp_path / "q.gguf"
    assert main([model_path("f32"), str(out), "Q4_0", "-q"]) == 130
    _, err = capsys.readouterr()
    assert err == "ggml-quantize: interrupted\n"
    assert len(calls) == 3 and not out.exists() and os.listdir(tmp_path) == []


@pytest.mark.parametrize("keys, fragment", [
    ({"llama.block_count": None}, "missing metadata key 'llama.block_count'"),
    ({"llama.block_count": ([V.UINT32], 0)}, "'llama.block_count' = 0 must be at least 1"),
    ({"llama.block_count": ([V.STRING], "six")}, "'llama.block_count' = 'six' (STRING) is not int"),
    ({"llama.attention.head_count": ([V.UINT32], 3), "llama.attention.head_count_kv": ([V.UINT32], 1)},
     "not a multiple of head_count 3"),
    ({"llama.attention.layer_norm_rms_epsilon": ([V.FLOAT32], float("nan"))}, "= nan must be"),
    ({"general.architecture": ([V.STRING], b"\xff\xfe")}, "'general.architecture' is not UTF-8"),
    ({"tokenizer.ggml.tokens": None}, "tokenizer"),
])
def test_an_input_the_model_loader_refuses_is_not_quantized(tmp_path, capsys, keys, fragment):
    # the output would be refused by ggml-main too: checked as the loader checks it
    bad = edited_model("refused.gguf", keys=keys)
    err = one_line_error(capsys, bad, tmp_path / "o.gguf", "Q4_0")
    assert err.startswith(f"ggml-quantize: error: {bad}: ") and fragment in err, err
    assert os.listdir(tmp_path) == []



def test_a_tied_models_embeddings_take_the_output_matrixs_type(tmp_path):
    # the "variant" model has no output.weight: token_embd is the output matrix, whose
    # rule (Q6_K, or Q8_0 on a row length of 64) it follows instead of the default type
    out = tmp_path / "q4km.gguf"
    assert main([model_path("variant"), str(out), "Q4_K_M", "-q"]) == 0
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(out).tensors}
    assert "output.weight" not in types and types["token_embd.weight"] == "Q8_0"


def test_a_weight_type_ggml_py_cannot_run_is_re_typed(tmp_path):
    # the input is checked as the loader checks it, but not the weights' types: they
    # are to be re-typed (an all-zero IQ4_NL weight: ggml_py has no kernel for it)
    def as_iq4_nl(parts):
        for part in parts:
            if part[0] == "blk.0.attn_q.weight":
                block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.IQ4_NL]
                part[2] = int(gguf.GGMLQuantizationType.IQ4_NL)
                part[3] = bytes(int(np.prod(part[1])) // block * size)
        return parts
    iq = edited_model("iq4_nl.gguf", tensors=as_iq4_nl)
    out = tmp_path / "q8.gguf"
    assert main([iq, str(out), "Q8_0", "-q", "--allow-requantize"]) == 0
    LlamaModel(str(out), n_ctx=16, n_threads=1)     # the output loads


def test_a_nan_scale_in_a_type_ggml_py_has_no_blocks_of_is_refused_too(tmp_path, capsys):
    # an IQ4_NL weight whose fourth block's scale is NaN: ggml's row validation refuses it;
    # re-typed to Q4_0 it gave finite garbage without a word
    def as_iq4_nl_with_a_nan(parts):
        for part in parts:
            if part[0] == "blk.0.attn_q.weight":
                block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.IQ4_NL]
                data = bytearray(int(np.prod(part[1])) // block * size)
                data[3 * size:3 * size + 2] = np.float16(np.nan).tobytes()
                part[2], part[3] = int(gguf.GGMLQuantizationType.IQ4_NL), bytes(data)
        return parts
    iq = edited_model("iq4_nl-nan.gguf", tensors=as_iq4_nl_with_a_nan)
    for target in ("Q4_0", "Q6_K", "Q8_0"):
        line = one_line_error(capsys, iq, tmp_path / "o.gguf", target, "--allow-requantize")
        assert ("tensor blk.0.attn_q.weight has invalid data: 32 of its" in line
                and "values de-quantize to NaN or inf (the first: value 96)" in line), line
    assert os.listdir(tmp_path) == []

def test_bad_tensor_types_and_folders_are_one_line_errors(tmp_path, capsys):
    def as_i8(parts):
        for part in parts:
            if part[0] == "blk.0.attn_q.weight":
                part[2], part[3] = int(Type.I8), bytes(int(np.prod(part[1])))
        return parts
    i8 = edited_model("i8.gguf", tensors=as_i8)
    err = one_line_error(capsys, i8, tmp_path / "o.gguf", "Q4_0")
    assert "tensor blk.0.attn_q.weight is I8, which cannot be read as floats" in err
    assert "is a directory" in one_line_error(capsys, tmp_path, tmp_path / "o.gguf", "Q4_0")
    assert "is a directory" in one_line_error(capsys, model_path("f32"), tmp_path, "Q4_0")
    assert "no such folder" in one_line_error(capsys, model_path("f32"), tmp_path / "no" / "o.gguf", "Q4_0")
    assert "the output file needs a name" in one_line_error(capsys, model_path("f32"), "", "Q4_0")
    assert os.listdir(tmp_path) == []


def test_output_that_is_the_input_is_refused(tmp_path, capsys):
    src = tmp_path / "m.gguf"
    src.write_bytes(open(model_path("f32"), "rb").read())
    before = src.read_bytes()
    os.link(src, tmp_path / "hard.gguf")
    for dst in (src, tmp_path / "." / "m.gguf", tmp_path / "hard.gguf"):
        assert "is the input file" in one_line_error(capsys, src, dst, "Q4_0")
    assert src.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["hard.gguf", "m.gguf"]


def test_a_failed_write_keeps_the_old_output_and_leaves_no_temporary(tmp_path, monkeypatch):
    dst = tmp_path / "out.gguf"
    dst.write_bytes(b"the previous output")

    def disk_full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", disk_full)
    with pytest.raises(QuantizeError, match="out.gguf: cannot write \\(No space left on device\\)"):
        quantize_file(model_path("f32"), dst, "Q4_0", progress=False, log=lambda *a: None)
    assert dst.read_bytes() == b"the previous output"
    assert os.listdir(tmp_path) == ["out.gguf"]
    monkeypatch.undo()
    quantize_file(model_path("f32"), dst, "Q4_0", progress=False, log=lambda *a: None)
    assert gguf.GGUFReader(dst).fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q4_0
    assert os.listdir(tmp_path) == ["out.gguf"]
    assert os.stat(dst).st_mode & 0o777 == 0o666 & ~current_umask()


def test_an_output_named_as_a_directory_is_refused_before_the_work(tmp_path, monkeypatch):
    import ggml_py.tools.quantize as qm
    monkeypatch.setattr(qm, "tensor_plan", lambda *a, **k: pytest.fail("quantized before the check"))
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.gguf").write_bytes(b"old")
    for dst in (f"{tmp_path}/new/", f"{tmp_path}/file.gguf/", tmp_path / "folder"):
        with pytest.raises(QuantizeError, match="is a directory"):
            quantize_file(model_path("f32"), dst, "Q4_0", progress=False, log=lambda *a: None)
    assert sorted(os.listdir(tmp_path)) == ["file.gguf", "folder"]
    assert (tmp_path / "file.gguf").read_bytes() == b"old"


def current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_outputs_get_the_permissions_a_plain_open_gives(tmp_path, umask):
    from ggml_py.files.output import atomic_output
    previous = os.umask(umask)
    try:
        with atomic_output(tmp_path / "out.gguf") as tmp:
            open(tmp, "wb").write(b"x")
    finally:
        os.umask(previous)
    assert os.stat(tmp_path / "out.gguf").st_mode & 0o777 == 0o666 & ~umask


def test_sigterm_while_writing_leaves_no_temporary_file(tmp_path):
    script = ("import os, signal, sys, time\n"
              "from ggml_py.files.output import atomic_output\n"
              "with atomic_output(sys.argv[1]) as tmp:\n"
              "    open(tmp, 'w').write('half')\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    time.sleep(30)\n")
    # the ggml_py under test, from a neutral folder (a checkout's ggml_py/ must not shadow it)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(gg.__file__))))
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out.gguf")],
                          capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert proc.returncode == 143, proc.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kept", ["half", "header"])
def test_an_input_cut_short_while_read_is_a_one_line_error_not_a_bus_error(tmp_path, kept):
    # the input is truncated after a few tensors: read through the mapping, the next
    # tensor's bytes killed the process with SIGBUS (in a child process here, so that a
    # regression cannot take the test run with it); cut to its first 1,000 bytes, it ends
    # before the tensor the read is in
    src, out = tmp_path / "in.gguf", tmp_path / "out.gguf"
    data = open(model_path("f32"), "rb").read()
    size = len(data) // 2 if kept == "half" else 1000
    src.write_bytes(data)
    script = ("import os, sys\n"
              "import ggml_py.tools.quantize as qm\n"
              "from ggml_py.cli.quantize import main\n"
              "original, calls = qm.quantize, []\n"
              "def cut_short(*args, **kwargs):\n"
              "    calls.append(1)\n"
              "    if len(calls) == 3:\n"
              "        os.truncate(sys.argv[1], int(sys.argv[3]))\n"
              "    return original(*args, **kwargs)\n"
              "qm.quantize = cut_short\n"
              "sys.exit(main([sys.argv[1], sys.argv[2], 'Q4_0', '-q']))\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(gg.__file__))))
    proc = subprocess.run([sys.executable, "-c", script, str(src), str(out), str(size)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and line.startswith(f"ggml-quantize: error: {src}: the file ends at "
                                                 f"byte {size}, before the end of tensor ")
    assert "it was cut short while being read" in line
    assert sorted(os.listdir(tmp_path)) == ["in.gguf"]


def test_atomic_output_leaves_sigterm_handlers_as_it_found_them(tmp_path):
    import signal
    from ggml_py.files.output import atomic_output

    def mine(signum, frame):
        pass
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with atomic_output(tmp_path / "a") as tmp:
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, mine)
            signal.signal(signal.SIGTERM, mine)       # set within the block: kept
        assert signal.getsignal(signal.SIGTERM) is mine
        with atomic_output(tmp_path / "b") as tmp:    # a program's own handler: left alone
            assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_write_streamed_makes_each_tensor_only_when_it_is_written(tmp_path):
    import weakref
    from ggml_py.files.gguf_writer import write_streamed
    made = []

    def make(i):
        def data():
            assert all(ref() is None for ref in made)    # the one before is let go
            a = np.full((4, 32), i, np.float32)
            made.append(weakref.ref(a))
            return a
        return data

    writer = gguf.GGUFWriter(str(tmp_path / "s.gguf"), "llama")
    write_streamed(writer, [(f"t{i}", (4, 32), gguf.GGMLQuantizationType.F32, make(i))
                            for i in range(3)])
    tensors = gguf.GGUFReader(tmp_path / "s.gguf").tensors
    assert [t.name for t in tensors] == ["t0", "t1", "t2"] and len(made) == 3
    assert all(np.array_equal(np.asarray(t.data), np.full((4, 32), i)) for i, t in enumerate(tensors))
    writer = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "llama")
    with pytest.raises(ValueError, match=r"t: 64 bytes of data for Q8_0 \(2, 32\), which takes 68"):
        write_streamed(writer, [("t", (2, 32), gguf.GGMLQuantizationType.Q8_0,
                                 lambda: np.zeros(64, np.uint8))])


def test_an_array_of_arrays_in_the_metadata_is_refused_in_one_line(tmp_path):
    from ggml_py.files.gguf_file import GGUFFile
    from ggml_py.tools.quantize import field_types, field_value
    reader = gguf.GGUFReader(model_path("f32"))
    writer = gguf.GGUFWriter(str(tmp_path / "nested.gguf"), "llama")
    for key, field in GGUFFile(model_path("f32")).fields.items():   # the fields quantize copies
        if key != "general.architecture":
            writer.add_key_value(key, field_value(field), *field_types(field))
    writer.add_key_value("x.nested", [[1, 2], [3]], gguf.GGUFValueType.ARRAY,
                         gguf.GGUFValueType.ARRAY)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.array(t.data), raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    proc = run_cli(tmp_path / "nested.gguf", tmp_path / "out.gguf", "Q8_0")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"ggml-quantize: error: {tmp_path / 'nested.gguf'}: metadata 'x.nested' is an array "
        f"of arrays, which cannot be written here")
    assert os.listdir(tmp_path) == ["nested.gguf"]


def test_cli_errors_are_one_line(tmp_path):
    src = model_path("f32")
    for args, text, code in [((tmp_path / "none.gguf", tmp_path / "o.gguf", "Q4_0"), "no such file", 1),
                             ((src, tmp_path / "o.gguf", "Q9_9"), "argument type: unknown type", 2),
                             ((__file__, tmp_path / "o.gguf", "Q4_0"), "not a GGUF file", 1)]:
        proc = run_cli(*args)
        assert proc.returncode == code, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert text in proc.stderr
    other = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(other, "gpt2")
    w.add_tensor("x.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    proc = run_cli(other, tmp_path / "o.gguf", "Q4_0")
    assert proc.returncode == 1 and "unknown architecture 'gpt2'" in proc.stderr


def test_cli_quantizes(tmp_path):
    proc = run_cli(model_path("f32"), tmp_path / "q8.gguf", "q8_0", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "MiB) ->" in proc.stdout and "Q8_0" in proc.stdout


def test_bad_flags_end_in_one_line_and_status_2(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["in.gguf", "out.gguf"])                 # the type is missing
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("ggml-quantize: error: ") and err.count("\n") == 1


def test_python_m_runs_the_console_script(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(gg.__file__))))
    proc = subprocess.run([sys.executable, "-m", "ggml_py.cli.quantize", model_path("f32"),
                           tmp_path / "q8.gguf", "Q8_0", "-q"], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tempfile.gettempdir())
    assert proc.returncode == 0 and "Q8_0" in proc.stdout, proc.stderr
    assert gguf.GGUFReader(tmp_path / "q8.gguf").fields["general.file_type"].contents() == 7


def tensor_bytes(path):
    return {t.name: (int(t.tensor_type), t.data.tobytes()) for t in gguf.GGUFReader(path).tensors}


def test_requantizing_needs_allow_requantize_and_a_tensor_in_its_type_is_copied(tmp_path, capsys,
                                                                                 f32_k_model):
    q4 = tmp_path / "q4_k_m.gguf"
    quantize_file(f32_k_model, q4, "Q4_K_M", progress=False, log=lambda *a: None)
    # as llama.cpp: nothing to re-type, so nothing re-encoded, no flag needed
    assert main([str(q4), str(tmp_path / "same.gguf"), "Q4_K_M", "-q"]) == 0
    assert tensor_bytes(tmp_path / "same.gguf") == tensor_bytes(q4)
    err = one_line_error(capsys, q4, tmp_path / "q8.gguf", "Q8_0")
    assert "requantizing from type Q6_K is disabled (output.weight -> Q8_0); pass " \
           "--allow-requantize" in err
    assert "requantizing from type Q8_0 is disabled" in one_line_error(
        capsys, model_path("q8_0"), tmp_path / "f32.gguf", "F32")
    assert not os.path.exists(tmp_path / "q8.gguf") and not os.path.exists(tmp_path / "f32.gguf")
    assert main([str(q4), str(tmp_path / "q8.gguf"), "Q8_0", "-q", "--allow-requantize"]) == 0
    types = {Type(t) for name, (t, _) in tensor_bytes(tmp_path / "q8.gguf").items()
             if name.endswith(".weight") and "norm" not in name}
    assert types == {Type.Q8_0}
    # F16 is not a quantized type: re-typed without the flag; kept F16 tensors are copied
    assert main([model_path("f16"), str(tmp_path / "f16-q8.gguf"), "Q8_0", "-q"]) == 0
    assert main([model_path("f16"), str(tmp_path / "f16.gguf"), "F16", "-q"]) == 0
    assert tensor_bytes(tmp_path / "f16.gguf") == tensor_bytes(model_path("f16"))


@pytest.mark.parametrize("alignment", [16, 64])
def test_general_alignment_is_kept_and_the_data_laid_out_to_it(tmp_path, alignment):
    # 36 wide: the norms' 144 bytes pad to other offsets at 16, 32 and 64 bytes
    f32 = tmp_path / "f32.gguf"
    write_random_llama(f32, RandomLlamaSpec(n_vocab=llama_models.N_VOCAB, n_embd=36, n_head=2,
                                            n_head_kv=2, n_ff=72, seed=9), vocab=llama_models.vocab())
    kvs, tensors = gguf_parts(f32)
    src = tmp_path / "aligned.gguf"
    src.write_bytes(gguf_bytes(kvs + [("general.alignment", [V.UINT32], alignment)], tensors,
                               alignment=alignment))
    out = tmp_path / "out.gguf"
    quantize_file(src, out, "F32", progress=False, log=lambda *a: None)
    assert gguf.GGUFReader(out).fields["general.alignment"].contents() == alignment
    tokens = np.arange(1, 9, dtype=np.int32)
    logits = [LlamaModel(path, n_ctx=16, n_threads=1).forward(tokens, np.arange(8)).copy()
              for path in (src, out)]      # the loader checks every offset against the key
    assert np.array_equal(*logits)


def test_metadata_is_copied_byte_for_byte(tmp_path):
    # valid GGUF that llama.cpp copies: a token that is not UTF-8 (old conversions stored raw
    # bytes), empty arrays of any type, an empty string
    tokens = list(llama_models.vocab()["tokens"])
    tokens[300] = b"\xe2\x96"
    src = edited_model("odd-metadata.gguf", keys={
        "tokenizer.ggml.tokens": ([V.ARRAY, V.STRING], tokens),
        "general.tags": ([V.ARRAY, V.STRING], []), "x.ids": ([V.ARRAY, V.INT32], []),
        "x.empty": ([V.STRING], ""), "x.u64": ([V.UINT64], 2**63 + 5)})
    out = tmp_path / "q8.gguf"
    assert main([src, str(out), "Q8_0", "-q"]) == 0

    def kv_bytes(path):
        fields = gguf.GGUFReader(path).fields
        return {k: b"".join(p.tobytes() for p in f.parts) for k, f in fields.items()
                if not k.startswith("GGUF.")}
    before, after = kv_bytes(src), kv_bytes(out)
    assert {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)} == {
        "general.file_type", "general.quantization_version"}
    # the input's order, these two last in llama.cpp's order (its file: the same bytes)
    keys = [k for k in gguf.GGUFReader(out).fields if not k.startswith("GGUF.")]
    assert keys[-2:] == ["general.quantization_version", "general.file_type"]
    assert keys[:-2] == [k for k in before if k not in keys[-2:]]
    gg.Llama(str(out), n_ctx=0).close()      # and loads


def test_big_endian_and_split_files_are_one_line_errors(tmp_path, capsys):
    big = edited_model("q-big-endian.gguf", order=">")
    assert "big-endian GGUF file: ggml_py, like llama.cpp, reads only" in one_line_error(
        capsys, big, tmp_path / "o.gguf", "Q8_0")
    shard = edited_model("q-shard.gguf", keys={"split.no": ([V.UINT16], 0),
                                               "split.count": ([V.UINT16], 2)})
    assert "split GGUF files are not supported; merge them first (llama.cpp's gguf-split " \
           "--merge)" in one_line_error(capsys, shard, tmp_path / "o.gguf", "Q8_0")
    assert os.listdir(tmp_path) == []


def test_the_input_header_is_checked_as_the_loader_checks_it(tmp_path, capsys):
    # duplicate keys and misplaced tensor data: the loader refuses such files, so
    # quantizing one must not write a file that then fails to load (or loads wrong)
    kvs, tensors = gguf_parts(model_path("f32"))
    dup = scratch_path("q-dup-key.gguf")
    open(dup, "wb").write(gguf_bytes(kvs + [("llama.block_count", [V.UINT32], 1)], tensors))
    assert "duplicate metadata key 'llama.block_count'" in one_line_error(
        capsys, dup, tmp_path / "o.gguf", "Q8_0")
    bad_alignment = edited_model("q-align.gguf", keys={"general.alignment": ([V.UINT32], 48)},
                                 alignment=48)
    assert "general.alignment = 48 (UINT32) must be a UINT32 power of two" in one_line_error(
        capsys, bad_alignment, tmp_path / "o.gguf", "Q8_0")
    assert os.listdir(tmp_path) == []


def test_values_the_type_cannot_hold_are_refused_as_llama_cpp_refuses_them(tmp_path, capsys):
    # a weight of -1e5: F16 overflows, and so does Q4_1's block minimum (an F16); llama.cpp
    # refuses the file ("quantized data validation failed"), ggml-quantize wrote infinities
    def weight_set_to(value):
        def edit(parts):
            for part in parts:
                if part[0] == "blk.0.attn_q.weight":
                    data = np.frombuffer(part[3], np.float32).copy()
                    data[5] = value
                    part[3] = data.tobytes()
            return parts
        return edit

    src = edited_model("q-big-weight.gguf", tensors=weight_set_to(-1e5))
    for target in ("F16", "Q4_1", "Q5_1"):
        line = one_line_error(capsys, src, tmp_path / "o.gguf", target)
        assert f"{src}: tensor blk.0.attn_q.weight: " in line and f"not finite in {target}" in line
    assert os.listdir(tmp_path) == []
    for target in ("Q8_0", "Q4_0"):          # whose scales hold it: quantized as ever
        assert main([src, str(tmp_path / f"{target}.gguf"), target, "-q"]) == 0
    nan = edited_model("q-nan-weight.gguf", tensors=weight_set_to(np.nan))
    assert "has invalid data" in one_line_error(capsys, nan, tmp_path / "n.gguf", "F16")


def test_nan_or_inf_in_the_input_is_refused_as_llama_cpp_refuses_it(tmp_path, capsys):
    # the block quantizers pass over a NaN: one NaN zeroed part of its Q6_K block, silently;
    # llama.cpp checks the model it quantizes first ("tensor '...' has invalid data")
    def set_value(index, value):
        def edit(parts):
            for part in parts:
                if part[0] == "blk.0.attn_q.weight":
                    data = np.frombuffer(part[3], np.float32).copy()
                    data[index] = value
                    part[3] = data.tobytes()
            return parts
        return edit

    n_row = next(ne[0] for name, ne, _, _ in gguf_parts(model_path("f32"))[1]
                 if name == "blk.0.attn_q.weight")
    for value, name in ((np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")):
        src = edited_model(f"q-input-{name}.gguf", tensors=set_value(n_row + 3, value))
        for target in ("Q4_0", "Q6_K", "Q8_0", "Q4_K_M"):
            line = one_line_error(capsys, src, tmp_path / "o.gguf", target)
            assert (f"tensor blk.0.attn_q.weight has invalid data: 1 of its" in line
                    and f"NaN or inf (the first: value {n_row + 3})" in line), line
    # from a quantized input too: a block scale of NaN (re-typed with --allow-requantize, or
    # copied as it is)
    q8 = tmp_path / "q8.gguf"
    assert main([model_path("f32"), str(q8), "Q8_0", "-q"]) == 0
    reader = gguf.GGUFReader(q8, "r+")
    tensor = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    tensor.data.reshape(-1)[:2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
    del reader
    for target, extra in (("Q4_0", ["--allow-requantize"]), ("Q8_0", [])):
        line = one_line_error(capsys, q8, tmp_path / "o.gguf", target, *extra)
        assert ("tensor blk.0.attn_q.weight has invalid data: 1 of its" in line
                and "blocks have a scale of NaN or inf (the first: block 0, nan)" in line), line
    assert sorted(os.listdir(tmp_path)) == ["q8.gguf"]


# ggml's block structs (ggml-common.h): the byte offset and type of each scale that
# ggml_validate_row_data checks
GGML_BLOCK_SCALES = {
    Type.Q4_0: ((0, np.float16),), Type.Q4_1: ((0, np.float16), (2, np.float16)),
    Type.Q5_0: ((0, np.float16),), Type.Q5_1: ((0, np.float16), (2, np.float16)),
    Type.Q8_0: ((0, np.float16),),
    Type.Q2_K: ((80, np.float16), (82, np.float16)), Type.Q3_K: ((108, np.float16),),
    Type.Q4_K: ((0, np.float16), (2, np.float16)), Type.Q5_K: ((0, np.float16), (2, np.float16)),
    Type.Q6_K: ((208, np.float16),), Type.Q8_K: ((0, np.float32),),
}


@pytest.mark.parametrize("type", sorted(GGML_BLOCK_SCALES), ids=lambda t: t.name)
def test_the_scales_found_are_ggmls(type):
    assert block_scales(type) == GGML_BLOCK_SCALES[type]


@pytest.mark.parametrize("type", [t for t in GGML_BLOCK_SCALES if t != Type.Q8_K], ids=lambda t: t.name)
def test_the_scales_checked_are_exactly_the_fields_whose_nan_reaches_the_values(type):
    # on quantized data (block_scales probes a block of zeros): a NaN written at each
    # 2-byte position of a block in turn
    x = np.random.default_rng(5).standard_normal((1, 256)).astype(np.float32)
    q = gg.quantize(x, type)
    size = gg.type_traits(type)["type_size"]
    poisoning = set()
    for offset in range(0, size - 1, 2):
        bad = q.copy()
        bad[0, offset:offset + 2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
        if np.isnan(gg.dequantize(bad, type, x.shape)).any():
            poisoning.add(offset)
    assert poisoning == {offset for offset, _ in block_scales(type)}


@pytest.mark.parametrize("type", [t for t in Type if block_scales(t)], ids=lambda t: t.name)
def test_the_scales_checked_are_the_blocks_scales(type):
    # a NaN written where block_scales says a scale is makes that block de-quantize to NaN
    # (Q8_K is not de-quantized: its float scale is its first 4 bytes, as in ggml's block_q8_K)
    x = np.random.default_rng(3).standard_normal((2, 512)).astype(np.float32)
    q = gg.quantize(x, type)
    assert invalid_data(type, q) is None
    for offset, dtype in block_scales(type):
        bad = q.copy()
        size = gg.type_traits(type)["type_size"]
        at = size + offset                                   # the second block of row 0
        bad[0, at:at + np.dtype(dtype).itemsize] = np.frombuffer(dtype(np.nan).tobytes(), np.uint8)
        assert "(the first: block 1, nan)" in invalid_data(type, bad)
        if type != Type.Q8_K:
            values = gg.dequantize(bad, type, x.shape)
            block = gg.type_traits(type)["blck_size"]
            assert np.isnan(values[0, block:2 * block]).any() and np.isfinite(values[1]).all()


@pytest.mark.parametrize("type", [Type.F32, Type.F16, Type.BF16, Type.F64], ids=lambda t: t.name)
def test_float_tensors_are_checked_value_by_value(type, monkeypatch):
    import ggml_py.tools.quantize as qm
    monkeypatch.setattr(qm, "CHECK_CHUNK", 7)             # the chunks add up
    values = np.ones(40, np.float64)
    values[[9, 30]] = [np.inf, np.nan]
    if type == Type.BF16:
        raw = (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    else:
        raw = values.astype({Type.F32: np.float32, Type.F16: np.float16, Type.F64: np.float64}[type])
    assert invalid_data(type, raw) == "2 of its 40 values are NaN or inf (the first: value 9)"
    assert invalid_data(type, np.ones_like(raw)) is None
    # the largest finite values (exponent all ones but the last bit) are not NaN or inf
    if type == Type.BF16:
        largest = np.array([0x7F7F, 0xFF7F, 0x7F00, 0x0001], np.uint16)
    else:
        dtype = raw.dtype
        largest = np.array([1, -1], dtype) * np.finfo(dtype).max
    assert invalid_data(type, largest) is None
