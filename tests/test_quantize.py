"""ggml-quantize: llama.cpp's type rules, end-to-end files, bad input."""
import os
import subprocess
import sys
import tempfile

import gguf
import numpy as np
import pytest

from llama_models import model_path, scratch_path
from llama_reference import ReferenceLlama

import ggml_py as gg
from ggml_py.llama import LlamaModel
from ggml_py.quantize_model import TARGETS, quantize_file, tensor_type, use_more_bits
from ggml_py.random_model import RandomLlamaSpec, write_random_llama
from ggml_py.types import Type

import llama_models


def test_use_more_bits_matches_llama_cpp_for_22_layers():
    assert [i for i in range(22) if use_more_bits(i, 22)] == [0, 1, 4, 7, 10, 13, 16, 19, 20, 21]


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
])
def test_tensor_types_follow_llama_cpp(name, target, expected):
    assert tensor_type(name, 2048, TARGETS[target], 22, tied_output=False) == expected


def test_tied_output_and_row_length_fallbacks():
    assert tensor_type("token_embd.weight", 2048, TARGETS["Q4_K_M"], 22, tied_output=True) == Type.Q6_K
    assert tensor_type("output.weight", 704, TARGETS["Q4_K_M"], 22, False) == Type.Q8_0
    assert tensor_type("blk.3.ffn_up.weight", 704, TARGETS["Q4_K_M"], 22, False) == Type.Q5_0
    assert tensor_type("blk.0.ffn_down.weight", 704, TARGETS["Q4_K_M"], 22, False) == Type.Q8_0
    assert tensor_type("blk.3.ffn_up.weight", 48, TARGETS["Q4_0"], 22, False) == Type.F16


@pytest.fixture(scope="module")
def f32_k_model():
    path = scratch_path("k-f32.gguf")
    write_random_llama(path, RandomLlamaSpec(n_vocab=llama_models.N_VOCAB, n_embd=256, n_head=4,
                                             n_head_kv=2, n_ff=512, n_layer=4, seed=7),
                       vocab=llama_models.vocab())
    return path


@pytest.mark.parametrize("target", ["Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "Q4_K_S", "Q6_K", "F16"])
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
    # the quantized file runs, and agrees with a float64 forward of its own weights
    # (40 tokens: the BLAS profiles, f32 sgemm on the de-quantized weights)
    tokens = np.arange(1, 41, dtype=np.int32)
    model = LlamaModel(out, n_ctx=64, kv_type=Type.F32, n_threads=1)
    logits = model.forward(tokens, np.arange(40)).copy()
    expected = ReferenceLlama(out).forward(tokens)
    assert np.abs(logits - expected).max() <= 1e-4 * np.abs(expected).max()


def run_cli(*args):
    # the ggml_py under test, from a neutral folder (a checkout's ggml_py/ must not shadow it)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(gg.__file__))))
    return subprocess.run([sys.executable, "-c", "import sys; from ggml_py.quantize_model import main; "
                           "sys.exit(main(sys.argv[1:]))", *map(str, args)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tempfile.gettempdir())


def test_cli_errors_are_one_line(tmp_path):
    src = model_path("f32")
    for args, text in [((tmp_path / "none.gguf", tmp_path / "o.gguf", "Q4_0"), "no such file"),
                       ((src, tmp_path / "o.gguf", "Q9_9"), "unknown type"),
                       ((__file__, tmp_path / "o.gguf", "Q4_0"), "not a readable GGUF")]:
        proc = run_cli(*args)
        assert proc.returncode == 1, proc.stderr
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
    assert proc.returncode == 1 and "is not llama" in proc.stderr


def test_cli_quantizes(tmp_path):
    proc = run_cli(model_path("f32"), tmp_path / "q8.gguf", "q8_0", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "MiB) ->" in proc.stdout and "Q8_0" in proc.stdout
