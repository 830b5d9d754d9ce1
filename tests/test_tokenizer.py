"""Tests of ggml_py.tokenizer against llama.cpp's own tokenizer test data.

The ``tests/data/ggml-vocab-*.gguf.inp/.out`` pairs come from llama.cpp's
``models/`` folder: each input case must tokenize (add_special=False,
parse_special=False) to exactly the ids llama.cpp's test-tokenizer-0 expects.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import pytest

from ggml_py.files.gguf_metadata import read_gguf_metadata
from ggml_py.tokenizer import Tokenizer, TokenizerError, TokenizerWarning

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


@pytest.mark.parametrize("name, ids", [
    ("llama-bpe", [157, 110, 231, 6, 82]), ("gpt-2", [157, 110, 231, 6, 82]),
])
def test_letters_newer_than_unicode_15_1_split_as_llama_cpp(name, ids):
    # U+1C89 (Unicode 16) is "other" to llama.cpp's tables: the contraction is not 's
    assert tokenizer(name).tokenize("\u1c89's", add_special=False) == ids


def test_bos_added_with_add_special():
    assert tokenizer("llama-spm").tokenize("Hello world") == [1, 15043, 3186]
    assert tokenizer("llama-spm").tokenize("Hello world", add_special=False) == [15043, 3186]
    assert tokenizer("llama-bpe").tokenize("Hello world") == [128000, 9906, 1917]
    assert tokenizer("llama-bpe").tokenize("") == [128000]
    # GPT-2 does not ask for a BOS token.
    assert tokenizer("gpt-2").tokenize("Hello world") == [15496, 995]


def test_lists_of_numpy_scalars_load_as_lists_of_python_numbers():
    np = pytest.importorskip("numpy")
    fields = read_gguf_metadata(vocab_path("llama-spm"))
    n = len(fields["tokenizer.ggml.tokens"])
    fields["tokenizer.ggml.scores"] = [np.float32(s) for s in fields["tokenizer.ggml.scores"]]
    fields["tokenizer.ggml.token_type"] = [np.int32(t) for t in fields["tokenizer.ggml.token_type"]]
    fields["tokenizer.ggml.bos_token_id"] = np.uint32(fields["tokenizer.ggml.bos_token_id"])
    tok = Tokenizer.from_metadata(fields, "numpy")
    assert tok.tokenize("Hello world", add_special=False) == [15043, 3186]
    fields["tokenizer.ggml.scores"] = [np.float32(0)] * n
    Tokenizer.from_metadata(fields, "numpy")
    # numpy's bool is no number, as bool is not
    fields["tokenizer.ggml.scores"] = [np.bool_(True)] * n
    with pytest.raises(TokenizerError, match="scores must be an array of numbers, got a bool(_)? at index 0"):
        Tokenizer.from_metadata(fields, "numpy")
    fields["tokenizer.ggml.scores"] = [True] * n
    with pytest.raises(TokenizerError, match="scores must be an array of numbers, got a bool at index 0"):
        Tokenizer.from_metadata(fields, "numpy")


def test_add_eos_from_metadata():
    fields = read_gguf_metadata(vocab_path("llama-spm"))
    fields["tokenizer.ggml.add_eos_token"] = True
    fields["tokenizer.ggml.add_bos_token"] = False
    tok = Tokenizer.from_metadata(fields, "edited")
    assert tok.tokenize("Hello") == [15043, 2]
    assert tok.tokenize("Hello", add_special=False) == [15043]   # no EOS either
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


def test_a_fifo_is_refused_not_waited_on(tmp_path, unblocked):
    os.mkfifo(tmp_path / "fifo.gguf")
    error = unblocked(tmp_path / "fifo.gguf", lambda: Tokenizer.from_gguf(tmp_path / "fifo.gguf"))
    assert isinstance(error, ValueError) and "fifo.gguf: not a regular file" in str(error)


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


def test_metadata_reader_edges(tmp_path):
    path = tmp_path / "m.gguf"
    # an array that ends exactly at the end of the file is whole
    write_gguf(path, [("a", 9, struct.pack("<IQII", 4, 2, 5, 6))])
    assert read_gguf_metadata(path) == {"a": [5, 6]}
    # a string, or a string in an array, that runs past the end is refused, not cut short
    for kind, value in ((8, struct.pack("<Q", 100) + b"abc"),
                        (9, struct.pack("<IQQ", 8, 1, 100) + b"abc")):
        write_gguf(path, [("a", kind, value)])
        with pytest.raises(ValueError, match="m.gguf.*truncated"):
            read_gguf_metadata(path)
    # a header cut short (16 to 23 bytes): one clear error, not struct's (the model
    # loader's: the file has GGUF's magic, so it is one, cut short)
    path.write_bytes(b"GGUF" + struct.pack("<I", 3) + bytes(12))
    with pytest.raises(ValueError, match="m.gguf: truncated or corrupt GGUF file \\(2 items of "
                                         "uint64 at byte 8 run past its end\\)"):
        read_gguf_metadata(path)
    # version 1 (32-bit lengths) is not read as version 3
    write_gguf(path, [("a", 4, struct.pack("<I", 7))])
    path.write_bytes(path.read_bytes()[:4] + struct.pack("<I", 1) + path.read_bytes()[8:])
    with pytest.raises(ValueError, match="m.gguf: GGUF version 1 is not supported"):
        read_gguf_metadata(path)


def test_a_reader_keeps_the_general_keys_the_special_tokens_depend_on(tmp_path):
    # general.name makes a phi-3 model's </s> eat the spaces after it, from a path or a reader
    gguf = pytest.importorskip("gguf")
    path = write_spm_vocab(tmp_path / "phi3.gguf", SPECIAL_TOKENS, SPECIAL_TYPES, name="Phi-3 mini")
    for source in (path, gguf.GGUFReader(str(path))):
        tok = Tokenizer.from_gguf(source)
        assert tok.tokenize("</s>   a", add_special=False, parse_special=True) == [2, 259, A]


def test_byte_level_helpers_follow_llama_cpp():
    from ggml_py.tokenizer import pretokenize as pt
    # a lead byte of 0xF8 or more starts no sequence: one U+FFFD per byte
    assert pt.llama_decode_utf8(b"\xf8\x80\x80\x80") == "\ufffd" * 4
    # a character outside the byte map: llama.cpp's marker, its bytes in hex and then the text
    assert pt.byte_decode("a\u4e00") == b"a[UNK_BYTE_0xe4b880a\xe4\xb8\x80]"
    # clean_spaces: the space before each contraction goes ('ve too); trillion keeps spaces
    assert pt.clean_spaces(b"we 've I 'm it 's") == b"we've I'm it's"
    assert not pt.PRE_TOKENIZERS["trillion"].clean_spaces and pt.PRE_TOKENIZERS["gpt-2"].clean_spaces


def test_unsupported_tokenizer_model_raises_value_error(tmp_path):
    fields = {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["[PAD]", "a"]}
    with pytest.raises(ValueError, match="my-bert.gguf.*unsupported tokenizer model 'bert'"):
        Tokenizer.from_metadata(fields, "my-bert.gguf")


def write_spm_vocab(path: Path, tokens: list, types: list[int], scores: list[float] | None = None,
                    name: str = "tiny", add_eos: bool = False, bos_id: int = 1) -> Path:
    """A vocabulary-only SentencePiece GGUF file (BOS 1, EOS 2, UNK 0) that llama.cpp loads too."""
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)                    # str, or bytes for a text that is not UTF-8
    writer.add_token_scores(scores or [0.0] * len(tokens))
    writer.add_token_types(types)
    writer.add_bos_token_id(bos_id)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_eos_token(add_eos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def test_from_gguf_reader_and_metadata_agree(tmp_path):
    """A GGUFReader (as the model loader has one open) gives the same tokenizer."""
    gguf = pytest.importorskip("gguf")
    # A small SentencePiece vocabulary keeps GGUFReader's per-item parsing quick.
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + \
             ["\u2581", "\u2581H", "\u2581He", "ll", "llo", "\u2581Hello", "o"]
    types = [2, 3, 3] + [6] * 256 + [1] * 7
    scores = [0.0] * 259 + [-1.0, -2.0, -3.0, -1.5, -2.5, -0.5, -4.0]
    path = write_spm_vocab(tmp_path / "tiny-spm.gguf", tokens, types, scores)

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


def test_the_tokenizer_module_still_offers_its_names():
    import ggml_py.tokenizer as package
    from ggml_py.tokenizer import tokenizer as module
    assert [n for n in module.__all__ if not hasattr(module, n)] == []
    assert all(getattr(module, n) is getattr(package, n) for n in package.__all__)


# -- special tokens in small vocabularies ------------------------------------
# The expected ids are llama.cpp's own (llama_tokenize on the same files).

BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
A, B = 3 + 256 + 1, 3 + 256 + 2               # "a", "b"; 259 is "\u2581"
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"] + BYTE_TOKENS + \
    ["\u2581", "a", "b", "c", "ab", "abc", "<x>", "<xy>", "<|end|>", "<|endoftext|>"]
SPECIAL_TYPES = [2, 3, 3] + [6] * 256 + [1, 1, 1, 1, 4, 4, 4, 3, 3, 3]   # ab, abc, <x>: user-defined
AB, ABC, X, XY, END, ENDOFTEXT = range(A + 3, A + 9)


def special_vocab(tmp_path: Path, **options) -> Tokenizer:
    return Tokenizer.from_gguf(write_spm_vocab(tmp_path / "special.gguf", SPECIAL_TOKENS,
                                               SPECIAL_TYPES, **options))


def test_user_defined_tokens_are_split_out_longest_first(tmp_path):
    tok = special_vocab(tmp_path)
    # "ab" first would leave "c" between two "ab"s
    assert tok.tokenize("abcab", add_special=False) == [ABC, AB]
    assert tok.tokenize("<xy>a<x>", add_special=False, parse_special=True) == [XY, 259, A, X]


def test_unknown_and_control_tokens_are_split_out_only_with_parse_special(tmp_path):
    tok = special_vocab(tmp_path)
    assert tok.tokenize("<unk>a", add_special=False, parse_special=True) == [0, 259, A]
    plain = tok.tokenize("<unk>a", add_special=False)
    assert plain == [259, 3 + ord("<"), 3 + ord("u"), 3 + ord("n"), 3 + ord("k"), 3 + ord(">"), A]
    assert tok.tokenize("<xy>", add_special=False)[1:4] == [3 + ord("<"), 3 + ord("x"), 3 + ord("y")]


@pytest.mark.parametrize("name, stripped", [("Phi-3 mini", True), ("tiny", False)])
def test_phi3_special_tokens_eat_the_spaces_after_them(tmp_path, name, stripped):
    """llama.cpp sets rstrip on a phi-3 model's special tokens, </s> too, but not <s>, <unk>, <|endoftext|>."""
    tok = special_vocab(tmp_path, name=name)
    spaces = [] if stripped else [259, 259]
    for text, token in [("</s>", 2), ("<|end|>", END), ("<x>", X)]:
        assert tok.tokenize(f"a{text}  b", add_special=False, parse_special=True) == \
            [259, A, token] + spaces + [259, B], text
    for text, token in [("<s>", 1), ("<unk>", 0), ("<|endoftext|>", ENDOFTEXT)]:
        assert tok.tokenize(f"a{text}  b", add_special=False, parse_special=True) == \
            [259, A, token, 259, 259, 259, B], text


def test_byte_fallback_to_one_byte_tokens_without_0xNN_tokens(tmp_path):
    """A vocabulary with raw one-byte texts instead of <0xNN> tokens: llama.cpp falls back to them."""
    tokens = ["<unk>", "<s>", "</s>", "\u2581", "a", b"\xc3", b"\xa9", "\u2581a"]
    tok = Tokenizer.from_gguf(write_spm_vocab(tmp_path / "raw-bytes.gguf", tokens, [2, 3, 3] + [1] * 5))
    assert tok.tokenize("a\u00e9", add_special=False) == [7, 5, 6]
    assert tok.tokenize("\u00e9 a", add_special=False) == [3, 5, 6, 7]
    assert tok.detokenize([7, 5, 6]) == "a\u00e9"
    assert tok.tokenize("?", add_special=False) == [3, 0]   # no token at all: <unk> (llama.cpp fails)


# -- wrong-typed tokenizer metadata -----------------------------------------

# GGUF value types
GGUF_U32, GGUF_BOOL, GGUF_STRING, GGUF_ARRAY = 4, 7, 8, 9


def gguf_string(s: str) -> bytes:
    data = s.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def gguf_array(item_type: int, items: list) -> bytes:
    """An array value: item type, count, items (strings or u32 / f32 numbers)."""
    if item_type == GGUF_STRING:
        body = b"".join(gguf_string(s) for s in items)
    else:
        body = struct.pack(f"<{len(items)}{'f' if item_type == 6 else 'I'}", *items)
    return struct.pack("<IQ", item_type, len(items)) + body


TINY_TOKENS = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581", "\u2581H"]


def tiny_spm_fields() -> dict[str, tuple[int, bytes]]:
    """A small SentencePiece vocabulary as raw GGUF key -> (value type, encoded value)."""
    n = len(TINY_TOKENS)
    return {
        "general.architecture": (GGUF_STRING, gguf_string("llama")),
        "tokenizer.ggml.model": (GGUF_STRING, gguf_string("llama")),
        "tokenizer.ggml.tokens": (GGUF_ARRAY, gguf_array(GGUF_STRING, TINY_TOKENS)),
        "tokenizer.ggml.scores": (GGUF_ARRAY, gguf_array(6, [0.0] * n)),
        "tokenizer.ggml.token_type": (GGUF_ARRAY, gguf_array(GGUF_U32, [2, 3, 3] + [6] * 256 + [1, 1])),
        "tokenizer.ggml.bos_token_id": (GGUF_U32, struct.pack("<I", 1)),
        "tokenizer.ggml.add_bos_token": (GGUF_BOOL, b"\x01"),
    }


def write_tiny_spm(path: Path, **changes: tuple[int, bytes] | None) -> Path:
    """tiny_spm_fields() with some keys (short names under tokenizer.ggml.) replaced or removed."""
    fields = tiny_spm_fields()
    for name, value in changes.items():
        key = "tokenizer.ggml." + name
        if value is None:
            del fields[key]
        else:
            fields[key] = value
    write_gguf(path, [(key, kind, value) for key, (kind, value) in fields.items()])
    return path


def gguf_nested_string_array(rows: list[list[str]]) -> bytes:
    """An array of arrays of strings (valid GGUF; no tokenizer key holds one)."""
    return struct.pack("<IQ", GGUF_ARRAY, len(rows)) + b"".join(
        gguf_array(GGUF_STRING, row)[0:] for row in rows)


WRONG_TYPES = [  # key, (type, value), what the message says
    ("bos_token_id", (GGUF_ARRAY, gguf_array(GGUF_U32, [1])),
     "bos_token_id must be an integer, got an array"),
    ("eos_token_id", (GGUF_STRING, gguf_string("2")), "eos_token_id must be an integer, got a string"),
    ("tokens", (GGUF_U32, struct.pack("<I", 5)), "tokens must be an array of strings, got an integer"),
    ("tokens", (GGUF_ARRAY, gguf_array(GGUF_U32, [1, 2, 3])),
     "tokens must be an array of strings, got an integer at index 0"),
    ("tokens", (GGUF_STRING, gguf_string("abc")), "tokens must be an array of strings, got a string"),
    ("scores", (GGUF_U32, struct.pack("<I", 5)), "scores must be an array of numbers, got an integer"),
    ("token_type", (GGUF_U32, struct.pack("<I", 5)),
     "token_type must be an array of integers, got an integer"),
    ("add_bos_token", (GGUF_STRING, gguf_string("false")), "add_bos_token must be a bool, got a string"),
    # an array of arrays: gguf's reader gives it flat, so it loaded (flattened) from a reader
    ("tokens", (GGUF_ARRAY, gguf_nested_string_array([TINY_TOKENS[:3], TINY_TOKENS[3:]])),
     "tokens must be an array of strings, got an array at index 0"),
    # llama.cpp reads special ids as u32: a negative one fell back to the default silently
    ("bos_token_id", (5, struct.pack("<i", -1)), "bos_token_id = -1 is negative"),
]


@pytest.mark.parametrize("name, value, message", WRONG_TYPES,
                         ids=[f"{case[0]}-{i}" for i, case in enumerate(WRONG_TYPES)])
def test_wrong_typed_metadata_is_a_load_error_naming_the_key(tmp_path, name, value, message):
    """Each used to escape as a TypeError / AttributeError, or load a wrong vocabulary."""
    path = write_tiny_spm(tmp_path / "bad.gguf", **{name: value})
    with pytest.raises(TokenizerError, match=f"^{path}: tokenizer.ggml.{message}$"):
        Tokenizer.from_gguf(path)
    gguf = pytest.importorskip("gguf")
    with pytest.raises(TokenizerError, match=f"tokenizer.ggml.{message}$"):
        Tokenizer.from_gguf(gguf.GGUFReader(str(path)))


def test_a_duplicate_key_is_refused(tmp_path):
    # the last one won (bos 15043 where llama.cpp, and gguf, refuse the file)
    fields = list(tiny_spm_fields().items()) + [("tokenizer.ggml.bos_token_id", (GGUF_U32, struct.pack("<I", 2)))]
    path = tmp_path / "dup.gguf"
    write_gguf(path, [(key, kind, value) for key, (kind, value) in fields])
    with pytest.raises(ValueError, match="dup.gguf: duplicate metadata key 'tokenizer.ggml.bos_token_id'"):
        Tokenizer.from_gguf(path)


@pytest.mark.parametrize("text", ["<0x4G>", "<0x-1>", "Q~", "<0x411>"])
def test_a_byte_token_that_does_not_read_0xHH_is_refused(tmp_path, text):
    # read as 0x00 (llama.cpp: strtol's prefix, 0x04 / 0xFF, or it aborts on a short text)
    tokens = list(TINY_TOKENS)
    tokens[3 + 0x41] = text
    path = write_tiny_spm(tmp_path / "byte.gguf", tokens=(GGUF_ARRAY, gguf_array(GGUF_STRING, tokens)))
    with pytest.raises(TokenizerError, match=f"token 68 .* is a byte token .* does not read <0xHH>"):
        Tokenizer.from_gguf(path)
    assert Tokenizer.from_gguf(write_tiny_spm(tmp_path / "good.gguf")).token_to_piece(3 + 0x41) == b"A"


def test_ids_are_checked_by_every_accessor_and_a_bad_one_leaves_the_decoder_alone():
    tok = tokenizer("llama-spm")
    for call in (tok.token_text, tok.token_score, tok.is_control, tok.token_to_piece):
        with pytest.raises(IndexError, match="token id -1 out of range"):
            call(-1)                                 # not the last token, counted from the end
        with pytest.raises(IndexError):
            call(tok.n_vocab)
        with pytest.raises(TypeError):
            call(True)
    with pytest.raises(TypeError, match="got bool"):
        tok.detokenize([True, 15043])
    decoder = tok.decoder()
    with pytest.raises(IndexError):
        decoder.feed(10 ** 9)
    assert "".join(decoder.feed(i) for i in [15043, 3186]) + decoder.flush() == "Hello world"
    with pytest.raises(TypeError, match="got float 1.0"):
        tok.decoder(remove_special=True).feed(1.0)      # not taken for BOS (id 1)


def test_merges_must_be_strings():
    fields = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab"],
              "tokenizer.ggml.merges": 7}
    with pytest.raises(TokenizerError, match="merges must be an array of strings, got an integer"):
        Tokenizer.from_metadata(fields, "m.gguf")


def test_tiny_vocabulary_file_loads(tmp_path):
    """The well-typed base of the cases above loads, and a bool add_bos_token is honoured."""
    tok = Tokenizer.from_gguf(write_tiny_spm(tmp_path / "good.gguf"))
    assert tok.tokenize("H") == [1, 260]
    tok = Tokenizer.from_gguf(write_tiny_spm(tmp_path / "nobos.gguf", add_bos_token=(GGUF_BOOL, b"\x00")))
    assert tok.tokenize("H") == [260]


def test_tokenizer_error_is_the_loaders_error_and_names_the_file_once(tmp_path):
    """The model loader passes a TokenizerError on as its one-line ModelLoadError."""
    from ggml_py.files.gguf_reader import GGUFModelFile, ModelLoadError
    path = write_tiny_spm(tmp_path / "no-vocab.gguf", tokens=None)
    with pytest.raises(ModelLoadError) as info:
        Tokenizer.from_model_file(GGUFModelFile(path))
    message = str(info.value)
    assert message.count("no-vocab.gguf") == 1, message
    assert "no tokenizer vocabulary (missing 'tokenizer.ggml.tokens')" in message
    assert issubclass(TokenizerError, ModelLoadError) and issubclass(TokenizerError, ValueError)


# -- counts the file cannot hold --------------------------------------------

def patched_vocab(tmp_path: Path, key: bytes, count: int) -> Path:
    """The llama-spm vocabulary with the element count of array ``key`` replaced."""
    data = bytearray(vocab_path("llama-spm").read_bytes())
    at = data.index(key) + len(key) + 4 + 4  # past the key, the value type and the item type
    struct.pack_into("<Q", data, at, count)
    path = tmp_path / "patched.gguf"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("key, count", [
    (b"tokenizer.ggml.tokens", 2**28),   # used to take 2 GiB and 1.5 s before failing
    (b"tokenizer.ggml.tokens", 2**40),   # used to be a bare MemoryError
    (b"tokenizer.ggml.scores", 2**40),
    (b"tokenizer.ggml.token_type", 2**64 - 1),
])
def test_array_count_larger_than_the_file_is_refused_before_allocating(tmp_path, key, count):
    path = patched_vocab(tmp_path, key, count)
    with pytest.raises(ValueError, match=f"patched.gguf: .*an array of {count} items at byte "
                                         f"\\d+ runs past its end, in key '{key.decode()}'"):
        read_gguf_metadata(path)


def test_key_value_count_larger_than_the_file_is_refused(tmp_path):
    path = tmp_path / "many-keys.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2**40) + b"\0" * 64)
    with pytest.raises(ValueError, match="key/value count 1099511627776 is more than the file can hold"):
        read_gguf_metadata(path)


def test_array_of_arrays_is_read_as_gguf_writes_it(tmp_path):
    """Each inner array is item type, count, items (no value type of its own)."""
    nested = struct.pack("<IQ", GGUF_ARRAY, 2) + gguf_array(GGUF_U32, [1, 2]) + gguf_array(GGUF_U32, [3])
    path = tmp_path / "nested.gguf"
    write_gguf(path, [("a.nested", GGUF_ARRAY, nested), ("b.after", GGUF_U32, struct.pack("<I", 7))])
    assert read_gguf_metadata(path) == {"a.nested": [[1, 2], [3]], "b.after": 7}


# -- invalid UTF-8 and lone surrogates in the text --------------------------

@pytest.mark.parametrize("name", ["llama-bpe", "gpt-2"])
def test_bpe_invalid_utf8_bytes_become_u_fffd_one_per_byte(name):
    """llama.cpp's unicode_cpts_from_utf8 turns each byte it cannot decode into U+FFFD.

    Invalid bytes arrive as surrogate escapes (argv, files read with
    surrogateescape) or as bytes; both used to raise UnicodeEncodeError.
    """
    tok = tokenizer(name)
    expected = tok.tokenize("caf\ufffd ok", add_special=False)
    assert tok.tokenize("caf\udce9 ok", add_special=False) == expected
    assert tok.tokenize(b"caf\xe9 ok", add_special=False) == expected
    # A truncated sequence is one U+FFFD per byte (Python's "replace" gives one).
    assert tok.tokenize(b"\xe2\x82x", add_special=False) == tok.tokenize("\ufffd\ufffdx", add_special=False)
    # What llama.cpp's decoder accepts although Python's does not: an overlong
    # NUL, and an encoded surrogate that it encodes back to the same bytes.
    assert tok.tokenize(b"\xc0\x80", add_special=False) == tok.tokenize("\x00", add_special=False)
    assert tok.detokenize_bytes(tok.tokenize(b"\xed\xa0\x80", add_special=False)) == b"\xed\xa0\x80"
    # Above U+10FFFF llama.cpp cannot encode the code point again; each byte is invalid here.
    assert tok.tokenize(b"\xf5\x80\x80\x80", add_special=False) == \
        tok.tokenize("\ufffd" * 4, add_special=False)


@pytest.mark.parametrize("name", VOCABS)
def test_lone_surrogate_that_is_not_an_escaped_byte_is_u_fffd(name):
    tok = tokenizer(name)
    assert tok.tokenize("a\ud800b") == tok.tokenize("a\ufffdb")
    assert tok.tokenize("\udfff") == tok.tokenize("\ufffd")


def test_spm_invalid_utf8_symbols_are_cut_by_the_lead_byte_as_in_llama_cpp():
    """llm_tokenizer_spm starts with one symbol per unicode_len_utf8(lead byte).

    "caf\\xe9 ok" with the SentencePiece space prefix and escaping is the bytes
    E2 96 81 'c' 'a' 'f' E9 E2 96 81 'o' 'k'. Symbols: "\u2581", c, a, f, then
    E9 (a 3-byte lead) takes E2 96 with it, the lone 81 is its own symbol, o, k.
    No vocabulary token spans the invalid symbols, so "\u2581caf" tokenizes as it
    does alone ("\u2581c" 274, "af" 2142), E9 E2 96 and 81 fall back to byte
    tokens (<0xNN> is id NN + 3: 236, 229, 153, 132) and "o" "k" merge into
    "ok" 554 -- without "\u2581", whose bytes went to the other symbols.
    """
    spm = tokenizer("llama-spm")
    assert spm.tokenize("caf", add_special=False) == [274, 2142]
    assert spm.token_id("ok") == 554
    expected = [274, 2142, 0xE9 + 3, 0xE2 + 3, 0x96 + 3, 0x81 + 3, 554]
    assert spm.tokenize("caf\udce9 ok", add_special=False) == expected
    assert spm.tokenize(b"caf\xe9 ok", add_special=False) == expected
    # "\u2581" then E2 82 78: the 3-byte lead takes the "x" along, as byte <0x78>.
    assert spm.tokenize(b"\xe2\x82x", add_special=False) == [29871, 0xE2 + 3, 0x82 + 3, 0x78 + 3]
    # The bytes come back as they went in; decoded, E2 96 81 is a literal "\u2581".
    ids = spm.tokenize(b"caf\xe9 ok", add_special=False)
    assert spm.detokenize_bytes(ids) == b"caf\xe9\xe2\x96\x81ok"
    assert spm.detokenize(ids) == "caf\ufffd\u2581ok"


# -- argument types ---------------------------------------------------------

@pytest.mark.parametrize("name", VOCABS)
def test_tokenize_accepts_str_and_utf8_bytes_only(name):
    tok = tokenizer(name)
    expected = tok.tokenize("Hello world")
    assert tok.tokenize(b"Hello world") == tok.tokenize(bytearray(b"Hello world")) == expected
    for bad in (None, 3, ["Hello"]):
        with pytest.raises(TypeError, match="text must be str, bytes or bytearray"):
            tok.tokenize(bad)


def test_detokenize_wants_integer_token_ids():
    np = pytest.importorskip("numpy")
    spm = tokenizer("llama-spm")
    assert spm.detokenize([np.int64(15043), np.int32(3186)]) == "Hello world"
    assert spm.detokenize(np.array([15043, 3186])) == "Hello world"
    with pytest.raises(TypeError, match="token ids must be integers, got float 1.5"):
        spm.detokenize([1.5])
    with pytest.raises(TypeError, match="token ids must be integers"):
        spm.token_to_piece("1")
    with pytest.raises(IndexError, match="out of range"):
        spm.detokenize([32000])


# -- small vocabularies: what llama.cpp does at the edges --------------------
# The expected ids are llama.cpp's own (llama_tokenize on the same files) unless said otherwise.

def write_bpe_vocab(path: Path, tokens: list[str], merges: list[str], add_bos: bool | None = None) -> Path:
    """A vocabulary-only byte-level BPE GGUF file (gpt-2 pre-tokenizer, no special ids) that llama.cpp loads too."""
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_name("tiny-bpe")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(tokens))
    writer.add_token_merges(merges)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("index, merge", [(0, ""), (1, "ab"), (1, "a "), (1, " a"), (1, " "),
                                          (2, "  ")])
def test_a_merge_that_is_not_two_texts_is_refused(tmp_path, index, merge):
    """llama.cpp aborts on an empty merge; one without a space after its first character, or
    with nothing after that space, it stores as a pair no text matches. A damaged file."""
    merges = ["a b", "b c", "a bc"]
    merges[index] = merge
    path = write_bpe_vocab(tmp_path / "merges.gguf", ["a", "b", "c", "ab", "bc", "abc"], merges)
    with pytest.raises(TokenizerError, match=f"^{path}: tokenizer.ggml.merges\\[{index}\\] = "
                                             f"{re.escape(repr(merge))} is not two texts separated "
                                             f"by a space$"):
        Tokenizer.from_gguf(path)


@pytest.mark.parametrize("merge", ["a  b", " a b", "a b c", "a  "])
def test_a_merge_split_as_llama_cpp_splits_it_is_two_texts(tmp_path, merge):
    """llama.cpp splits at the first space after the first character: " a" "b", "a" " b",
    "a" "b c", "a" " " are pairs (that byte-level symbols, never holding a space, never
    match): accepted, and nothing is merged by them."""
    path = write_bpe_vocab(tmp_path / "odd.gguf", ["a", "b", "c", "ab"], [merge])
    assert Tokenizer.from_gguf(path).tokenize("ab", add_special=False) == [0, 1]


def test_a_merge_listed_twice_keeps_its_first_rank(tmp_path):
    """llama.cpp fills bpe_ranks with emplace, so the first "a b" (rank 0) wins over its
    repeat (rank 2) and merges before "b c" (rank 1): "abc" is "ab" "c", not "a" "bc"."""
    path = write_bpe_vocab(tmp_path / "dup.gguf", ["a", "b", "c", "ab", "bc", "abc"], ["a b", "b c", "a b"])
    assert Tokenizer.from_gguf(path).tokenize("abc", add_special=False) == [3, 2]


def test_built_in_special_ids_past_a_small_vocabulary_are_dropped(tmp_path):
    """gpt2's default BOS/EOS id 11 is not a token of a 6-token vocabulary: llama.cpp
    disables it ("out of vocab range, disabling"), so there is no BOS, EOS or EOG."""
    tok = Tokenizer.from_gguf(write_bpe_vocab(tmp_path / "small.gguf", ["a", "b", "c", "d", "e", "ab"], ["a b"]))
    assert (tok.bos_id, tok.eos_id, tok.eog_ids) == (None, None, frozenset())
    assert tok.tokenize("ab") == [5]


def test_add_bos_token_without_a_bos_token_is_refused(tmp_path):
    """llama.cpp loads such a file and then aborts in llama_tokenize (GGML_ASSERT on the BOS id)."""
    path = write_bpe_vocab(tmp_path / "no-bos.gguf", ["a", "b", "c", "d", "e", "ab"], ["a b"], add_bos=True)
    with pytest.raises(TokenizerError, match="no-bos.gguf: tokenizer.ggml.add_bos_token is true, "
                                             "but there is no BOS token$"):
        Tokenizer.from_gguf(path)


@pytest.mark.parametrize("key, value, kept", [("bos_token_id", len(SPECIAL_TOKENS), 1),
                                             ("bos_token_id", 2 ** 32 - 1, 1),
                                             ("padding_token_id", 10 ** 6, "none")])
def test_a_special_id_past_the_vocabulary_is_ignored_with_a_warning(key, value, kept):
    """llama.cpp keeps the default for an id >= n_vocab and says so ("bad special token:
    'tokenizer.ggml.bos_token_id' = 270, using default id 1"): loaded, with one warning line."""
    fields = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": SPECIAL_TOKENS,
              "tokenizer.ggml.token_type": SPECIAL_TYPES, f"tokenizer.ggml.{key}": value}
    with pytest.warns(TokenizerWarning) as caught:
        tok = Tokenizer.from_metadata(fields, "bos.gguf")
    assert [str(w.message) for w in caught] == [
        f"bos.gguf: tokenizer.ggml.{key} = {value} is past the vocabulary ({len(SPECIAL_TOKENS)} "
        f"tokens): ignored, the default ({kept}) kept, as llama.cpp does"]
    assert (tok.bos_id, tok.pad_id) == (1, None)
    assert tok.tokenize("a") == [1, 259, A]


def test_a_special_id_past_the_vocabulary_of_a_file_warns_naming_the_file(tmp_path):
    path = write_spm_vocab(tmp_path / "bos.gguf", SPECIAL_TOKENS, SPECIAL_TYPES, bos_id=len(SPECIAL_TOKENS))
    with pytest.warns(TokenizerWarning, match=f"^{path}: tokenizer.ggml.bos_token_id = "
                                              f"{len(SPECIAL_TOKENS)} is past the vocabulary"):
        assert Tokenizer.from_gguf(path).bos_id == 1


@pytest.mark.parametrize("name, count", [("scores", 10), ("scores", len(TINY_TOKENS) + 1),
                                         ("token_type", len(TINY_TOKENS) - 1),
                                         ("token_type", 2 * len(TINY_TOKENS))])
def test_a_per_token_array_must_have_one_entry_per_token(tmp_path, name, count):
    """llama.cpp reads entry i for token i whatever the length: past the end of a short
    array; a long one no longer says which value belongs to which token. Both refused."""
    item_type = 6 if name == "scores" else GGUF_U32
    path = write_tiny_spm(tmp_path / "per-token.gguf",
                          **{name: (GGUF_ARRAY, gguf_array(item_type, [1] * count))})
    with pytest.raises(TokenizerError, match=f"^{path}: tokenizer.ggml.{name} has {count} entries, "
                                             f"tokenizer.ggml.tokens has {len(TINY_TOKENS)}$"):
        Tokenizer.from_gguf(path)


def test_special_tokens_are_matched_longest_first_by_utf8_length(tmp_path):
    """llama.cpp sorts them by the byte length of their text: "\u00e9\u00e9a" (5 bytes, 3
    characters) is split out of "\u00e9\u00e9abcd" before "abcd" (4 bytes, 4 characters)."""
    tokens = SPECIAL_TOKENS + ["\u00e9\u00e9a", "abcd"]
    tok = Tokenizer.from_gguf(write_spm_vocab(tmp_path / "long.gguf", tokens, SPECIAL_TYPES + [4, 4]))
    eea = len(SPECIAL_TOKENS)
    assert tok.tokenize("\u00e9\u00e9abcd", add_special=False) == [eea, 259, B, B + 1, 3 + ord("d")]


def test_lstrip_and_rstrip_strip_ascii_whitespace_only(tmp_path):
    """llama.cpp strips with C isspace(): a no-break space (bytes C2 A0, here byte tokens)
    next to a special token stays text, and stripping stops at it."""
    nbsp = [3 + 0xC2, 3 + 0xA0]
    mask = len(SPECIAL_TOKENS)
    path = write_spm_vocab(tmp_path / "mask.gguf", SPECIAL_TOKENS + ["[MASK]"], SPECIAL_TYPES + [4],
                           name="modern-bert")                   # [MASK] eats the spaces before it
    tok = Tokenizer.from_gguf(path)
    assert tok.tokenize("a [MASK]", add_special=False) == [259, A, mask]
    assert tok.tokenize("a\t\u00a0 [MASK]", add_special=False) == [259, A, 3 + ord("\t")] + nbsp + [mask]
    phi3 = special_vocab(tmp_path, name="Phi-3 mini")          # <|end|> eats the spaces after it
    assert phi3.tokenize("a<|end|> \u00a0b", add_special=False, parse_special=True) == \
        [259, A, END, 259] + nbsp + [B]


def test_of_several_end_of_turn_texts_the_lowest_id_is_eot(tmp_path):
    """llama.cpp takes the first it meets walking a hash map, so no order is fixed there;
    here the lowest id wins, whichever text it has. Both still end the generation."""
    base, types = SPECIAL_TOKENS[:END], SPECIAL_TYPES[:END]   # without <|end|>, <|endoftext|>
    for n, texts in enumerate((["<|im_end|>", "<|eot_id|>"], ["<|eot_id|>", "<|im_end|>"])):
        path = write_spm_vocab(tmp_path / f"eot{n}.gguf", base + texts, types + [3, 3])
        tok = Tokenizer.from_gguf(path)
        first = len(base)
        assert tok.eot_id == first, texts
        assert {first, first + 1} <= tok.eog_ids


def test_incremental_decoder_holds_a_space_two_bytes_into_a_contraction():
    """gpt-2 sets clean_spaces: " 've" loses its space, " 'v" does not, so after " 'v" the
    space is not final yet; it must come out as detokenize gives it once "e" arrives."""
    gpt2 = tokenizer("gpt-2")
    ids = [gpt2.tokenize(piece, add_special=False) for piece in ("I", " '", "v", "e")]
    assert all(len(i) == 1 for i in ids)
    ids = [i[0] for i in ids]
    decoder = gpt2.decoder()
    pieces = [decoder.feed(i) for i in ids] + [decoder.flush()]
    assert pieces[2] == ""                                   # " 'v": held back
    assert "".join(pieces) == gpt2.detokenize(ids) == "I've"


def test_incremental_decoder_holds_back_a_long_run_of_spaces_whole():
    """A run of space tokens is never final (a "?" after it takes its last space), so the
    decoder holds all of it back, then gives it with the "?" (the run is stepped over at
    once: one space at a time made a run quadratic, 20,000 spaces ~40 s)."""
    gpt2 = tokenizer("gpt-2")
    space, question = gpt2.tokenize(" ", add_special=False), gpt2.tokenize("?", add_special=False)
    ids = [gpt2.tokenize("a", add_special=False)[0]] + space * 3000 + question
    decoder = gpt2.decoder()
    pieces = [decoder.feed(i) for i in ids] + [decoder.flush()]
    assert "".join(pieces) == gpt2.detokenize(ids) == "a" + " " * 2999 + "?"
    assert pieces[1:-2] == [""] * 3000                   # the run is held back, never cut
