"""Tests of ggml_py.tokenizer against llama.cpp's own tokenizer test data.

The ``tests/data/ggml-vocab-*.gguf.inp/.out`` pairs come from llama.cpp's
``models/`` folder: each input case must tokenize (add_special=False,
parse_special=False) to exactly the ids llama.cpp's test-tokenizer-0 expects.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from ggml_py.tokenizer import Tokenizer, read_gguf_metadata

DATA = Path(__file__).parent / "data"
VOCABS = ("llama-spm", "llama-bpe", "gpt-2")
CASE_SEPARATOR = "\n__ggml_vocab_test__\n"


def vocab_path(name: str) -> Path:
    return DATA / f"ggml-vocab-{name}.gguf"


def load_cases(name: str) -> list[tuple[str, list[int]]]:
    """(text, expected ids) pairs of one vocabulary's .inp/.out files."""
    path = vocab_path(name)
    texts = path.with_name(path.name + ".inp").read_text(encoding="utf-8").split(CASE_SEPARATOR)
    assert texts[-1] == "", "the .inp file ends with a separator line"
    lines = path.with_name(path.name + ".out").read_text(encoding="utf-8").split("\n")
    assert lines[-1] == ""
    texts, lines = texts[:-1], lines[:-1]
    assert len(texts) == len(lines)
    return [(text, [int(i) for i in line.split()]) for text, line in zip(texts, lines)]


CASES = {name: load_cases(name) for name in VOCABS}
CASE_PARAMS = [pytest.param(name, index, id=f"{name}-{index:02d}")
               for name in VOCABS for index in range(len(CASES[name]))]

_tokenizers: dict[str, Tokenizer] = {}


def tokenizer(name: str) -> Tokenizer:
    """Each vocabulary is loaded once for the whole test module."""
    if name not in _tokenizers:
        _tokenizers[name] = Tokenizer.from_gguf(vocab_path(name))
    return _tokenizers[name]


def hf_clean_up_tokenization(text: str) -> str:
    """What llama.cpp's detokenize does to text for byte-level BPE vocabularies.

    Both BPE test vocabularies set clean_spaces (HF's
    clean_up_tokenization_spaces), which deletes the space in " ?", " !",
    " .", " ,", around a lone apostrophe " ' ", and before the contractions
    " 's", " 'm", " 're", " 've". Written independently of the module's
    regexes, from llama.cpp's description of the three passes.
    """
    for punct in "?!.,":
        text = text.replace(" " + punct, punct)
    text = text.replace(" ' ", "'")
    for contraction in ("'s", "'m", "'re", "'ve"):
        text = text.replace(" " + contraction, contraction)
    return text


# -- llama.cpp test-tokenizer-0 cases ---------------------------------------

def test_case_files_have_46_cases():
    assert all(len(cases) == 46 for cases in CASES.values())


@pytest.mark.parametrize("name, index", CASE_PARAMS)
def test_tokenize_matches_llama_cpp(name, index):
    text, expected = CASES[name][index]
    assert tokenizer(name).tokenize(text, add_special=False, parse_special=False) == expected


@pytest.mark.parametrize("name, index", CASE_PARAMS)
def test_round_trip(name, index):
    """detokenize(tokenize(s)) gives s back, up to llama.cpp's documented clean-up.

    SentencePiece: tokenize puts a space in front of the text and detokenize
    (no BOS in the ids) takes the first token's leading space off again, so
    every case comes back exactly. Byte-level BPE: every case comes back
    exactly except where llama.cpp's clean_spaces deletes a space (see
    hf_clean_up_tokenization); those cases must come back cleaned up.
    """
    text, _ = CASES[name][index]
    tok = tokenizer(name)
    round_trip = tok.detokenize(tok.tokenize(text, add_special=False))
    expected = text if tok.is_spm else hf_clean_up_tokenization(text)
    assert round_trip == expected


def test_only_clean_up_cases_change_in_round_trip():
    """Exactly two test strings contain a " ?"-style sequence the BPE clean-up removes."""
    changed = [text for text, _ in CASES["gpt-2"] if hf_clean_up_tokenization(text) != text]
    assert len(changed) == 2
    assert all(" ?" in text for text in changed)
    assert not tokenizer("llama-spm").clean_spaces
    assert tokenizer("llama-bpe").clean_spaces and tokenizer("gpt-2").clean_spaces


# -- special tokens ---------------------------------------------------------

def test_metadata_properties():
    spm, llama3, gpt2 = (tokenizer(n) for n in VOCABS)
    assert (spm.n_vocab, spm.bos_id, spm.eos_id, spm.unk_id) == (32000, 1, 2, 0)
    assert (llama3.n_vocab, llama3.bos_id, llama3.eos_id) == (128256, 128000, 128001)
    assert (gpt2.n_vocab, gpt2.bos_id, gpt2.eos_id) == (50257, 50256, 50256)
    assert spm.add_space_prefix and not llama3.add_space_prefix
    assert llama3.pre == "llama-bpe" and gpt2.pre == "gpt-2"


def test_bos_added_with_add_special():
    assert tokenizer("llama-spm").tokenize("Hello world") == [1, 15043, 3186]
    assert tokenizer("llama-spm").tokenize("Hello world", add_special=False) == [15043, 3186]
    assert tokenizer("llama-bpe").tokenize("Hello world") == [128000, 9906, 1917]
    assert tokenizer("llama-bpe").tokenize("") == [128000]
    # GPT-2 does not ask for a BOS token.
    assert tokenizer("gpt-2").tokenize("Hello world") == [15496, 995]


def test_add_eos_from_metadata():
    fields = read_gguf_metadata(vocab_path("llama-spm"))
    fields["tokenizer.ggml.add_eos_token"] = True
    fields["tokenizer.ggml.add_bos_token"] = False
    tok = Tokenizer.from_metadata(fields, "edited")
    assert tok.tokenize("Hello") == [15043, 2]
    assert tok.detokenize([15043, 2], remove_special=True) == "Hello"


def test_parse_special_recognises_control_tokens():
    spm, llama3, gpt2 = (tokenizer(n) for n in VOCABS)
    # After a special token SentencePiece starts a new "sentence" with a space.
    assert spm.tokenize("<s>Hello</s>", add_special=False, parse_special=True) == [1, 15043, 2]
    assert 1 not in spm.tokenize("<s>Hello", add_special=False)
    text = "<|begin_of_text|>Hello<|eot_id|>"
    assert llama3.tokenize(text, add_special=False, parse_special=True) == [128000, 9906, 128009]
    assert 128000 not in llama3.tokenize(text, add_special=False)
    assert gpt2.tokenize("Hi<|endoftext|>", add_special=False, parse_special=True) == [17250, 50256]


def test_is_eog():
    spm, llama3, gpt2 = (tokenizer(n) for n in VOCABS)
    assert spm.is_eog(2) and not spm.is_eog(1) and not spm.is_eog(15043)
    assert llama3.is_eog(128001) and llama3.is_eog(128009)  # <|end_of_text|>, <|eot_id|>
    assert not llama3.is_eog(128000)
    assert gpt2.is_eog(50256)


# -- detokenize -------------------------------------------------------------

def test_token_to_piece():
    spm, llama3, gpt2 = (tokenizer(n) for n in VOCABS)
    assert spm.token_to_piece(15043) == b" Hello"
    assert spm.token_to_piece(13) == b"\n"           # <0x0A>
    assert spm.token_to_piece(243) == b"\xf0"        # <0xF0>, first byte of an emoji
    assert spm.token_to_piece(1) == b"<s>"
    assert spm.token_to_piece(1, special=False) == b""
    assert gpt2.token_to_piece(18435) == b" Hello"   # "\u0120Hello"
    assert llama3.token_to_piece(128009, special=False) == b""


def test_detokenize_special_tokens():
    spm, llama3 = tokenizer("llama-spm"), tokenizer("llama-bpe")
    ids = llama3.tokenize("Hi<|eot_id|>", parse_special=True)
    assert ids == [128000, 13347, 128009]
    assert llama3.detokenize(ids) == "Hi"
    assert llama3.detokenize(ids, unparse_special=True) == "<|begin_of_text|>Hi<|eot_id|>"
    # llama.cpp keeps the SentencePiece space when it removes the BOS token.
    assert spm.detokenize([1, 15043], remove_special=True) == " Hello"
    assert spm.detokenize([15043, 3186]) == "Hello world"


def test_detokenize_joins_bytes_before_decoding():
    spm = tokenizer("llama-spm")
    ids = spm.tokenize("🦙", add_special=False)
    assert ids == [29871, 243, 162, 169, 156]
    assert spm.detokenize(ids) == "🦙"
    assert spm.detokenize(ids[:3]) == "\ufffd"  # an incomplete character is replaced at the end


# -- incremental decoding ---------------------------------------------------

@pytest.mark.parametrize("name", VOCABS)
@pytest.mark.parametrize("text", [
    "Hello 🦙 world 😁 ?我想在apple工作1314151天～",
    "ឃើញថាមុខ 🚀 (normal) 😶‍🌫️",
    " I 'm sure it 's fine , isn 't it ? ' quoted ' a b c",
])
def test_incremental_decoder_matches_detokenize(name, text):
    tok = tokenizer(name)
    ids = tok.tokenize(text)
    decoder = tok.decoder()
    pieces = [decoder.feed(i) for i in ids]
    pieces.append(decoder.flush())
    assert "".join(pieces) == tok.detokenize(ids)
    # Text only comes out as whole characters.
    assert all("\ufffd" not in piece for piece in pieces)


def test_incremental_decoder_waits_for_complete_characters():
    spm = tokenizer("llama-spm")
    decoder = spm.decoder()
    # "▁" then the four byte tokens of U+1F999
    assert [decoder.feed(i) for i in [29871, 243, 162, 169, 156]] == ["", "", "", "", "🦙"]
    assert decoder.flush() == ""


def test_incremental_decoder_drops_final_eos_like_detokenize():
    fields = read_gguf_metadata(vocab_path("llama-spm"))
    fields["tokenizer.ggml.add_eos_token"] = True
    tok = Tokenizer.from_metadata(fields)
    ids = [1, 15043, 2, 3186, 2]
    decoder = tok.decoder(remove_special=True, unparse_special=True)
    text = "".join(decoder.feed(i) for i in ids) + decoder.flush()
    assert text == tok.detokenize(ids, remove_special=True, unparse_special=True) == " Hello</s> world"


# -- loading ----------------------------------------------------------------

def test_not_a_gguf_file_raises_value_error_naming_file(tmp_path):
    path = tmp_path / "not-a-model.bin"
    path.write_bytes(b"this is not a GGUF file at all, just some bytes")
    with pytest.raises(ValueError, match="not-a-model.bin.*not a GGUF file"):
        Tokenizer.from_gguf(path)


def test_truncated_gguf_raises_value_error_naming_file(tmp_path):
    path = tmp_path / "truncated.gguf"
    path.write_bytes(vocab_path("llama-spm").read_bytes()[:5000])
    with pytest.raises(ValueError, match="truncated.gguf.*truncated or corrupt"):
        Tokenizer.from_gguf(path)


def write_gguf(path: Path, fields: list[tuple[str, int, bytes]]) -> None:
    """A minimal GGUF v3 file with only metadata (key, value type, encoded value)."""
    def string(s: str) -> bytes:
        data = s.encode("utf-8")
        return struct.pack("<Q", len(data)) + data
    body = b"".join(string(key) + struct.pack("<I", kind) + value for key, kind, value in fields)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(fields)) + body)


def test_gguf_without_tokenizer_raises_value_error_naming_file(tmp_path):
    path = tmp_path / "weights-only.gguf"
    name = b"llama"
    write_gguf(path, [("general.architecture", 8, struct.pack("<Q", len(name)) + name)])
    assert read_gguf_metadata(path) == {"general.architecture": "llama"}
    with pytest.raises(ValueError, match="weights-only.gguf.*no tokenizer"):
        Tokenizer.from_gguf(path)


def test_unsupported_tokenizer_model_raises_value_error(tmp_path):
    fields = {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["[PAD]", "a"]}
    with pytest.raises(ValueError, match="my-bert.gguf.*unsupported tokenizer model 'bert'"):
        Tokenizer.from_metadata(fields, "my-bert.gguf")


def test_from_gguf_reader_and_metadata_agree(tmp_path):
    """A GGUFReader (as the model loader has one open) gives the same tokenizer."""
    gguf = pytest.importorskip("gguf")
    # A small SentencePiece vocabulary keeps GGUFReader's per-item parsing quick.
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + \
             ["\u2581", "\u2581H", "\u2581He", "ll", "llo", "\u2581Hello", "o"]
    types = [2, 3, 3] + [6] * 256 + [1] * 7
    scores = [0.0] * 259 + [-1.0, -2.0, -3.0, -1.5, -2.5, -0.5, -4.0]
    path = tmp_path / "tiny-spm.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()

    from_path = Tokenizer.from_gguf(path)
    reader = gguf.GGUFReader(str(path))
    from_reader = Tokenizer.from_gguf(reader)
    from_dict = Tokenizer.from_metadata({name: field for name, field in reader.fields.items()})
    for tok in (from_path, from_reader, from_dict):
        assert tok.n_vocab == len(tokens)
        assert tok.tokenize("Hello") == [1, 264]
        assert tok.tokenize("Hi!") == [1, 260, 3 + ord("i"), 3 + ord("!")]
        assert tok.detokenize(tok.tokenize("Hi!", add_special=False)) == "Hi!"
    assert "tiny-spm.gguf" in from_reader.source
