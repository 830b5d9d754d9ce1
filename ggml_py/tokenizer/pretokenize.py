"""How llama.cpp splits and encodes text before the BPE / SentencePiece merges.

Invalid UTF-8 handling (surrogate escapes back to bytes, llama.cpp's own
UTF-8 decoding), the GPT-2 byte-to-unicode mapping of byte-level BPE, the
regex pre-tokenizers selected by ``tokenizer.ggml.pre`` and the
``clean_spaces`` passes of detokenization, as in src/llama-vocab.cpp and
src/unicode.cpp. Used by the ``vocab``, ``spm``, ``bpe`` and ``decode`` modules beside it.
"""

from __future__ import annotations

import re
from typing import Iterable

import regex


# ---------------------------------------------------------------------------
# Invalid UTF-8 in the input
# ---------------------------------------------------------------------------
# llama.cpp tokenizes bytes. Invalid UTF-8 reaches Python as surrogate escapes
# (U+DC80..U+DCFF, what ``surrogateescape`` makes of argv and of files read
# that way), so those are the raw bytes again. Any other lone surrogate is no
# text at all and counts as U+FFFD.

_SURROGATE_RUN = re.compile("[\ud800-\udfff]+")
_NOT_AN_ESCAPE = re.compile("[\ud800-\udc7f\udd00-\udfff]")
# llama.cpp's unicode_len_utf8: a symbol's length from its lead byte's high nibble.
_UTF8_LEN_BY_NIBBLE = (1,) * 12 + (2, 2, 3, 4)


def is_clean(text: str) -> bool:
    """True if ``text`` holds no surrogates (so it is plain UTF-8 text)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def text_bytes(text: str) -> bytes:
    """The bytes llama.cpp would be given for ``text`` (escaped bytes restored)."""
    return _NOT_AN_ESCAPE.sub("\ufffd", text).encode("utf-8", "surrogateescape")


def utf8_symbol_lengths(data: bytes) -> list[int]:
    """Initial SentencePiece symbols as llama.cpp cuts them: ``lengths[i]`` at each start, else 0.

    Only the lead byte counts: a stray 0xE9 takes the next two bytes along
    whatever they are; the last symbol is cut short at the end.
    """
    n = len(data)
    lengths = [0] * n
    i = 0
    while i < n:
        size = min(_UTF8_LEN_BY_NIBBLE[data[i] >> 4], n - i)
        lengths[i] = size
        i += size
    return lengths


def llama_code_points(text: str) -> str:
    """``text`` as llama.cpp's byte-level BPE sees it (``unicode_cpts_from_utf8``).

    Valid text is unchanged. Escaped bytes are decoded as llama.cpp decodes
    its input: a lead byte with enough continuation bytes (10xxxxxx) gives
    its code point, even an overlong one (C0 80 -> U+0000) or a surrogate
    (ED A0 80 -> U+D800); every other byte becomes one U+FFFD. Decoding each
    run of escapes alone gives the same result, since a valid character
    never starts with a continuation byte.
    """
    return _SURROGATE_RUN.sub(lambda run: llama_decode_utf8(text_bytes(run.group())), text)


def llama_decode_utf8(data: bytes) -> str:
    """llama.cpp's unicode_cpts_from_utf8 on ``data``, as a str."""
    out = []
    i, n = 0, len(data)
    while i < n:
        lead = data[i]
        if lead < 0x80:
            size = 1
        elif lead < 0xC0 or lead >= 0xF8:
            size = 0  # a continuation byte, or no UTF-8 lead at all
        else:
            size = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
        tail = data[i + 1:i + size]
        if size and len(tail) == size - 1 and all(0x80 <= b < 0xC0 for b in tail):
            cpt = lead if size == 1 else lead & (0x7F >> size)
            for b in tail:
                cpt = (cpt << 6) | (b & 0x3F)
            # Above U+10FFFF llama.cpp decodes, then fails to encode the word
            # again (an exception out of llama_tokenize); taken as invalid here.
            if cpt <= 0x10FFFF:
                out.append(chr(cpt))
                i += size
                continue
        out.append("\ufffd")
        i += 1
    return "".join(out)


# ---------------------------------------------------------------------------
# Byte-level BPE helpers
# ---------------------------------------------------------------------------

def gpt2_byte_to_unicode() -> list[str]:
    """GPT-2's reversible mapping of the 256 byte values onto printable characters."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1))
                 + list(range(0xAE, 0xFF + 1)))
    mapping = {}
    extra = 0
    for byte in range(256):
        if byte in printable:
            mapping[byte] = chr(byte)
        else:
            mapping[byte] = chr(256 + extra)
            extra += 1
    return [mapping[b] for b in range(256)]


_BYTE_TO_UNICODE = gpt2_byte_to_unicode()
_UNICODE_TO_BYTE = {ch: byte for byte, ch in enumerate(_BYTE_TO_UNICODE)}


def byte_encode(word: str) -> str:
    """Map the UTF-8 bytes of ``word`` through the GPT-2 byte-to-unicode table."""
    # latin-1 turns each byte into the character with the same ordinal, which
    # str.translate then maps through the 256-entry table in C. A surrogate
    # code point (llama.cpp decodes ED A0 80 to U+D800) is encoded back to
    # its three bytes, as llama.cpp's unicode_cpt_to_utf8 does.
    return word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_BYTE_TO_UNICODE)


def byte_decode(token_text: str) -> bytes:
    """Reverse of the GPT-2 byte mapping (llama.cpp's ``llama_decode_text``)."""
    out = bytearray()
    for ch in token_text:
        byte = _UNICODE_TO_BYTE.get(ch)
        if byte is not None:
            out.append(byte)
        else:
            # Same marker llama.cpp writes for characters outside the mapping.
            utf8 = ch.encode("utf-8", "surrogateescape")
            out += b"[UNK_BYTE_0x" + utf8.hex().encode() + token_text.encode("utf-8", "surrogateescape") + b"]"
    return bytes(out)


# Pre-tokenizer regexes, as adapted by llama.cpp (src/llama-vocab.cpp). Their
# \s, \p{L} and \p{N} must be llama.cpp's Unicode 15.1 tables: regex from
# 2024.9.11 on knows Unicode 16 and 17, whose 9,039 new letters and digits
# llama.cpp splits as "other" (pyproject.toml pins regex below that).
CONTRACTIONS_ANY_CASE = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
RE_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_RE_LLAMA3 = (CONTRACTIONS_ANY_CASE + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_RE_QWEN2 = (CONTRACTIONS_ANY_CASE + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


class PreTokenizer:
    """Regexes applied in sequence plus the vocabulary flags a pre-tokenizer implies."""

    def __init__(self, patterns: Iterable[str], *, ignore_merges: bool = False,
                 add_bos: bool = False, clean_spaces: bool = True) -> None:
        self.patterns = [regex.compile(p) for p in patterns]
        self.ignore_merges = ignore_merges
        self.add_bos = add_bos
        self.clean_spaces = clean_spaces

    def split(self, text: str) -> list[str]:
        """Split ``text`` into words. Text between matches is kept as its own word."""
        words = [text]
        for pattern in self.patterns:
            split_words = []
            for word in words:
                start = 0
                for match in pattern.finditer(word):
                    begin, end = match.span()
                    if begin > start:
                        split_words.append(word[start:begin])
                    if end > begin:
                        split_words.append(word[begin:end])
                    start = end
                if start < len(word):
                    split_words.append(word[start:])
            words = split_words
        return words


def make_pre_tokenizers() -> dict[str, PreTokenizer]:
    """{tokenizer.ggml.pre name: its PreTokenizer}, for the names llama.cpp knows."""
    default = PreTokenizer([r"[\p{P}\$\+<=>\^~\|]+",
                             r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
                             r"\p{N}+",
                             r"[0-9][0-9][0-9]"])
    llama3 = PreTokenizer([_RE_LLAMA3], ignore_merges=True, add_bos=True)
    llama3_like = PreTokenizer([_RE_LLAMA3])
    gpt2 = PreTokenizer([RE_GPT2])
    gpt2_unclean = PreTokenizer([RE_GPT2], clean_spaces=False)
    digits_then_gpt2 = PreTokenizer([r"\p{N}", RE_GPT2])
    digits_then_gpt2_unclean = PreTokenizer([r"\p{N}", RE_GPT2], clean_spaces=False)
    qwen2 = PreTokenizer([_RE_QWEN2], clean_spaces=False)
    qwen2_clean = PreTokenizer([_RE_QWEN2])
    falcon = PreTokenizer([r"[\p{P}\$\+<=>\^~\|`]+", RE_GPT2, r"[0-9][0-9][0-9]"])
    table = {"default": default, "falcon": falcon}
    for name in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                 "midm-2.0", "lfm2", "jina-v5-nano"):
        table[name] = llama3
    for name in ("dbrx", "smaug-bpe"):
        table[name] = llama3_like
    for name in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es",
                 "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "mpt", "olmo",
                 "jais", "exaone4"):
        table[name] = gpt2
    for name in ("trillion",):
        table[name] = gpt2_unclean
    for name in ("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"):
        table[name] = digits_then_gpt2
    for name in ("command-r", "smollm"):
        table[name] = digits_then_gpt2_unclean
    for name in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"):
        table[name] = qwen2
    for name in ("stablelm2", "megrez"):
        table[name] = qwen2_clean
    return table


PRE_TOKENIZERS = make_pre_tokenizers()


# llama.cpp's clean_spaces passes (HF clean_up_tokenization_spaces), on bytes.
# Each pass only deletes spaces; they run in this order.
_CLEAN_SPACE_BEFORE_PUNCT = re.compile(rb" (?=[?!.,])")
_CLEAN_LONE_APOSTROPHE = re.compile(rb" ' ")
_CLEAN_SPACE_BEFORE_CONTRACTION = re.compile(rb" (?='(?:s|m|re|ve))")


def clean_spaces(text: bytes) -> bytes:
    """Detokenized text after the passes above: no space before ? ! . , or a
    contraction ('s 'm 're 've), none around a lone apostrophe."""
    text = _CLEAN_SPACE_BEFORE_PUNCT.sub(b"", text)
    text = _CLEAN_LONE_APOSTROPHE.sub(b"'", text)
    return _CLEAN_SPACE_BEFORE_CONTRACTION.sub(b"", text)
