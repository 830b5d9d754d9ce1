"""ggml-convert: a tiny synthetic HF llama checkpoint -> GGUF, read back with gguf's reader."""

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from ggml_py.tools import convert as cv  # noqa: E402
from ggml_py.tools.convert.sentencepiece_model import read_sentencepiece_model  # noqa: E402
from ggml_py.tools.convert.tensors import permute_rope_rows  # noqa: E402
from ggml_py.tools.convert.vocab import bpe_pre_name  # noqa: E402
from ggml_py.cli.convert import main as convert_main  # noqa: E402
from ggml_py.files.gguf_metadata import read_gguf_metadata  # noqa: E402
from ggml_py.files.gguf_reader import GGUFModelFile  # noqa: E402
from ggml_py.model.config import LlamaConfig  # noqa: E402
from ggml_py.tokenizer.tokenizer import Tokenizer  # noqa: E402
from test_tokenizer import load_cases, vocab_path  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

N_EMBD, N_HEAD, N_HEAD_KV, N_LAYER, N_FF = 16, 4, 2, 2, 24
HEAD_DIM = N_EMBD // N_HEAD
WORDS = ["▁", "a", "b", "c", "ab", "▁a", "▁ab", "▁b", "abc", "▁c"]
N_TOKENS = 3 + 256 + len(WORDS)
N_VOCAB = N_TOKENS + 2                       # padded by the converter


# ----------------------------------------------------------------------------- fixtures

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num: int, value) -> bytes:
    if isinstance(value, bytes):
        return _varint(num << 3 | 2) + _varint(len(value)) + value
    if isinstance(value, float):
        return _varint(num << 3 | 5) + struct.pack("<f", value)
    return _varint(num << 3) + _varint(value)


def spm_pieces() -> list[tuple[str, float, int]]:
    pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
    pieces += [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
    pieces += [(w, -float(i), 1) for i, w in enumerate(WORDS)]
    return pieces


def write_spm_model(path: Path, add_dummy_prefix: bool | None) -> None:
    """A SentencePiece ModelProto (BPE, byte fallback) written by hand."""
    body = b"".join(_field(1, _field(1, p.encode()) + _field(2, s) + _field(3, t))
                    for p, s, t in spm_pieces())
    body += _field(2, _field(3, 2) + _field(4, N_TOKENS) + _field(35, 1) + _field(43, -1))
    norm = _field(1, b"identity") + _field(4, 0)
    if add_dummy_prefix is not None:
        norm += _field(3, int(add_dummy_prefix))
    body += _field(3, norm)
    path.write_bytes(body)


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtypes: dict[str, str]) -> None:
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, array in tensors.items():
        kind = dtypes.get(name, "F32")
        if kind == "BF16":
            raw = (np.ascontiguousarray(array, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        elif kind == "F16":
            raw = array.astype("<f2").tobytes()
        else:
            raw = array.astype("<f4").tobytes()
        header[name] = {"dtype": kind, "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def hf_tensors(rng: np.random.Generator, tied: bool, head_dim: int = HEAD_DIM) -> dict[str, np.ndarray]:
    def mat(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    t = {"model.embed_tokens.weight": mat(N_VOCAB, N_EMBD)}
    for i in range(N_LAYER):
        p = f"model.layers.{i}."
        t.update({
            p + "input_layernorm.weight": mat(N_EMBD),
            p + "self_attn.q_proj.weight": mat(N_HEAD * head_dim, N_EMBD),
            p + "self_attn.k_proj.weight": mat(N_HEAD_KV * head_dim, N_EMBD),
            p + "self_attn.v_proj.weight": mat(N_HEAD_KV * head_dim, N_EMBD),
            p + "self_attn.o_proj.weight": mat(N_EMBD, N_HEAD * head_dim),
            p + "post_attention_layernorm.weight": mat(N_EMBD),
            p + "mlp.gate_proj.weight": mat(N_FF, N_EMBD),
            p + "mlp.up_proj.weight": mat(N_FF, N_EMBD),
            p + "mlp.down_proj.weight": mat(N_EMBD, N_FF),
            p + "self_attn.rotary_emb.inv_freq": mat(head_dim // 2),
        })
    t["model.norm.weight"] = mat(N_EMBD)
    if not tied:
        t["lm_head.weight"] = mat(N_VOCAB, N_EMBD)
    return t


def make_checkpoint(root: Path, *, tied=True, adjacent=True, add_dummy_prefix=False,
                    dtypes=None, seed=0, head_dim=None) -> tuple[Path, dict[str, np.ndarray]]:
    d = root / "tiny-llama"
    d.mkdir()
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": N_EMBD, "intermediate_size": N_FF, "num_hidden_layers": N_LAYER,
        "num_attention_heads": N_HEAD, "num_key_value_heads": N_HEAD_KV,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 500.0,
        "vocab_size": N_VOCAB, "tie_word_embeddings": tied, "bos_token_id": 1, "eos_token_id": 2,
    }
    if adjacent:
        config["rope_pairing"] = "adjacent"
    if head_dim is not None:
        config["head_dim"] = head_dim
    (d / "config.json").write_text(json.dumps(config))
    tensors = hf_tensors(np.random.default_rng(seed), tied, head_dim or HEAD_DIM)
    write_safetensors(d / "model.safetensors", tensors, dtypes or {})
    write_spm_model(d / "tokenizer.model", add_dummy_prefix)
    return d, tensors


def read(path: Path):
    reader = gguf.GGUFReader(str(path))
    fields = {name: f.contents() for name, f in reader.fields.items()}
    tensors = {t.name: t for t in reader.tensors}
    return reader, fields, tensors


# ----------------------------------------------------------------------------- round trip

def test_f32_round_trip_metadata_tensors_and_vocab(tmp_path):
    d, hf = make_checkpoint(tmp_path)
    out = cv.convert(d, tmp_path / "tiny.gguf", "f32", log=lambda *a: None)
    _, f, t = read(out)

    assert f["general.architecture"] == "llama"
    assert f["general.file_type"] == 0
    assert f["llama.context_length"] == 64
    assert f["llama.embedding_length"] == N_EMBD
    assert f["llama.block_count"] == N_LAYER
    assert f["llama.feed_forward_length"] == N_FF
    assert f["llama.attention.head_count"] == N_HEAD
    assert f["llama.attention.head_count_kv"] == N_HEAD_KV
    assert f["llama.rope.freq_base"] == pytest.approx(500.0)
    assert f["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert f["llama.rope.dimension_count"] == HEAD_DIM

    pieces = spm_pieces()
    assert f["tokenizer.ggml.model"] == "llama"
    assert f["tokenizer.ggml.tokens"] == [p for p, _, _ in pieces] + ["[PAD%d]" % i for i in (N_TOKENS, N_TOKENS + 1)]
    assert f["tokenizer.ggml.scores"][:N_TOKENS] == pytest.approx([s for _, s, _ in pieces])
    assert f["tokenizer.ggml.scores"][N_TOKENS:] == [-10000.0, -10000.0]    # as llama.cpp's converter
    assert f["tokenizer.ggml.token_type"] == [k for _, _, k in pieces] + [5, 5]
    assert (f["tokenizer.ggml.bos_token_id"], f["tokenizer.ggml.eos_token_id"],
            f["tokenizer.ggml.unknown_token_id"]) == (1, 2, 0)
    assert f["tokenizer.ggml.add_bos_token"] is True
    assert f["tokenizer.ggml.add_eos_token"] is False
    assert f["tokenizer.ggml.add_space_prefix"] is False
    assert "tokenizer.ggml.padding_token_id" not in f

    expected = ["token_embd.weight"]
    for i in range(N_LAYER):
        expected += [f"blk.{i}.{n}.weight" for n in ("attn_norm", "attn_q", "attn_k", "attn_v",
                     "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")]
    expected.append("output_norm.weight")
    assert list(t) == expected                       # tied: no output.weight
    assert list(t["blk.0.attn_k.weight"].shape) == [N_EMBD, N_HEAD_KV * HEAD_DIM]   # ne order
    assert t["blk.1.ffn_down.weight"].data.shape == (N_EMBD, N_FF)
    # adjacent-pair checkpoint: q and k are written unchanged
    np.testing.assert_array_equal(t["blk.1.attn_q.weight"].data, hf["model.layers.1.self_attn.q_proj.weight"])
    np.testing.assert_array_equal(t["blk.0.attn_k.weight"].data, hf["model.layers.0.self_attn.k_proj.weight"])
    np.testing.assert_array_equal(t["token_embd.weight"].data, hf["model.embed_tokens.weight"])
    np.testing.assert_array_equal(t["output_norm.weight"].data, hf["model.norm.weight"])
    for tensor in t.values():
        assert tensor.tensor_type == gguf.GGMLQuantizationType.F32


@pytest.mark.parametrize("outtype, qtype", [("f16", "F16"), ("bf16", "BF16")])
def test_half_outtypes_keep_norms_f32(tmp_path, outtype, qtype):
    d, hf = make_checkpoint(tmp_path, tied=False,
                            dtypes={"model.layers.0.mlp.up_proj.weight": "BF16",
                                    "model.layers.1.mlp.up_proj.weight": "F16"})
    out = cv.convert(d, tmp_path / "tiny.gguf", outtype, log=lambda *a: None)
    _, f, t = read(out)
    assert f["general.file_type"] == {"f16": 1, "bf16": 32}[outtype]
    assert "output.weight" in t
    for name, tensor in t.items():
        want = "F32" if name.endswith("norm.weight") else qtype
        assert tensor.tensor_type == gguf.GGMLQuantizationType[want], name
    w = hf["model.layers.0.mlp.gate_proj.weight"]
    got = t["blk.0.ffn_gate.weight"].data
    if outtype == "f16":
        np.testing.assert_array_equal(got, w.astype(np.float16))
    else:
        got = (got.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        np.testing.assert_allclose(got, w, rtol=2 ** -8)
        np.testing.assert_array_equal(got, gguf.quants.dequantize(
            gguf.quants.quantize(w, gguf.GGMLQuantizationType.BF16), gguf.GGMLQuantizationType.BF16))
    # a BF16 source tensor arrives as its exact value
    src = hf["model.layers.0.mlp.up_proj.weight"]
    src_bf16 = ((src.view(np.uint32) >> 16) << 16).view(np.float32)
    up = t["blk.0.ffn_up.weight"].data
    up = up.astype(np.float32) if outtype == "f16" else (up.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_allclose(up, src_bf16, rtol=2 ** -8 if outtype == "bf16" else 1e-3)


def _rope_half(x, pos, theta):
    """HF rotate_half RoPE on x (n_head, head_dim)."""
    d = x.shape[-1]
    ang = pos * theta ** (-np.arange(0, d, 2) / d)
    cos, sin = np.cos(np.concatenate([ang, ang])), np.sin(np.concatenate([ang, ang]))
    rot = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1)
    return x * cos + rot * sin


def _rope_adjacent(x, pos, theta):
    """llama.cpp "normal" RoPE on x (n_head, head_dim): adjacent pairs."""
    d = x.shape[-1]
    ang = pos * theta ** (-np.arange(0, d, 2) / d)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return np.stack([x0 * np.cos(ang) - x1 * np.sin(ang), x0 * np.sin(ang) + x1 * np.cos(ang)], -1).reshape(x.shape)


@pytest.mark.parametrize("head_dim", [HEAD_DIM, 6])
def test_hf_checkpoint_gets_rope_permutation_same_attention_scores(tmp_path, head_dim):
    # (6: heads not hidden_size / num_attention_heads wide, as Mistral Nemo's)
    d, hf = make_checkpoint(tmp_path, adjacent=False, head_dim=head_dim)
    out = cv.convert(d, tmp_path / "tiny.gguf", "f32", log=lambda *a: None)
    _, fields, t = read(out)
    assert fields.get("llama.attention.key_length", HEAD_DIM) == head_dim
    assert LlamaConfig.from_gguf(GGUFModelFile(out)).head_dim == head_dim
    rng = np.random.default_rng(1)
    x_q, x_k = rng.standard_normal(N_EMBD), rng.standard_normal(N_EMBD)
    group = N_HEAD // N_HEAD_KV
    for i in range(N_LAYER):
        wq_hf, wk_hf = hf[f"model.layers.{i}.self_attn.q_proj.weight"], hf[f"model.layers.{i}.self_attn.k_proj.weight"]
        wq, wk = t[f"blk.{i}.attn_q.weight"].data, t[f"blk.{i}.attn_k.weight"].data
        assert not np.array_equal(wq, wq_hf)
        q_hf = _rope_half((wq_hf @ x_q).reshape(N_HEAD, head_dim), 7, 500.0)
        k_hf = _rope_half((wk_hf @ x_k).reshape(N_HEAD_KV, head_dim), 3, 500.0)
        q = _rope_adjacent((wq @ x_q).reshape(N_HEAD, head_dim), 7, 500.0)
        k = _rope_adjacent((wk @ x_k).reshape(N_HEAD_KV, head_dim), 3, 500.0)
        scores_hf = np.einsum("hd,hd->h", q_hf, np.repeat(k_hf, group, axis=0))
        scores = np.einsum("hd,hd->h", q, np.repeat(k, group, axis=0))
        np.testing.assert_allclose(scores, scores_hf, rtol=1e-4, atol=1e-4)
        # v is never permuted
        np.testing.assert_array_equal(t[f"blk.{i}.attn_v.weight"].data, hf[f"model.layers.{i}.self_attn.v_proj.weight"])


@pytest.mark.parametrize("add_dummy_prefix", [False, None])
def test_ggml_py_tokenizer_reads_converted_vocab(tmp_path, add_dummy_prefix):
    d, _ = make_checkpoint(tmp_path, add_dummy_prefix=add_dummy_prefix)
    out = cv.convert(d, tmp_path / "tiny.gguf", "f32", log=lambda *a: None)
    tok = Tokenizer.from_gguf(str(out))
    ids = {p: i for i, (p, _, _) in enumerate(spm_pieces())}
    got = tok.tokenize("ab abc\nz")
    body = ["ab", "▁ab", "c", "<0x0A>", "<0x7A>"]
    prefix = [] if add_dummy_prefix is False else ["▁"]   # proto2 default: prefix on
    if prefix:
        body = ["▁ab", "▁ab", "c", "<0x0A>", "<0x7A>"]
    assert got == [1] + [ids[p] for p in body]
    assert tok.detokenize(got[1:]) == "ab abc\nz"       # the prefix space is removed again


def test_handwritten_model_matches_sentencepiece(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    path = tmp_path / "t.model"
    write_spm_model(path, add_dummy_prefix=False)
    sp = spm.SentencePieceProcessor(model_file=str(path))
    m = read_sentencepiece_model(path)
    assert m["pieces"] == [sp.id_to_piece(i) for i in range(sp.vocab_size())]
    assert m["scores"] == pytest.approx([sp.get_score(i) for i in range(sp.vocab_size())])
    assert (m["bos_id"], m["eos_id"], m["unk_id"], m["pad_id"]) == (sp.bos_id(), sp.eos_id(), sp.unk_id(), sp.pad_id())
    assert sp.encode("ab abc", out_type=str) == ["ab", "▁ab", "c"]


def test_pytorch_bin_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    d, hf = make_checkpoint(tmp_path)
    (d / "model.safetensors").unlink()
    torch.save({k: torch.from_numpy(v) for k, v in hf.items()}, d / "pytorch_model.bin")
    out = cv.convert(d, tmp_path / "tiny.gguf", "f32", log=lambda *a: None)
    _, _, t = read(out)
    np.testing.assert_array_equal(t["blk.0.ffn_up.weight"].data, hf["model.layers.0.mlp.up_proj.weight"])


def test_default_outfile_and_cli(tmp_path, capsys):
    d, _ = make_checkpoint(tmp_path)
    assert convert_main([str(d), "--outtype", "F16"]) == 0
    assert (d / "tiny-llama-f16.gguf").is_file()
    assert "wrote" in capsys.readouterr().out


def test_a_closed_log_pipe_is_not_reported_as_an_unwritable_output(tmp_path):
    # `ggml-convert DIR | head -1`: the reader of the per-tensor lines goes away mid-write
    d, _ = make_checkpoint(tmp_path)
    lines = []

    def log(line):
        lines.append(line)
        if len(lines) == 3:
            raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(BrokenPipeError):   # console_script makes it exit 141, quietly
        cv.convert(d, tmp_path / "tiny.gguf", "f32", log=log)


# ----------------------------------------------------------------------------- bad inputs

def _error(capsys, argv):
    rc = convert_main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert rc != 0
    assert len(lines) == 1 and lines[0].startswith("ggml-convert: error: "), captured.err
    return lines[0]


def test_error_missing_directory(tmp_path, capsys):
    assert "not a directory" in _error(capsys, [str(tmp_path / "nope")])


def test_error_missing_config(tmp_path, capsys):
    d, _ = make_checkpoint(tmp_path)
    (d / "config.json").unlink()
    assert "no config.json" in _error(capsys, [str(d)])


@pytest.mark.parametrize("names", [{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"},
                                   # the class decides, not model_type (this one converted)
                                   {"architectures": ["GPT2LMHeadModel"], "model_type": "llama"},
                                   {"model_type": "gpt2"}])
def test_error_not_llama(tmp_path, capsys, names):
    d, _ = make_checkpoint(tmp_path)
    config = json.loads((d / "config.json").read_text())
    config.pop("architectures")
    (d / "config.json").write_text(json.dumps({**config, **names}))
    assert "not a llama model" in _error(capsys, [str(d)])


@pytest.mark.parametrize("names", [{"architectures": ["MistralForCausalLM"], "model_type": "mistral"},
                                   {"architectures": [], "model_type": "mistral"},
                                   {"architectures": ["LLaMAForCausalLM"]}])   # early checkpoints
def test_mistral_checkpoints_are_llama(tmp_path, names):
    # the same architecture, as llama.cpp converts it; a sliding window is not written
    d, _ = make_checkpoint(tmp_path)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, **names, "sliding_window": 32}))
    out = tmp_path / "mistral.gguf"
    assert convert_main([str(d), "--outfile", str(out)]) == 0
    _, fields, _ = read(out)
    assert fields["general.architecture"] == "llama"
    assert not any("sliding" in key for key in fields)


def test_error_bad_json_and_missing_key(tmp_path, capsys):
    d, _ = make_checkpoint(tmp_path)
    (d / "config.json").write_text("{not json")
    assert "not valid JSON" in _error(capsys, [str(d)])
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert "missing key" in _error(capsys, [str(d)])


def test_error_unknown_outtype(tmp_path, capsys):
    d, _ = make_checkpoint(tmp_path)
    with pytest.raises(SystemExit) as stop:        # a flag error, as every console script's
        convert_main([str(d), "--outtype", "q9_9"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert "argument --outtype: invalid choice: 'q9_9'" in err
    assert convert_main([str(d), "--outtype", "F32", "--vocab-only", "--outfile", str(tmp_path / "v.gguf")]) == 0
    with pytest.raises(cv.ConvertError, match="unknown --outtype 'q8'"):   # the API checks it too
        cv.convert(d, tmp_path / "x.gguf", "q8")


def test_error_missing_weights_and_tokenizer(tmp_path, capsys):
    d, _ = make_checkpoint(tmp_path)
    (d / "tokenizer.model").unlink()
    assert "no tokenizer" in _error(capsys, [str(d)])
    write_spm_model(d / "tokenizer.model", False)
    (d / "model.safetensors").unlink()
    assert "no weights" in _error(capsys, [str(d)])


def test_error_missing_or_misshapen_tensor(tmp_path, capsys):
    d, hf = make_checkpoint(tmp_path)
    del hf["model.layers.1.mlp.up_proj.weight"]
    write_safetensors(d / "model.safetensors", hf, {})
    assert "missing tensor blk.1.ffn_up.weight" in _error(capsys, [str(d)])
    hf["model.layers.1.mlp.up_proj.weight"] = np.zeros((N_FF, N_EMBD + 1), np.float32)
    write_safetensors(d / "model.safetensors", hf, {})
    assert "shape" in _error(capsys, [str(d)])
    hf["model.layers.1.mlp.up_proj.weight"] = np.zeros((N_FF, N_EMBD), np.float32)
    hf["model.extra.weight"] = np.zeros(3, np.float32)
    write_safetensors(d / "model.safetensors", hf, {})
    assert "unexpected tensor 'model.extra.weight'" in _error(capsys, [str(d)])
    # a layer past num_hidden_layers (a config that says 2 layers of a 3-layer checkpoint)
    del hf["model.extra.weight"]
    hf[f"model.layers.{N_LAYER}.mlp.up_proj.weight"] = np.zeros((N_FF, N_EMBD), np.float32)
    write_safetensors(d / "model.safetensors", hf, {})
    assert (f"unexpected tensor 'model.layers.{N_LAYER}.mlp.up_proj.weight' for a {N_LAYER}-layer "
            f"llama") in _error(capsys, [str(d)])


def test_an_untied_config_without_lm_head_says_how_to_tie(tmp_path, capsys):
    d, hf = make_checkpoint(tmp_path, tied=False)
    del hf["lm_head.weight"]
    write_safetensors(d / "model.safetensors", hf, {})
    assert '"tie_word_embeddings": true' in _error(capsys, [str(d)])


def test_error_corrupt_files(tmp_path, capsys):
    d, _ = make_checkpoint(tmp_path)
    (d / "model.safetensors").write_bytes(b"\xff" * 64)
    assert "not a safetensors file" in _error(capsys, [str(d)])
    (d / "tokenizer.model").write_bytes(b"\x0f\x00garbage")
    assert "not a SentencePiece model" in _error(capsys, [str(d)])


def _set_config(d: Path, **changes) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("changes, message", [
    ({"num_attention_heads": 0}, "num_attention_heads is 0, not a positive integer"),
    ({"num_key_value_heads": -2}, "num_key_value_heads is -2, not a positive integer"),
    ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ({"hidden_size": 16.7}, "hidden_size is 16.7, not a positive integer"),
    ({"hidden_size": 18}, "hidden_size 18 is not a multiple of num_attention_heads 4"),
    ({"head_dim": 8}, "blk.0.attn_q.weight: shape (16, 16), expected (32, 16)"),  # heads of 4
    ({"head_dim": 5}, "the head size 5 is odd"),
    ({"vocab_size": -1}, "vocab_size is -1, not a positive integer"),
    ({"num_hidden_layers": True}, "num_hidden_layers is True, not a positive integer"),
    ({"intermediate_size": "24"}, "intermediate_size is '24', not a positive integer"),
    ({"max_position_embeddings": 0}, "max_position_embeddings is 0"),
    ({"vocab_size": 2**40}, f"vocab_size is {2**40}, too large"),
    ({"hidden_size": 2**31}, f"hidden_size is {2**31}, too large"),       # GGUF writes u32
    ({"rms_norm_eps": 0.0}, "rms_norm_eps is 0.0, not a positive number"),
    ({"rope_theta": 10**400}, "rope_theta is 1000"),
    ({"rms_norm_eps": "tiny"}, "rms_norm_eps is 'tiny', not a positive number"),
    ({"rope_theta": -1.0}, "rope_theta is -1.0, not a positive number"),
    ({"rope_scaling": "linear"}, "rope_scaling is 'linear', not an object"),
    ({"rope_scaling": {"type": "linear"}}, "rope_scaling has no factor"),
    ({"rope_scaling": {"type": "linear", "factor": "x"}}, "rope_scaling factor is 'x', not a positive number"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling type 'yarn' is not supported"),
    ({"rope_parameters": "x"}, "rope_parameters is 'x', not an object"),
    ({"rope_parameters": {"rope_theta": -1}}, "rope_parameters rope_theta is -1, not a positive number"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}},
     "rope_parameters type 'llama3' is not supported"),
    ({"rope_parameters": {"rope_type": "linear"}}, "rope_parameters has no factor"),
    ({"attention_bias": "yes"}, "attention_bias is 'yes', not true or false"),
    ({"mlp_bias": 1}, "mlp_bias is 1, not true or false"),
    ({"architectures": 5}, "architectures is 5, not a list of class names"),
    ({"architectures": 0}, "architectures is 0, not a list of class names"),
    ({"mlp_bias": ""}, "mlp_bias is '', not true or false"),
    ({"tie_word_embeddings": 0}, "tie_word_embeddings is 0, not true or false"),
    ({"rope_scaling": 0}, "rope_scaling is 0, not an object"),
    ({"rope_scaling": ""}, "rope_scaling is '', not an object"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings is 'yes', not true or false"),
])
def test_error_bad_config_values_name_the_key(tmp_path, capsys, changes, message):
    d, _ = make_checkpoint(tmp_path)
    _set_config(d, **changes)
    assert message in _error(capsys, [str(d), "--outfile", str(tmp_path / "o.gguf")])
    assert not (tmp_path / "o.gguf").exists()


def test_config_integral_floats_and_nulls_take_their_defaults(tmp_path):
    d, _ = make_checkpoint(tmp_path)
    _set_config(d, hidden_size=16.0, max_position_embeddings=None, rope_theta=None, rope_scaling=None)
    _, fields, _ = read(cv.convert(d, tmp_path / "o.gguf", "f32", log=lambda *a: None))
    assert fields["llama.embedding_length"] == N_EMBD
    assert fields["llama.context_length"] == 2048 and fields["llama.rope.freq_base"] == 10000.0


def _safetensors_bytes(header) -> bytes:
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + b"\0" * 8


@pytest.mark.parametrize("header, message", [
    ([1, 2], "the header is not a JSON object"),
    (None, "the header is not a JSON object"),
    ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [-4, 4]}}, "tensor 'x': bad entry"),
    ({"x": {"dtype": "F32", "shape": [2], "data_offsets": ["0", "8"]}}, "tensor 'x': bad entry"),
    ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, "tensor 'x': bad entry"),
    ({"x": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, "tensor 'x': bad entry"),
    ({"x": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}}, "tensor 'x': bad entry"),
    ({"x": 1}, "tensor 'x': bad entry"),
    ({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, "data size does not match"),
])
def test_error_bad_safetensors_headers(tmp_path, capsys, header, message):
    d, _ = make_checkpoint(tmp_path)
    (d / "model.safetensors").write_bytes(_safetensors_bytes(header))
    assert message in _error(capsys, [str(d), "--outfile", str(tmp_path / "o.gguf")])


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer.model"])
def test_error_output_is_a_checkpoint_file(tmp_path, capsys, name):
    d, _ = make_checkpoint(tmp_path)
    before = {f.name: f.read_bytes() for f in d.iterdir()}
    for out in (d / name, d / "." / name):
        assert f"is the checkpoint's {name}" in _error(capsys, [str(d), "--outfile", str(out)])
    assert {f.name: f.read_bytes() for f in d.iterdir()} == before


def test_error_output_named_as_a_directory(tmp_path, capsys):
    d, _ = make_checkpoint(tmp_path)
    (tmp_path / "folder").mkdir()
    for out in (f"{tmp_path}/new.gguf/", str(tmp_path / "folder")):   # Path() drops the '/'
        assert "is a directory" in _error(capsys, [str(d), "--outfile", out])
    assert not (tmp_path / "new.gguf").exists()


def test_a_failed_write_keeps_the_old_output_and_leaves_no_temporary(tmp_path, capsys, monkeypatch):
    d, _ = make_checkpoint(tmp_path)
    out = tmp_path / "out.gguf"
    out.write_bytes(b"the previous output")

    def disk_full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", disk_full)
    message = _error(capsys, [str(d), "--outfile", str(out)])
    assert message.endswith("out.gguf: cannot write (No space left on device)")
    assert out.read_bytes() == b"the previous output"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["out.gguf", "tiny-llama"]
    monkeypatch.undo()
    assert convert_main([str(d), "--outfile", str(out)]) == 0
    assert read(out)[1]["general.architecture"] == "llama"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["out.gguf", "tiny-llama"]


def test_example_entry_point_no_traceback(tmp_path):
    import os

    import ggml_py
    env = dict(os.environ, PYTHONPATH=str(Path(ggml_py.__file__).resolve().parent.parent))
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "convert.py"), str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("ggml-convert: error: ")


# ----------------------------------------------------------------------------- tokenizer.json

def _tokenizer_json_checkpoint(tmp_path, tokenizer: dict, tok_cfg: dict | None = None) -> Path:
    d, _ = make_checkpoint(tmp_path)
    (d / "tokenizer.model").unlink()
    (d / "tokenizer.json").write_text(json.dumps(tokenizer))
    if tok_cfg is not None:
        (d / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    return d


def test_tokenizer_json_sentencepiece_style(tmp_path):
    pieces = spm_pieces()
    vocab = {p: i for i, (p, _, _) in enumerate(pieces) if p not in ("<s>", "</s>")}
    merges = ["a b", "▁ a", "▁ ab", "▁ b", "ab c", "▁ c"]
    tj = {"normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                             {"type": "Replace"}]},
          "added_tokens": [{"id": 1, "content": "<s>", "special": True},
                           {"id": 2, "content": "</s>", "special": True}],
          "model": {"type": "BPE", "byte_fallback": True, "vocab": vocab, "merges": merges}}
    d = _tokenizer_json_checkpoint(tmp_path, tj, {"bos_token": "<s>", "eos_token": "</s>",
                                                  "unk_token": "<unk>", "add_bos_token": True})
    out = cv.convert(d, tmp_path / "t.gguf", "f32", log=lambda *a: None)
    _, f, _ = read(out)
    assert f["tokenizer.ggml.model"] == "llama"
    assert f["tokenizer.ggml.tokens"][:N_TOKENS] == [p for p, _, _ in pieces]
    assert f["tokenizer.ggml.token_type"][:N_TOKENS] == [k for _, _, k in pieces]
    scores = f["tokenizer.ggml.scores"]
    assert [scores[vocab[m.replace(" ", "")]] for m in merges] == [0.0, -1.0, -2.0, -3.0, -4.0, -5.0]
    assert f["tokenizer.ggml.add_space_prefix"] is True
    tok = Tokenizer.from_gguf(str(out))
    assert tok.tokenize("ab abc", add_special=False) == [vocab["▁ab"], vocab["▁ab"], vocab["c"]]


def test_tokenizer_json_byte_level_bpe(tmp_path):
    tj = {"added_tokens": [{"id": 4, "content": "<|endoftext|>", "special": True}],
          "pre_tokenizer": {"type": "ByteLevel"},
          "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3}, "merges": [["a", "b"]]}}
    d = _tokenizer_json_checkpoint(tmp_path, tj, {"eos_token": "<|endoftext|>"})
    out = cv.convert(d, tmp_path / "t.gguf", "f32", log=lambda *a: None)
    _, f, _ = read(out)
    assert f["tokenizer.ggml.model"] == "gpt2"
    assert f["tokenizer.ggml.tokens"][:5] == ["a", "b", "ab", "Ġ", "<|endoftext|>"]
    assert f["tokenizer.ggml.token_type"][:5] == [1, 1, 1, 1, 3]
    assert f["tokenizer.ggml.merges"] == ["a b"]
    assert f["tokenizer.ggml.pre"] == "gpt-2"
    assert f["tokenizer.ggml.eos_token_id"] == 4
    assert "tokenizer.ggml.scores" not in f


def test_error_bad_tokenizer_json(tmp_path, capsys):
    d = _tokenizer_json_checkpoint(tmp_path, {"model": {"type": "Unigram", "vocab": []}})
    assert "not supported" in _error(capsys, [str(d)])
    (d / "tokenizer.json").write_text("[]")
    assert "tokenizer.json" in _error(capsys, [str(d)])


# ----------------------------------------------------------------------------- tokenizer.ggml.pre

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")


def _byte_level(add_prefix_space=False, use_regex=True) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True,
            "use_regex": use_regex}


def _split_then_byte_level(regex: str) -> dict:
    """A pre_tokenizer as HF writes Llama 3's and Qwen2's: one Split, then ByteLevel."""
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        _byte_level(use_regex=False)]}


def _tokenizer_json_from_gguf(name: str, pre_tokenizer: dict, ignore_merges: bool) -> dict:
    """A tokenizer.json holding llama.cpp's test vocabulary `name` (tests/data)."""
    m = read_gguf_metadata(vocab_path(name))
    toks, types = m["tokenizer.ggml.tokens"], m["tokenizer.ggml.token_type"]
    return {"added_tokens": [{"id": i, "content": t, "special": True}
                             for i, t in enumerate(toks) if types[i] == 3],
            "pre_tokenizer": pre_tokenizer,
            "model": {"type": "BPE", "ignore_merges": ignore_merges, "merges": m["tokenizer.ggml.merges"],
                      "vocab": {t: i for i, t in enumerate(toks) if types[i] == 1}}}


@pytest.mark.parametrize("name, pre_tokenizer, ignore_merges", [
    ("llama-bpe", _split_then_byte_level(LLAMA3_REGEX), True),    # Llama 3's tokenizer.json
    ("gpt-2", _byte_level(), False),                              # GPT-2's
])
def test_byte_level_checkpoints_tokenize_as_llama_cpp(tmp_path, name, pre_tokenizer, ignore_merges):
    tj = _tokenizer_json_from_gguf(name, pre_tokenizer, ignore_merges)
    d = _tokenizer_json_checkpoint(tmp_path, tj)
    _set_config(d, vocab_size=len(read_gguf_metadata(vocab_path(name))["tokenizer.ggml.tokens"]))
    out = cv.convert(d, tmp_path / "v.gguf", log=lambda *a: None, vocab_only=True)
    assert read_gguf_metadata(out)["tokenizer.ggml.pre"] == name
    tok = Tokenizer.from_gguf(str(out))
    for text, expected in load_cases(name):             # llama.cpp's own expected ids
        assert tok.tokenize(text, add_special=False) == expected, repr(text)


@pytest.mark.parametrize("pre_tokenizer, ignore_merges, clean, name", [
    (_split_then_byte_level(LLAMA3_REGEX), True, True, "llama-bpe"),
    (_split_then_byte_level(LLAMA3_REGEX), True, False, "llama-bpe"),   # clean_spaces only breaks ties
    (_split_then_byte_level(LLAMA3_REGEX), False, None, "smaug-bpe"),
    (_split_then_byte_level(QWEN2_REGEX), False, False, "qwen2"),
    (_split_then_byte_level(QWEN2_REGEX), False, True, "stablelm2"),
    (_byte_level(), False, False, "trillion"),
    ({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, _byte_level()]},
     False, None, "starcoder"),
])
def test_bpe_pre_tokenizer_names(pre_tokenizer, ignore_merges, clean, name):
    tj = {"pre_tokenizer": pre_tokenizer, "model": {"type": "BPE", "ignore_merges": ignore_merges}}
    tok_cfg = {} if clean is None else {"clean_up_tokenization_spaces": clean}
    assert bpe_pre_name(tj, tok_cfg, Path("tokenizer.json")) == name


@pytest.mark.parametrize("pre_tokenizer", [
    _split_then_byte_level(r"\p{L}+|\s+"),                              # a regex no name has
    _byte_level(add_prefix_space=True),
    {"type": "Sequence", "pretokenizers": [{"type": "Punctuation"}, _byte_level()]},
    {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": False},
    None,
])
def test_an_unknown_byte_level_pre_tokenizer_is_refused(tmp_path, capsys, pre_tokenizer):
    tj = {"pre_tokenizer": pre_tokenizer, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}
    d = _tokenizer_json_checkpoint(tmp_path, tj)
    assert "BPE pre-tokenizer not recognized" in _error(capsys, [str(d), "--vocab-only"])


# ----------------------------------------------------------------------------- special and added tokens

def _bos_template(bos: str) -> dict:
    """Meta-Llama-3's post_processor: BOS before each sequence."""
    first = {"SpecialToken": {"id": bos, "type_id": 0}}
    return {"type": "TemplateProcessing",
            "single": [first, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [first, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}]}


@pytest.mark.parametrize("post_processor, tok_cfg_add_bos, add_bos", [
    (None, None, False),                        # gpt-2's default
    ("template", None, True),                   # from tokenizer.json, as gguf.SpecialVocab
    ("template", False, False),                 # tokenizer_config.json wins
])
def test_add_bos_from_the_post_processor(tmp_path, post_processor, tok_cfg_add_bos, add_bos):
    tj = {"added_tokens": [{"id": 4, "content": "<|begin|>", "special": True}],
          "pre_tokenizer": _byte_level(),
          "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3}, "merges": ["a b"]}}
    if post_processor:
        tj["post_processor"] = {"type": "Sequence", "processors": [_bos_template("<|begin|>")]}
    tok_cfg = {"bos_token": "<|begin|>", "eos_token": "<|begin|>"}
    if tok_cfg_add_bos is not None:
        tok_cfg["add_bos_token"] = tok_cfg_add_bos
    d = _tokenizer_json_checkpoint(tmp_path, tj, tok_cfg)
    m = read_gguf_metadata(cv.convert(d, tmp_path / "v.gguf", log=lambda *a: None, vocab_only=True))
    assert (m["tokenizer.ggml.add_bos_token"], m["tokenizer.ggml.bos_token_id"]) == (add_bos, 4)
    assert Tokenizer.from_gguf(str(tmp_path / "v.gguf")).tokenize("ab")[:1] == ([4] if add_bos else [2])


def test_sentencepiece_added_tokens_and_special_ids(tmp_path):
    d, _ = make_checkpoint(tmp_path)
    _set_config(d, eos_token_id=None)
    (d / "added_tokens.json").write_text(json.dumps(
        {"<|im_end|>": N_TOKENS, "my▁word": N_TOKENS + 1, "<late>": N_VOCAB}))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "added_tokens_decoder": {
        str(N_TOKENS): {"content": "<|im_end|>", "special": False},       # looks special: CONTROL
        "3": {"content": "▁x", "special": False}}}))                       # USER_DEFINED, "▁" a space
    logged = []
    out = cv.convert(d, tmp_path / "v.gguf", log=logged.append, vocab_only=True)
    m = read_gguf_metadata(out)
    assert m["tokenizer.ggml.pre"] == "default"
    assert m["tokenizer.ggml.tokens"][N_TOKENS:] == ["<|im_end|>", "my▁word"]
    assert m["tokenizer.ggml.token_type"][N_TOKENS:] == [3, 4]
    assert m["tokenizer.ggml.scores"][N_TOKENS:] == [-1000.0, -1000.0]
    assert (m["tokenizer.ggml.tokens"][3], m["tokenizer.ggml.token_type"][3]) == (" x", 4)
    assert (m["tokenizer.ggml.bos_token_id"], m["tokenizer.ggml.eos_token_id"]) == (1, N_TOKENS)
    assert any("'<late>'" in line and "skipped" in line for line in logged)
    tok = Tokenizer.from_gguf(str(out))
    assert tok.tokenize("<|im_end|>", add_special=False, parse_special=True) == [N_TOKENS]
    _set_config(d, eos_token_id=2)          # config.json's id wins over a text found only by us
    assert read_gguf_metadata(cv.convert(d, out, log=lambda *a: None, vocab_only=True))[
        "tokenizer.ggml.eos_token_id"] == 2


@pytest.mark.parametrize("where, template, expected", [
    ("tokenizer_config.json", "{{ messages }}", {"tokenizer.chat_template": "{{ messages }}"}),
    ("chat_template.jinja", "{% for m in messages %}{{ m }}{% endfor %}",
     {"tokenizer.chat_template": "{% for m in messages %}{{ m }}{% endfor %}"}),
    ("tokenizer_config.json", [{"name": "default", "template": "A"}, {"name": "tool use", "template": "B"}],
     {"tokenizer.chat_template": "A", "tokenizer.chat_template.tool_use": "B",
      "tokenizer.chat_templates": ["tool_use"]}),
    ("tokenizer_config.json", None, {}),
])
def test_the_chat_template_is_kept(tmp_path, where, template, expected):
    d, _ = make_checkpoint(tmp_path)
    config = {"chat_template": template} if where == "tokenizer_config.json" else {"model_max_length": 64}
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    if where == "chat_template.jinja":
        (d / where).write_text(template)
    m = read_gguf_metadata(cv.convert(d, tmp_path / "v.gguf", log=lambda *a: None, vocab_only=True))
    assert {k: v for k, v in m.items() if k.startswith("tokenizer.chat_template")} == expected


def test_a_malformed_chat_template_list_is_refused(tmp_path, capsys):
    d, _ = make_checkpoint(tmp_path)
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": ["{{ messages }}"]}))
    out = _error(capsys, [str(d), "--outfile", str(tmp_path / "v.gguf")])
    assert "chat_template: a list must hold" in out


# ----------------------------------------------------------------------------- one-line errors

def _q_proj_rows(d: Path, rows: int) -> None:
    tensors = hf_tensors(np.random.default_rng(0), tied=True)
    tensors["model.layers.0.self_attn.q_proj.weight"] = tensors["model.layers.0.self_attn.q_proj.weight"][:rows]
    write_safetensors(d / "model.safetensors", tensors, {})
    _set_config(d, rope_pairing="half")     # q rows are permuted: the shape must be checked first


def _write(name: str, value):
    return lambda d: (d / name).write_text(value if isinstance(value, str) else json.dumps(value))


def _tokenizer_json(value):
    def edit(d: Path):
        (d / "tokenizer.model").unlink()
        _write("tokenizer.json", value)(d)
    return edit


@pytest.mark.parametrize("edit, message", [
    pytest.param(lambda d: _q_proj_rows(d, 14), "tensor blk.0.attn_q.weight: shape (14, 16), expected (16, 16)",
                 id="q_proj-rows"),
    pytest.param(_write("tokenizer_config.json", "[]"), "tokenizer_config.json: not a JSON object",
                 id="tokenizer_config-list"),
    pytest.param(_write("tokenizer_config.json", {"added_tokens_decoder": {"x": {"content": "a"}}}),
                 "added_tokens_decoder entry 'x'", id="added_tokens_decoder-key"),
    pytest.param(_write("tokenizer_config.json", {"added_tokens_decoder": {"5": "a"}}),
                 "added_tokens_decoder entry '5'", id="added_tokens_decoder-entry"),
    pytest.param(lambda d: _set_config(d, pad_token_id=-1), "invalid value for special token type pad: -1",
                 id="config-negative-id"),     # llama.cpp's converter (gguf.SpecialVocab) refuses it too
    pytest.param(_write("added_tokens.json", {"<x>": "270"}),
                 "token '<x>' has id '270', not a non-negative integer", id="added_tokens-string-id"),
    pytest.param(_tokenizer_json({"model": {"type": "BPE", "vocab": {"a": 0}}, "added_tokens": [{"content": "<s>"}]}),
                 "added token {'content': '<s>'} has no text and integer id", id="tokenizer-added-no-id"),
    pytest.param(_tokenizer_json({"model": {"type": "BPE", "vocab": {"a": 0}},
                                  "added_tokens": [{"content": "<s>", "id": "1"}]}),
                 "has no text and integer id", id="tokenizer-added-string-id"),
    pytest.param(_tokenizer_json({"model": {"type": "BPE", "vocab": {"a": "0"}}}),
                 "token 'a' has id '0', not a non-negative", id="tokenizer-string-id"),
    pytest.param(_tokenizer_json({"model": {"type": "BPE", "vocab": {}}}), "the model vocabulary is {}",
                 id="tokenizer-empty"),
    pytest.param(_tokenizer_json({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a"]]}}),
                 "merge ['a'] is not", id="tokenizer-bad-merge"),
])
def test_bad_tokenizer_files_and_shapes_end_in_one_line(tmp_path, capsys, edit, message):
    d, _ = make_checkpoint(tmp_path)
    edit(d)
    assert message in _error(capsys, [str(d), "--outfile", str(tmp_path / "o.gguf")])


# ----------------------------------------------------------------------------- sharded weights

def _shard(d: Path, hf: dict[str, np.ndarray]) -> dict[str, str]:
    """Write `hf` as two shards with model.safetensors.index.json; returns the weight_map."""
    names = list(hf)
    weight_map = {}
    for k, part in enumerate((names[::2], names[1::2])):
        fname = f"model-{k + 1:05d}-of-00002.safetensors"
        write_safetensors(d / fname, {n: hf[n] for n in part}, {})
        weight_map.update(dict.fromkeys(part, fname))
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return weight_map


def test_an_index_names_exactly_the_files_read(tmp_path, capsys):
    d, hf = make_checkpoint(tmp_path)
    stale = {k: v * 0 for k, v in hf.items()}
    write_safetensors(d / "model.safetensors", stale, {})       # an old copy beside the shards
    weight_map = _shard(d, hf)
    _, _, t = read(cv.convert(d, tmp_path / "o.gguf", "f32", log=lambda *a: None))
    np.testing.assert_array_equal(t["token_embd.weight"].data, hf["model.embed_tokens.weight"])

    weight_map["model.norm.weight"] = "model-00001-of-00002.safetensors"   # it is in the other shard
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert "tensor 'model.norm.weight' is not in model-00001-of-00002.safetensors" in _error(capsys, [str(d)])
    del weight_map["model.norm.weight"]
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert "'model.norm.weight' of model-0000" in _error(capsys, [str(d)])
    (d / "model-00002-of-00002.safetensors").unlink()
    assert "names model-00002-of-00002.safetensors, which is missing" in _error(capsys, [str(d)])


def test_a_tensor_in_two_files_without_an_index_is_an_error(tmp_path, capsys):
    d, hf = make_checkpoint(tmp_path)
    write_safetensors(d / "model-old.safetensors", {"model.norm.weight": hf["model.norm.weight"]}, {})
    message = _error(capsys, [str(d), "--outfile", str(tmp_path / "o.gguf")])
    assert "tensor 'model.norm.weight' is in both model-old.safetensors and model.safetensors" in message


def test_bad_flags_end_in_one_line_and_status_2(capsys):
    with pytest.raises(SystemExit) as stop:
        convert_main(["dir", "--bogus"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("ggml-convert: error: ") and err.count("\n") == 1


# ----------------------------------------------------------------------------- transformers 5, biases

@pytest.mark.parametrize("changes, theta, factor", [
    # transformers >= 5: rope_theta and the scaling live in rope_parameters
    ({"rope_theta": None, "rope_parameters": {"rope_theta": 1234.0, "rope_type": "default"}},
     1234.0, None),
    ({"rope_theta": None, "rope_parameters": {"rope_theta": 1234.0, "rope_type": "linear",
                                              "factor": 4.0}}, 1234.0, 4.0),
    # rope_parameters wins key by key; what it lacks comes from the top-level keys
    ({"rope_parameters": {"rope_theta": 99.0}, "rope_scaling": {"type": "linear", "factor": 2.0}},
     99.0, 2.0),
    ({"rope_parameters": {"rope_type": "linear", "factor": 3.0}}, 500.0, 3.0),
])
def test_rope_parameters_read_before_top_level_keys(tmp_path, changes, theta, factor):
    d, _ = make_checkpoint(tmp_path)
    _set_config(d, **changes)
    _, fields, _ = read(cv.convert(d, tmp_path / "o.gguf", "f32", log=lambda *a: None))
    assert fields["llama.rope.freq_base"] == pytest.approx(theta)
    assert fields.get("llama.rope.scaling.factor") == factor


def _add_biases(d: Path, hf: dict, attention: bool, mlp: bool) -> dict:
    rng = np.random.default_rng(5)
    names = {"self_attn.q_proj": N_HEAD * HEAD_DIM, "self_attn.k_proj": N_HEAD_KV * HEAD_DIM,
             "self_attn.v_proj": N_HEAD_KV * HEAD_DIM, "self_attn.o_proj": N_EMBD} if attention else {}
    if mlp:
        names.update({"mlp.gate_proj": N_FF, "mlp.up_proj": N_FF, "mlp.down_proj": N_EMBD})
    for i in range(N_LAYER):
        for name, n in names.items():
            hf[f"model.layers.{i}.{name}.bias"] = rng.standard_normal(n).astype(np.float32)
    write_safetensors(d / "model.safetensors", hf, {})
    return hf


def test_attention_and_mlp_biases_are_converted(tmp_path):
    from ggml_py.model.llama import LlamaModel

    d, hf = make_checkpoint(tmp_path, adjacent=False)
    hf = _add_biases(d, hf, attention=True, mlp=True)
    _set_config(d, attention_bias=True, mlp_bias=True)
    out = cv.convert(d, tmp_path / "o.gguf", "f16", log=lambda *a: None)
    _, _, t = read(out)
    for i in range(N_LAYER):
        for hf_name, name in (("self_attn.v_proj", "attn_v"), ("self_attn.o_proj", "attn_output"),
                              ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"),
                              ("mlp.down_proj", "ffn_down")):
            b = t[f"blk.{i}.{name}.bias"]
            assert b.tensor_type == gguf.GGMLQuantizationType.F32
            np.testing.assert_array_equal(b.data, hf[f"model.layers.{i}.{hf_name}.bias"])
        # q and k biases are rows of the projection: permuted with it
        for hf_name, name, heads in (("q_proj", "attn_q", N_HEAD), ("k_proj", "attn_k", N_HEAD_KV)):
            bias = hf[f"model.layers.{i}.self_attn.{hf_name}.bias"]
            np.testing.assert_array_equal(t[f"blk.{i}.{name}.bias"].data,
                                          permute_rope_rows(bias, heads))
    model = LlamaModel(str(out), n_ctx=8, n_threads=1)
    assert all(layer.bq is not None and layer.b_down is not None for layer in model.weights.layers)


@pytest.mark.parametrize("mlp, key", [(False, "attention_bias"), (True, "mlp_bias")])
def test_biases_the_config_does_not_announce_are_refused(tmp_path, capsys, mlp, key):
    d, hf = make_checkpoint(tmp_path)
    _add_biases(d, hf, attention=not mlp, mlp=mlp)
    message = _error(capsys, [str(d), "--outfile", str(tmp_path / "o.gguf")])
    assert f"config.json's {key} is not true" in message
