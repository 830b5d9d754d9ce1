"""Tokenizer for llama-family GGUF models, matching llama.cpp.

Two vocabulary types are supported, selected by ``tokenizer.ggml.model``:

* ``llama`` -- SentencePiece BPE (LLaMA 1/2, Mistral, ...): bigram merges by
  token score, spaces escaped as ``\\u2581``, byte fallback tokens ``<0xNN>``.
* ``gpt2`` -- byte-level BPE (GPT-2, Llama 3, Qwen2, ...): a regex
  pre-tokenizer chosen by ``tokenizer.ggml.pre``, the GPT-2 byte-to-unicode
  mapping and merges by rank.

The behaviour follows llama.cpp's ``llama_tokenize`` / ``llama_detokenize`` /
``llama_token_to_piece`` (src/llama-vocab.cpp), including the special-token
partitioning, the SentencePiece space prefix, the ``clean_spaces`` rules of
byte-level vocabularies and the end-of-generation token detection.

The pre-tokenizers, the byte mapping and the UTF-8 handling live in
``ggml_py.tokenizer.pretokenize``. The code is pure Python on the standard library and
the ``regex`` package (its error type derives from ggml_py's
``ModelLoadError``). A path is read with ggml_py's GGUF reader (files/gguf_file.py);
a file open with it (``GGUFFile``), or a ``gguf.GGUFReader``, can be passed in.
"""

from __future__ import annotations

import codecs
import heapq
import numbers
import operator
import os
import re
from typing import Any, Iterable, Mapping

from ggml_py.files.gguf_metadata import tokenizer_fields, plain_value, read_gguf_metadata
# ggml_py's own package __init__ has imported this already; no extra cost.
from ggml_py.files.gguf_reader import ModelLoadError
from ggml_py.tokenizer.pretokenize import (
    PRE_TOKENIZERS, PreTokenizer, byte_decode, byte_encode, clean_spaces, is_clean,
    llama_code_points, text_bytes, utf8_symbol_lengths,
)

__all__ = [
    "Tokenizer",
    "TokenizerError",
    "IncrementalDecoder",
    "read_gguf_metadata",
    "TOKEN_TYPE_UNDEFINED",
    "TOKEN_TYPE_NORMAL",
    "TOKEN_TYPE_UNKNOWN",
    "TOKEN_TYPE_CONTROL",
    "TOKEN_TYPE_USER_DEFINED",
    "TOKEN_TYPE_UNUSED",
    "TOKEN_TYPE_BYTE",
]

# Token types as stored in ``tokenizer.ggml.token_type``.
TOKEN_TYPE_UNDEFINED = 0
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

# Token attribute bits (llama.h ``llama_token_attr``). Attributes, unlike
# types, can be combined: a NORMAL token that looks like an end-of-turn
# marker gets CONTROL added, some models strip spaces around special tokens.
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8

_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")    # a byte token's text

_ATTR_FROM_TYPE = {
    TOKEN_TYPE_UNDEFINED: ATTR_UNDEFINED,
    TOKEN_TYPE_NORMAL: ATTR_NORMAL,
    TOKEN_TYPE_UNKNOWN: ATTR_UNKNOWN,
    TOKEN_TYPE_CONTROL: ATTR_CONTROL,
    TOKEN_TYPE_USER_DEFINED: ATTR_USER_DEFINED,
    TOKEN_TYPE_UNUSED: ATTR_UNUSED,
    TOKEN_TYPE_BYTE: ATTR_BYTE,
}

# Tokens rendered by detokenize only when unparse_special is set.
_ATTR_SPECIAL = ATTR_UNKNOWN | ATTR_CONTROL

_KEY = "tokenizer.ggml."

# Token texts that llama.cpp recognises as end-of-turn / end-of-message /
# fill-in-the-middle markers when the GGUF does not name them explicitly.
_EOT_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>",
})
_EOM_TEXTS = frozenset({"<|eom_id|>"})
_FIM_TEXTS = {
    "fim_pre": frozenset({
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
        "<\uff5cfim\u2581begin\uff5c>", "<PRE>", "\u2581<PRE>",
        "<|code_prefix|>", "<|prefix|>"}),
    "fim_suf": frozenset({
        "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
        "<\uff5cfim\u2581hole\uff5c>", "<SUF>", "\u2581<SUF>",
        "<|code_suffix|>", "<|suffix|>"}),
    "fim_mid": frozenset({
        "<|fim_middle|>", "<fim-middle>", "<fim_middle>",
        "<\uff5cfim\u2581end\uff5c>", "<MID>", "\u2581<MID>",
        "<|code_middle|>", "<|middle|>"}),
    "fim_pad": frozenset({"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}),
    "fim_rep": frozenset({"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}),
    "fim_sep": frozenset({"<|file_sep|>"}),
}
# Token texts that end generation whatever the metadata says.
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
    "<|flush|>", "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>",
    "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
})
# gpt-oss chat markers are always rendered, like user-defined tokens.
_ALWAYS_RENDERED_TEXTS = frozenset({"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})

# Special-token ids read from metadata: (attribute, GGUF key suffix).
# The deprecated prefix/suffix/middle keys come last so they override, as in
# llama.cpp.
_SPECIAL_ID_KEYS = (
    ("bos", "bos_token_id"),
    ("eos", "eos_token_id"),
    ("eot", "eot_token_id"),
    ("eom", "eom_token_id"),
    ("unk", "unknown_token_id"),
    ("sep", "seperator_token_id"),  # sic: the key is spelled this way
    ("pad", "padding_token_id"),
    ("mask", "mask_token_id"),
    ("fim_pre", "fim_pre_token_id"),
    ("fim_suf", "fim_suf_token_id"),
    ("fim_mid", "fim_mid_token_id"),
    ("fim_pad", "fim_pad_token_id"),
    ("fim_rep", "fim_rep_token_id"),
    ("fim_sep", "fim_sep_token_id"),
    ("fim_pre", "prefix_token_id"),
    ("fim_suf", "suffix_token_id"),
    ("fim_mid", "middle_token_id"),
)

_SPACE_ESCAPE = "\u2581"  # SentencePiece's visible space


# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------

class TokenizerError(ModelLoadError):
    """Metadata without a usable tokenizer; the message is '<source>: <problem>'.

    A ``ModelLoadError`` (so a ``ValueError``): the model loader passes it on
    unchanged and the command-line programs print it as their one-line error.
    """


# Metadata value kinds ("x[]": an array of x): how messages name them, and the
# Python types that are one. A bool is an int to Python but not to GGUF.
_KINDS = {
    "str": ("a string", "strings", (str,)),
    # the numeric ABCs admit numpy scalars (a list of np.float32 loads as a list of
    # floats does); np.bool_ is neither Integral nor Real, and bool is excluded below
    "int": ("an integer", "integers", (numbers.Integral,)),
    "bool": ("a bool", "bools", (bool,)),
    "number": ("a number", "numbers", (numbers.Real,)),
}


def _is_kind(value_type: type, kind: str) -> bool:
    return issubclass(value_type, _KINDS[kind][2]) and (kind == "bool" or not issubclass(value_type, bool))


def _kind_of(value: Any) -> str:
    """How an error message names what a metadata value turned out to be."""
    for kind in ("bool", "int", "str"):
        if _is_kind(type(value), kind):
            return _KINDS[kind][0]
    if isinstance(value, numbers.Real):
        return "a float"
    if isinstance(value, (list, tuple)):
        return "an array"
    return f"a {type(value).__name__}"


def _check_kind(value: Any, kind: str, key: str, source: str) -> Any:
    """``value`` if it is of ``kind`` ('int', 'str[]', ...), else a TokenizerError naming ``key``."""
    if not kind.endswith("[]"):
        if not _is_kind(type(value), kind):
            raise TokenizerError(f"{source}: {key} must be {_KINDS[kind][0]}, got {_kind_of(value)}")
        return value
    item_kind = kind[:-2]
    plural = _KINDS[item_kind][1]
    if not isinstance(value, (list, tuple)):
        raise TokenizerError(f"{source}: {key} must be an array of {plural}, got {_kind_of(value)}")
    # Check the few distinct item types, not every item (128k-entry arrays).
    bad = {t for t in set(map(type, value)) if not _is_kind(t, item_kind)}
    if bad:
        index = next(i for i, item in enumerate(value) if type(item) in bad)
        raise TokenizerError(f"{source}: {key} must be an array of {plural}, "
                             f"got {_kind_of(value[index])} at index {index}")
    return value


class Tokenizer:
    """A llama.cpp-compatible tokenizer built from GGUF ``tokenizer.*`` metadata.

    Build one with :meth:`from_gguf` (a path, or a file open as a ``GGUFFile`` or a
    ``gguf.GGUFReader``) or :meth:`from_metadata` / the constructor (a mapping of
    metadata keys to values, e.g. what a model loader already read).
    """

    # Bound the per-word cache of the byte-level BPE so long-running
    # processes do not grow without limit.
    _WORD_CACHE_LIMIT = 100_000

    def __init__(self, fields: Mapping[str, Any], source: str = "<metadata>") -> None:
        """Build the tokenizer from GGUF metadata ``fields`` (key -> value).

        Values may be plain Python values, numpy arrays, a ``GGUFFile``'s ``Field``
        objects or ``gguf.ReaderField`` objects. ``source`` names the origin (e.g.
        the file path) in error messages. Raises :class:`TokenizerError` (a
        ``ValueError``) if the metadata holds no usable tokenizer or a value of the
        wrong type.
        """
        self.source = source
        get = self._field_getter(fields, source)

        self.model = get("model", "str")
        if self.model is None:
            raise TokenizerError(f"{source}: no tokenizer in GGUF metadata (missing '{_KEY}model')")
        if self.model == "llama":
            self.is_spm = True
        elif self.model == "gpt2":
            self.is_spm = False
        else:
            raise TokenizerError(f"{source}: unsupported tokenizer model {self.model!r} "
                                 "(supported: 'llama' = SentencePiece, 'gpt2' = byte-level BPE)")

        self._load_tokens(get)
        self._configure(get)
        self._load_special_ids(get)
        self._detect_special_tokens_by_text()
        self._finish_special_tokens(get("name", "str", "", prefix="general."))

        self._pieces: list[bytes | None] = [None] * self.n_vocab
        self._word_cache: dict[str, list[int]] = {}
        self._byte_tokens = self._byte_fallback_table() if self.is_spm else None

    # -- construction -------------------------------------------------------

    @classmethod
    def from_gguf(cls, path_or_reader: Any, source: str | None = None) -> "Tokenizer":
        """Load the tokenizer of a GGUF file: a path, or the file open as a
        ``GGUFFile`` (ggml_py's reader) or a ``gguf.GGUFReader``.

        ``source`` names the file in error messages (default: the path, or
        the path the open file was read from). Raises ``ValueError`` naming
        the file if it is not a GGUF file, :class:`TokenizerError` (also a
        ``ValueError``) if it has no usable tokenizer.
        """
        if hasattr(path_or_reader, "fields"):
            if source is None:    # a GGUFFile knows its path, a GGUFReader's memmap its name
                source = str(getattr(path_or_reader, "path", None) or getattr(getattr(
                    path_or_reader, "data", None), "filename", None) or "<GGUFReader>")
            return cls(tokenizer_fields(path_or_reader), source)
        path = os.fspath(path_or_reader)
        return cls(read_gguf_metadata(path), path if source is None else source)

    @classmethod
    def from_model_file(cls, model_file: Any) -> "Tokenizer":
        """The tokenizer of an opened model file (files.gguf_reader.GGUFModelFile); any
        problem with it is that file's ModelLoadError ('<file>: tokenizer: ...')."""
        try:
            return cls.from_gguf(model_file.reader, source=model_file.path)
        except ModelLoadError:
            raise
        except ValueError as e:
            lines = str(e).strip().splitlines()
            raise model_file.error(f"tokenizer: {lines[0] if lines else type(e).__name__}") from None

    @classmethod
    def from_metadata(cls, fields: Mapping[str, Any], source: str = "<metadata>") -> "Tokenizer":
        """Build the tokenizer from already-read GGUF metadata (key -> value)."""
        return cls(fields, source)

    @staticmethod
    def _field_getter(fields: Mapping[str, Any], source: str):
        def get(name: str, kind: str, default: Any = None, prefix: str = _KEY) -> Any:
            """The value of key ``prefix + name`` (``default`` if absent), checked to be of ``kind``."""
            value = fields.get(prefix + name)
            if value is None:
                return default
            return _check_kind(plain_value(value), kind, prefix + name, source)
        return get

    def _load_tokens(self, get) -> None:
        tokens = get("tokens", "str[]")
        if not tokens:
            problem = f"'{_KEY}tokens' is empty" if tokens is not None else f"missing '{_KEY}tokens'"
            raise TokenizerError(f"{self.source}: no tokenizer vocabulary ({problem})")
        tokens = list(tokens)  # a copy: empty texts get renamed below
        n_vocab = len(tokens)
        scores = get("scores", "number[]")
        types = get("token_type", "int[]")
        if scores is not None and len(scores) < n_vocab:
            raise TokenizerError(f"{self.source}: {len(scores)} scores for {n_vocab} tokens")
        if types is not None and len(types) < n_vocab:
            raise TokenizerError(f"{self.source}: {len(types)} token types for {n_vocab} tokens")

        token_to_id: dict[str, int] = {}
        for i, text in enumerate(tokens):
            if not text:
                text = tokens[i] = f"[EMPTY_{i}]"
            if token_to_id.setdefault(text, i) != i:
                raise TokenizerError(f"{self.source}: duplicate token in vocabulary: {text!r} "
                                     f"has ids {token_to_id[text]} and {i}")
        self._tokens: list[str] = tokens
        self._token_to_id = token_to_id
        self._scores: list[float] = [float(s) for s in scores[:n_vocab]] if scores is not None \
            else [0.0] * n_vocab
        if types is None:
            self._attrs = [ATTR_NORMAL] * n_vocab
        else:
            self._attrs = [_ATTR_FROM_TYPE.get(t, ATTR_UNDEFINED) for t in types[:n_vocab]]
            for i, attr in enumerate(self._attrs):
                # llama.cpp reads a byte token's value with strtol, whatever the text
                # ("<0x4G>" as 0x04, a text under 3 characters aborts it): such a file
                # is damaged, so it is refused rather than read either way
                if attr & ATTR_BYTE and not _BYTE_TOKEN.fullmatch(tokens[i]):
                    raise TokenizerError(f"{self.source}: token {i} {tokens[i]!r:.20} is a byte "
                                         f"token (type BYTE) but does not read <0xHH>")

    def _configure(self, get) -> None:
        """Vocabulary-type defaults, then the flags the metadata overrides."""
        self.pre = get("pre", "str", "")
        self._merge_ranks: dict[str, int] = {}
        self._pre_tokenizer: PreTokenizer | None = None
        self.ignore_merges = False
        if self.is_spm:
            self.add_space_prefix = True
            self.clean_spaces = False
            self.add_bos, self.add_eos = True, False
            self.bos_id, self.eos_id, self.unk_id = 1, 2, 0
        else:
            merges = get("merges", "str[]")
            if merges is None:
                raise TokenizerError(f"{self.source}: byte-level BPE vocabulary without merges "
                                     f"(missing '{_KEY}merges')")
            # Merges are "left right" strings, rank = index, first one wins.
            # Lookups build the same "left right" key: byte-encoded symbols
            # never contain a space, so this equals splitting each merge at
            # its first space.
            self._merge_ranks = dict(zip(reversed(merges), range(len(merges) - 1, -1, -1)))
            pre_name = self.pre or "default"
            self._pre_tokenizer = PRE_TOKENIZERS.get(pre_name)
            if self._pre_tokenizer is None:
                raise TokenizerError(f"{self.source}: unsupported pre-tokenizer {pre_name!r} "
                                     f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})")
            self.add_space_prefix = False
            self.clean_spaces = self._pre_tokenizer.clean_spaces
            self.ignore_merges = self._pre_tokenizer.ignore_merges
            self.add_bos = self._pre_tokenizer.add_bos
            self.add_eos = False
            self.bos_id, self.eos_id, self.unk_id = 11, 11, None
        self.add_space_prefix = get("add_space_prefix", "bool", self.add_space_prefix)
        self.eot_id = self.eom_id = self.sep_id = self.pad_id = self.mask_id = None
        self.fim_pre_id = self.fim_suf_id = self.fim_mid_id = None
        self.fim_pad_id = self.fim_rep_id = self.fim_sep_id = None

    def _load_special_ids(self, get) -> None:
        n_vocab = self.n_vocab
        for attr, key in _SPECIAL_ID_KEYS:
            default = getattr(self, attr + "_id")
            if default is not None and default >= n_vocab:
                default = None  # a built-in default outside a small vocabulary
            value = get(key, "int")
            if value is not None and value < 0:
                # llama.cpp reads these as u32 and refuses another type; a negative one
                # must not fall back to the default without a word
                raise TokenizerError(f"{self.source}: {_KEY}{key} = {value} is negative")
            if value is not None and value < n_vocab:     # past the vocabulary: ignored, as llama.cpp
                default = value
            setattr(self, attr + "_id", default)
        # llama.cpp reads these as GGUF bools; the string "false" is not false.
        self.add_bos = get("add_bos_token", "bool", self.add_bos)
        self.add_eos = get("add_eos_token", "bool", self.add_eos)
        if self.add_bos and self.bos_id is None:
            raise TokenizerError(f"{self.source}: {_KEY}add_bos_token is true, but there is no BOS token")
        if self.add_eos and self.eos_id is None:
            raise TokenizerError(f"{self.source}: {_KEY}add_eos_token is true, but there is no EOS token")

    def _mark_control(self, token_id: int) -> None:
        # llama.cpp treats control-looking tokens of other types as control
        # tokens (a conversion bug it works around).
        self._attrs[token_id] |= ATTR_CONTROL

    def _detect_special_tokens_by_text(self) -> None:
        """Find end-of-turn / FIM tokens by their text and build the EOG set.

        llama.cpp walks a hash map here, so which of several candidates wins
        is unspecified there; the lowest id wins here.
        """
        by_text = [("eot", _EOT_TEXTS), ("eom", _EOM_TEXTS)] + list(_FIM_TEXTS.items())
        for role, texts in by_text:
            if getattr(self, role + "_id") is not None:
                continue
            matches = sorted(self._token_to_id[t] for t in texts if t in self._token_to_id)
            if matches:
                setattr(self, role + "_id", matches[0])
                self._mark_control(matches[0])

        eog = {i for i in (self.fim_pad_id, self.fim_rep_id, self.fim_sep_id) if i is not None}
        for text in _EOG_TEXTS:
            token_id = self._token_to_id.get(text)
            if token_id is not None:
                eog.add(token_id)
                self._mark_control(token_id)
        for text in _ALWAYS_RENDERED_TEXTS:
            token_id = self._token_to_id.get(text)
            if token_id is not None:
                self._attrs[token_id] = ATTR_USER_DEFINED
        eog.update(i for i in (self.eos_id, self.eot_id, self.eom_id) if i is not None)
        self._drop_eog_workarounds(eog)
        self.eog_ids = frozenset(eog)

    def _drop_eog_workarounds(self, eog: set[int]) -> None:
        """llama.cpp's exceptions: tokens that look like EOG but are not."""
        texts = {self._tokens[i]: i for i in eog}
        # gpt-oss / solar-open: "<|end|>" ends a message, not the generation.
        has_call = "<|call|>" in texts or "<|calls|>" in texts
        if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
            end_id = texts["<|end|>"]
            eog.discard(end_id)
            self._attrs[end_id] = ATTR_USER_DEFINED
        # gemma4 / paddleocr: "</s>" is an ordinary token there.
        if "<|tool_response>" in texts and "</s>" in texts:
            eog.discard(texts["</s>"])
            self._attrs[texts["</s>"]] = ATTR_NORMAL

    def _finish_special_tokens(self, model_name: str) -> None:
        """Cache the tokens split out before tokenization, then per-model strip flags."""
        special = [i for i, a in enumerate(self._attrs)
                   if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)]
        # Longest first (by UTF-8 length, as llama.cpp compares byte strings)
        # so that a token containing another is matched first.
        special.sort(key=lambda i: -len(self._tokens[i].encode("utf-8", "surrogateescape")))
        self._special_tokens = special
        name = model_name.lower()
        if self.pre in ("jina-v2-de", "jina-v2-es", "jina-v2-code"):
            self._set_attr_by_text("<mask>", ATTR_LSTRIP, True)
        elif "phi-3" in name or "phi3" in name:
            for token_id in special:
                self._attrs[token_id] |= ATTR_RSTRIP
            self._set_attr_by_text("</s>", ATTR_RSTRIP, True)
            for text in ("<unk>", "<s>", "<|endoftext|>"):
                self._set_attr_by_text(text, ATTR_RSTRIP, False)
        elif "modern-bert" in name:
            self._set_attr_by_text("[MASK]", ATTR_LSTRIP, True)

    def _set_attr_by_text(self, text: str, attr: int, value: bool) -> None:
        token_id = self._token_to_id.get(text)
        if token_id is not None:
            self._attrs[token_id] = (self._attrs[token_id] | attr) if value \
                else (self._attrs[token_id] & ~attr)

    def _byte_fallback_table(self) -> list[int | None]:
        """Token id for each byte value: ``<0xNN>``, else the one-byte token, else None."""
        table: list[int | None] = []
        for byte in range(256):
            token_id = self._token_to_id.get(f"<0x{byte:02X}>")
            if token_id is None:
                token_id = self._token_to_id.get(bytes([byte]).decode("utf-8", "surrogateescape"))
            table.append(token_id)
        return table

    # -- properties ---------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        """Number of tokens in the vocabulary."""
        return len(self._tokens)

    def is_eog(self, token_id: int) -> bool:
        """True if ``token_id`` ends generation (EOS, EOT, EOM and similar)."""
        return token_id in self.eog_ids

    def checked_id(self, token_id: Any) -> int:
        """token_id as an int in 0..n_vocab-1: TypeError for a non-integer (a float, a
        bool), IndexError outside the vocabulary (a negative id is not counted from the end)."""
        if isinstance(token_id, bool):   # (numpy's bool has no __index__: refused below)
            raise TypeError(f"token ids must be integers, got bool {token_id!r}")
        try:
            token_id = operator.index(token_id)  # numpy integers too, not 1.5
        except TypeError:
            raise TypeError(f"token ids must be integers, got {type(token_id).__name__} "
                            f"{token_id!r}") from None
        if not 0 <= token_id < self.n_vocab:
            raise IndexError(f"token id {token_id} out of range [0, {self.n_vocab})")
        return token_id

    def is_control(self, token_id: int) -> bool:
        """True for control tokens (BOS, EOS, chat markers, ...)."""
        return bool(self._attrs[self.checked_id(token_id)] & ATTR_CONTROL)

    def token_text(self, token_id: int) -> str:
        """The raw vocabulary text of a token (e.g. ``'\u2581Hello'`` or ``'<0x0A>'``)."""
        return self._tokens[self.checked_id(token_id)]

    def token_id(self, text: str) -> int | None:
        """The id of the token whose vocabulary text is exactly ``text``, or None."""
        return self._token_to_id.get(text)

    def token_score(self, token_id: int) -> float:
        """The token's score (SentencePiece log-probability; 0.0 when absent)."""
        return self._scores[self.checked_id(token_id)]

    def __repr__(self) -> str:
        kind = "SPM" if self.is_spm else f"BPE/{self.pre or 'default'}"
        return f"<Tokenizer {kind} n_vocab={self.n_vocab} bos={self.bos_id} eos={self.eos_id} source={self.source!r}>"

    # -- tokenize -----------------------------------------------------------

    def tokenize(self, text: str | bytes, add_special: bool = True,
                 parse_special: bool = False) -> list[int]:
        """Convert ``text`` to token ids, like llama.cpp's ``llama_tokenize``.

        ``text`` is a str or UTF-8 bytes / bytearray. Invalid UTF-8 (in bytes,
        or as the surrogate escapes of a str read with ``surrogateescape``)
        is tokenized as llama.cpp tokenizes those bytes; other lone
        surrogates count as U+FFFD. ``add_special`` adds BOS (and EOS) if the
        vocabulary asks for them. ``parse_special`` turns control-token texts
        in ``text`` (``<s>``, ``<|begin_of_text|>``, ...) into their ids;
        user-defined tokens are always recognised.
        """
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", "surrogateescape")
        elif not isinstance(text, str):
            raise TypeError(f"text must be str, bytes or bytearray, got {type(text).__name__}")
        fragments: list[str | int] = self._split_special(text, parse_special) if text else []
        output: list[int] = []
        if add_special and self.add_bos:
            output.append(self.bos_id)
        if self.is_spm:
            self._tokenize_spm_fragments(fragments, output)
        else:
            for fragment in fragments:
                if isinstance(fragment, int):
                    output.append(fragment)
                else:
                    self._tokenize_bpe_fragment(fragment, output)
        if add_special and self.add_eos:
            output.append(self.eos_id)
        return output

    def _split_special(self, text: str, parse_special: bool) -> list[str | int]:
        """Split ``text`` into raw-text fragments and special-token ids.

        Each special token, longest first, is searched in the remaining text
        fragments; matches become ids. Control and unknown tokens are only
        searched when ``parse_special`` is set.
        """
        fragments: list[str | int] = [text]
        for token_id in self._special_tokens:
            attr = self._attrs[token_id]
            if not parse_special and attr & (ATTR_CONTROL | ATTR_UNKNOWN):
                continue
            token_text = self._tokens[token_id]
            if not any(isinstance(f, str) and token_text in f for f in fragments):
                continue
            split: list[str | int] = []
            for fragment in fragments:
                if isinstance(fragment, str) and token_text in fragment:
                    self._split_on_token(fragment, token_text, token_id, attr, split)
                else:
                    split.append(fragment)
            fragments = split
        return fragments

    @staticmethod
    def _split_on_token(fragment: str, token_text: str, token_id: int, attr: int,
                        out: list[str | int]) -> None:
        # Strip as C isspace() would: ASCII whitespace only.
        ascii_space = " \t\n\v\f\r"
        start = 0
        while True:
            match = fragment.find(token_text, start)
            if match < 0:
                break
            left = fragment[start:match]
            if attr & ATTR_LSTRIP:
                left = left.rstrip(ascii_space)
            if left:
                out.append(left)
            out.append(token_id)
            start = match + len(token_text)
            if attr & ATTR_RSTRIP:
                while start < len(fragment) and fragment[start] in ascii_space:
                    start += 1
        if start < len(fragment):
            out.append(fragment[start:])

    # SentencePiece ---------------------------------------------------------

    def _tokenize_spm_fragments(self, fragments: list[str | int], output: list[int]) -> None:
        # A space is prefixed to text at the start and after a special token,
        # as SentencePiece does for the start of a sentence.
        prev_is_special = True
        for fragment in fragments:
            if isinstance(fragment, int):
                output.append(fragment)
                prev_is_special = True
                continue
            if self.add_space_prefix and prev_is_special:
                fragment = " " + fragment
            self._tokenize_spm_text(fragment.replace(" ", _SPACE_ESCAPE), output)
            prev_is_special = False

    def _tokenize_spm_text(self, text: str, output: list[int]) -> None:
        """llama.cpp's ``llm_tokenizer_spm``: merge the best-scoring adjacent pair first.

        llama.cpp starts from one symbol per UTF-8 sequence, its length read
        from the lead byte alone. For valid text that is one symbol per
        character. Text with invalid UTF-8 (surrogate escapes) is worked on
        as bytes, one character per byte (latin-1), so that a stray lead
        byte takes the bytes after it into its symbol exactly as in llama.cpp.
        """
        if is_clean(text):
            self._spm_merge(text, None, self._token_to_id.get, "utf-8", output)
            return
        data = text_bytes(text)
        token_to_id = self._token_to_id

        def lookup(piece: str) -> int | None:
            return token_to_id.get(piece.encode("latin-1").decode("utf-8", "surrogateescape"))

        self._spm_merge(data.decode("latin-1"), utf8_symbol_lengths(data), lookup, "latin-1", output)

    def _spm_merge(self, text: str, lengths: list[int] | None, lookup, encoding: str,
                   output: list[int]) -> None:
        """The merges of :meth:`_tokenize_spm_text` on ``text``.

        ``lengths[i]`` is the length of the initial symbol starting at
        character ``i`` (0 inside a symbol); None means one per character.
        A symbol always begins where it began (merges only extend a symbol
        to the right), so a symbol is just a length; merged-away symbols have
        length 0. ``lookup`` maps a piece of ``text`` to its token id;
        ``encoding`` turns a piece back into bytes for the byte fallback.
        """
        n = len(text)
        if n == 0:
            return
        scores = self._scores
        if lengths is None:
            length = [1] * n
            next_sym = list(range(1, n + 1))
            next_sym[-1] = -1
            prev_sym = list(range(-1, n - 1))
        else:
            length = lengths
            next_sym = [-1] * n
            prev_sym = [-1] * n
            last = -1
            for i, size in enumerate(length):
                if size:
                    if last >= 0:
                        next_sym[last] = i
                    prev_sym[i] = last
                    last = i
        queue: list[tuple[float, int, int, int]] = []

        def push_pair(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            size = length[left] + length[right]
            token_id = lookup(text[left:left + size])
            if token_id is not None:
                # Highest score first, then leftmost.
                heapq.heappush(queue, (-scores[token_id], left, right, size))

        for i in range(1, n):
            push_pair(prev_sym[i], i)  # -1 (nothing) where i is inside a symbol
        while queue:
            _, left, right, size = heapq.heappop(queue)
            # Skip pairs made stale by an earlier merge of either side.
            if length[left] == 0 or length[right] == 0 or length[left] + length[right] != size:
                continue
            length[left] = size
            length[right] = 0
            next_sym[left] = next_sym[right]
            if next_sym[left] >= 0:
                prev_sym[next_sym[left]] = left
            push_pair(prev_sym[left], left)
            push_pair(left, next_sym[left])

        # Every merged symbol is a vocabulary token; what is left unknown is a
        # single character, which falls back to byte tokens.
        i = 0
        while i != -1:
            piece = text[i:i + length[i]]
            token_id = lookup(piece)
            if token_id is not None:
                output.append(token_id)
            else:
                output.extend(self._byte_token(b) for b in piece.encode(encoding))
            i = next_sym[i]

    def _byte_token(self, byte: int) -> int:
        token_id = self._byte_tokens[byte]
        if token_id is None:
            # llama.cpp fails here; a vocabulary without byte tokens is
            # better served by its unknown token.
            if self.unk_id is None:
                raise ValueError(f"{self.source}: no byte-fallback token for byte 0x{byte:02X}")
            return self.unk_id
        return token_id

    # Byte-level BPE --------------------------------------------------------

    def _tokenize_bpe_fragment(self, text: str, output: list[int]) -> None:
        if not is_clean(text):
            text = llama_code_points(text)
        cache = self._word_cache
        for word in self._pre_tokenizer.split(text):
            ids = cache.get(word)
            if ids is None:
                ids = self._bpe_word_ids(byte_encode(word))
                if len(cache) >= self._WORD_CACHE_LIMIT:
                    cache.clear()
                cache[word] = ids
            output.extend(ids)

    def _bpe_word_ids(self, word: str) -> list[int]:
        """llama.cpp's ``llm_tokenizer_bpe`` on one byte-encoded word."""
        token_to_id = self._token_to_id
        if self.ignore_merges:
            token_id = token_to_id.get(word)
            if token_id is not None:
                return [token_id]
        ids = []
        for symbol in self._bpe_merge(word):
            token_id = token_to_id.get(symbol)
            if token_id is not None:
                ids.append(token_id)
                continue
            # No token for the merged symbol: single-byte tokens where they
            # exist, the rest is dropped (as llama.cpp does).
            for byte in symbol.encode("utf-8"):
                token_id = token_to_id.get(bytes([byte]).decode("utf-8", "surrogateescape"))
                if token_id is not None:
                    ids.append(token_id)
        return ids

    def _bpe_merge(self, word: str) -> list[str]:
        """Apply merges, lowest rank first (leftmost on ties); return the symbols."""
        symbols = list(word)
        n = len(symbols)
        if n < 2:
            return symbols
        ranks = self._merge_ranks
        next_sym = list(range(1, n + 1))
        next_sym[-1] = -1
        prev_sym = list(range(-1, n - 1))
        queue: list[tuple[int, int, int, str]] = []

        def push_pair(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            rank = ranks.get(symbols[left] + " " + symbols[right])
            if rank is not None:
                heapq.heappush(queue, (rank, left, right, symbols[left] + symbols[right]))

        for i in range(1, n):
            push_pair(i - 1, i)
        while queue:
            _, left, right, merged = heapq.heappop(queue)
            left_text, right_text = symbols[left], symbols[right]
            # Skip pairs made stale by an earlier merge of either side.
            if not left_text or not right_text or left_text + right_text != merged:
                continue
            symbols[left] = merged
            symbols[right] = ""
            next_sym[left] = next_sym[right]
            if next_sym[left] >= 0:
                prev_sym[next_sym[left]] = left
            push_pair(prev_sym[left], left)
            push_pair(left, next_sym[left])
        return [s for s in symbols if s]

    # -- detokenize ---------------------------------------------------------

    def token_to_piece(self, token_id: int, special: bool = True, lstrip: int = 0) -> bytes:
        """The bytes a token stands for, like llama.cpp's ``llama_token_to_piece``.

        Byte tokens ``<0xNN>`` give the raw byte, SentencePiece ``\u2581``
        becomes a space, byte-level BPE text is mapped back to bytes. Control
        and unknown tokens give their text if ``special`` is true, else
        nothing. Up to ``lstrip`` leading spaces are removed. A piece may be
        part of a multi-byte UTF-8 character.
        """
        token_id = self.checked_id(token_id)
        if not special and self._attrs[token_id] & _ATTR_SPECIAL:
            return b""
        piece = self._pieces[token_id]
        if piece is None:
            piece = self._pieces[token_id] = self._render_piece(token_id)
        while lstrip > 0 and piece[:1] == b" ":
            piece = piece[1:]
            lstrip -= 1
        return piece

    def _render_piece(self, token_id: int) -> bytes:
        attr = self._attrs[token_id]
        text = self._tokens[token_id]
        if attr & (_ATTR_SPECIAL | ATTR_USER_DEFINED):
            return text.encode("utf-8", "surrogateescape")
        if attr & ATTR_NORMAL:
            if self.is_spm:
                return text.replace(_SPACE_ESCAPE, " ").encode("utf-8", "surrogateescape")
            return byte_decode(text)
        if attr & ATTR_BYTE:
            return bytes([int(text[3:5], 16)])     # "<0xHH>", checked at load
        return b""  # unused / undefined tokens render as nothing

    def detokenize_bytes(self, ids: Iterable[int], remove_special: bool = False,
                         unparse_special: bool = False) -> bytes:
        """Like :meth:`detokenize` but returns the raw UTF-8 bytes."""
        ids = list(ids)
        # The space SentencePiece put in front of the text is taken off again,
        # unless a BOS token is being removed (llama.cpp does exactly this).
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        pieces = []
        for token_id in ids:
            pieces.append(self.token_to_piece(token_id, unparse_special, 1 if remove_space else 0))
            remove_space = False
        text = b"".join(pieces)
        return clean_spaces(text) if self.clean_spaces else text

    def detokenize(self, ids: Iterable[int], remove_special: bool = False,
                   unparse_special: bool = False) -> str:
        """Convert token ids back to text, like llama.cpp's ``llama_detokenize``.

        ``remove_special`` drops a leading BOS / trailing EOS the vocabulary
        adds itself; ``unparse_special`` renders control tokens as their text.
        Pieces are joined as bytes before decoding, so characters split over
        several tokens come out whole; invalid UTF-8 becomes U+FFFD.
        """
        return self.detokenize_bytes(ids, remove_special, unparse_special).decode("utf-8", "replace")

    def decoder(self, remove_special: bool = False, unparse_special: bool = False,
                strip_leading_space: bool | None = None) -> "IncrementalDecoder":
        """A new :class:`IncrementalDecoder` for streaming text out of generated ids."""
        return IncrementalDecoder(self, remove_special=remove_special, unparse_special=unparse_special,
                                  strip_leading_space=strip_leading_space)


class IncrementalDecoder:
    """Turns token ids into text one id at a time, for streaming generation.

    :meth:`feed` returns only text that is final: complete UTF-8 characters
    that later tokens cannot change. Concatenating every :meth:`feed` result
    and the final :meth:`flush` gives exactly ``tokenizer.detokenize(ids,
    remove_special, unparse_special)``.

    ``strip_leading_space`` (default: as detokenize does, i.e. for
    SentencePiece vocabularies) removes the space of the first token; pass
    False when continuing text that was already shown.
    """

    # Committed raw bytes kept as look-behind for deciding where to cut.
    _CONTEXT_BYTES = 8

    def __init__(self, tokenizer: Tokenizer, *, remove_special: bool = False,
                 unparse_special: bool = False, strip_leading_space: bool | None = None) -> None:
        """Start decoding a new sequence of ids with ``tokenizer``."""
        self._tokenizer = tokenizer
        self._remove_special = remove_special
        self._unparse_special = unparse_special
        self._strip_space = tokenizer.add_space_prefix if strip_leading_space is None else strip_leading_space
        self._first = True
        self._held_eos = False
        self._pending = bytearray()  # raw bytes whose space clean-up is not final yet
        self._committed_tail = b""   # last bytes already cleaned, for the look-behind
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, token_id: int) -> str:
        """Add one token id; return the text that became final (often ``''``). A bad id
        raises (TypeError, IndexError) and leaves the decoder as it was."""
        tok = self._tokenizer
        token_id = tok.checked_id(token_id)
        if self._first and self._remove_special and tok.add_bos and token_id == tok.bos_id:
            self._first = False
            self._strip_space = False
            return ""
        if self._held_eos:
            # The EOS held back was not the last token after all.
            self._held_eos = False
            self._append(tok.eos_id)
        if self._remove_special and tok.add_eos and token_id == tok.eos_id:
            self._held_eos = True
            self._first = False
            return ""
        self._append(token_id)
        return self._commit(final=False)

    def flush(self) -> str:
        """End of the sequence: return the remaining text (a trailing EOS is dropped)."""
        self._held_eos = False
        return self._commit(final=True)

    def _append(self, token_id: int) -> None:
        lstrip = 1 if (self._first and self._strip_space) else 0
        self._first = False
        self._pending += self._tokenizer.token_to_piece(token_id, self._unparse_special, lstrip)

    def _commit(self, final: bool) -> str:
        tok = self._tokenizer
        cut = len(self._pending) if (final or not tok.clean_spaces) else self._final_prefix_length()
        if cut == 0 and not final:
            return ""
        chunk = bytes(self._pending[:cut])
        del self._pending[:cut]
        if chunk:
            self._committed_tail = (self._committed_tail + chunk)[-self._CONTEXT_BYTES:]
        if tok.clean_spaces:
            chunk = clean_spaces(chunk)
        return self._utf8.decode(chunk, final)

    def _final_prefix_length(self) -> int:
        """Length of the pending prefix whose space clean-up cannot change any more.

        The clean-up only deletes spaces, each decided by at most three
        following bytes (" 've"). So a cut is final when the last space
        before it is followed by three bytes, or by at least one byte with no
        apostrophe near it. Cutting right after a non-space byte also keeps
        the text after the cut independent of the text before it.
        """
        data = self._committed_tail + bytes(self._pending)
        offset = len(self._committed_tail)
        cut = len(data)
        while cut > offset:
            space = data.rfind(b" ", 0, cut)
            if space < 0:
                return cut - offset
            after = data[space + 1:cut]
            if len(after) >= 3 or (after and b"'" not in data[max(space - 3, 0):cut]):
                return cut - offset
            cut = space
        return 0
