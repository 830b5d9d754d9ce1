"""The bundled model's tokenizer: SentencePiece's encoding == ggml_py's reading of the GGUF.

``training/tokenizer.model`` (SentencePiece BPE, 2048 pieces, byte fallback, no
dummy prefix) goes through ``ggml-convert --vocab-only``; ggml_py's tokenizer must
then give SentencePiece's ids exactly, with BOS, line by line and for whole texts.
"""

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ggml_py.tools import convert as cv
from ggml_py.tokenizer.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parent.parent
SPM_MODEL = REPO / "training" / "tokenizer.model"
TEST_TEXT = REPO / "ggml_py" / "data" / "shakespeare_test.txt"
VAL_TEXT = REPO / "training" / "data" / "val.txt"          # exists after training/data.py
# SentencePiece's ids for [BOS] + the whole test text, as little-endian int32.
TEST_IDS_SHA256 = "4f39801364b987b5cc904742918422ff3dbfd502fe4c4751c132f6eeb07b9ddb"
TEST_IDS_COUNT = 88772


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("shakespeare")
    shutil.copyfile(SPM_MODEL, d / "tokenizer.model")
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 704,
        "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 8,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "vocab_size": 2048, "tie_word_embeddings": True, "rope_pairing": "adjacent"}))
    out = cv.convert(d, d / "vocab.gguf", "f32", log=lambda *a: None, vocab_only=True)
    return Tokenizer.from_gguf(str(out))


def test_vocab_metadata(tok):
    assert tok.n_vocab == 2048
    assert (tok.bos_id, tok.eos_id) == (1, 2)
    assert tok.add_bos and not tok.add_space_prefix
    assert tok.token_to_piece(13) == b"\n"


def test_known_encoding(tok):
    text = "ROMEO.\nBut, soft! what light through yonder window breaks?"
    assert tok.tokenize(text) == [1, 1642, 1992, 1996, 1982, 13, 459, 1979, 368, 805, 2013, 470,
                                  1221, 1518, 285, 1580, 1364, 304, 1339, 1972, 2009]
    assert tok.detokenize(tok.tokenize(text, add_special=False)) == text


def test_whole_test_text_matches_golden_ids(tok):
    text = TEST_TEXT.read_text(encoding="utf-8")
    ids = tok.tokenize(text)
    assert len(ids) == TEST_IDS_COUNT
    assert hashlib.sha256(np.asarray(ids, "<i4").tobytes()).hexdigest() == TEST_IDS_SHA256
    assert tok.detokenize(ids[1:]) == text


@pytest.mark.parametrize("path", [TEST_TEXT, VAL_TEXT], ids=["test", "val"])
def test_matches_sentencepiece(tok, path):
    spm = pytest.importorskip("sentencepiece")
    if not path.is_file():
        pytest.skip(f"{path} not built (python training/data.py)")
    sp = spm.SentencePieceProcessor(model_file=str(SPM_MODEL))
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    assert len(lines) > 3000
    for line in lines:
        assert tok.tokenize(line) == [sp.bos_id()] + sp.encode(line), repr(line)
    assert tok.tokenize(text) == [sp.bos_id()] + sp.encode(text)
