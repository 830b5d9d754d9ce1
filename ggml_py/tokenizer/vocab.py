"""A tokenizer's vocabulary, loaded from GGUF ``tokenizer.*`` metadata and checked.

:class:`Vocab` holds the tokens, their scores and attributes, the byte-level BPE
merges, the special token ids and the per-vocabulary flags (``add_bos``,
``add_space_prefix``, ``clean_spaces``, ...), with llama.cpp's defaults and
its detection of end-of-turn, fill-in-the-middle and end-of-generation tokens
by their text (src/llama-vocab.cpp). What must agree within the metadata is
checked here, as docs/tokenizer.md lists it; the tokenizing and decoding
modules of this room read what is loaded.
"""

from __future__ import annotations

import itertools
import operator
import re
import warnings
from typing import Any, Mapping

from ggml_py.tokenizer.metadata import KEY, TokenizerError, TokenizerWarning, field_getter
from ggml_py.tokenizer.pretokenize import PRE_TOKENIZERS, PreTokenizer

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

_INSIDE = operator.itemgetter(slice(1, -1))   # a text without its first and last character
SPACE_ESCAPE = "\u2581"  # SentencePiece's visible space, in token texts


class Vocab:
    """The vocabulary of a llama.cpp tokenizer: what :class:`~ggml_py.tokenizer.Tokenizer`
    tokenizes and decodes with, and the queries on it (ids, texts, scores, EOG).

    The attributes with a leading underscore are this room's own: the token texts
    (``_tokens``, ``_token_to_id``), ``_scores``, ``_attrs`` (``ATTR_*`` bits),
    ``_merge_ranks`` and ``_pre_tokenizer`` (byte-level BPE), ``_special_tokens``
    (split out of text, longest first), ``_byte_tokens`` (SentencePiece byte
    fallback) and ``_pieces`` (each token's bytes, rendered when first asked for).
    """

    def __init__(self, fields: Mapping[str, Any], source: str = "<metadata>") -> None:
        """Load the vocabulary from GGUF metadata ``fields`` (key -> value).

        Values may be plain Python values, numpy arrays or ``gguf.ReaderField``
        objects. ``source`` names the origin (e.g. the file path) in error
        messages. Raises :class:`TokenizerError` (a ``ValueError``) if the
        metadata holds no usable tokenizer or a value of the wrong type.
        """
        self.source = source
        get = field_getter(fields, source)

        self.model = get("model", "str")
        if self.model is None:
            raise TokenizerError(f"{source}: no tokenizer in GGUF metadata (missing '{KEY}model')")
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
        self._byte_tokens = self._byte_fallback_table() if self.is_spm else None

    def _load_tokens(self, get) -> None:
        tokens = get("tokens", "str[]")
        if not tokens:
            problem = f"'{KEY}tokens' is empty" if tokens is not None else f"missing '{KEY}tokens'"
            raise TokenizerError(f"{self.source}: no tokenizer vocabulary ({problem})")
        tokens = list(tokens)  # a copy: empty texts get renamed below
        n_vocab = len(tokens)
        scores = self._per_token(get("scores", "number[]"), "scores", n_vocab)
        types = self._per_token(get("token_type", "int[]"), "token_type", n_vocab)

        token_to_id: dict[str, int] = {}
        for i, text in enumerate(tokens):
            if not text:
                text = tokens[i] = f"[EMPTY_{i}]"
            if token_to_id.setdefault(text, i) != i:
                raise TokenizerError(f"{self.source}: duplicate token in vocabulary: {text!r} "
                                     f"has ids {token_to_id[text]} and {i}")
        self._tokens: list[str] = tokens
        self._token_to_id = token_to_id
        self._scores: list[float] = [float(s) for s in scores] if scores is not None \
            else [0.0] * n_vocab
        if types is None:
            self._attrs = [ATTR_NORMAL] * n_vocab
        else:
            self._attrs = [_ATTR_FROM_TYPE.get(t, ATTR_UNDEFINED) for t in types]
            for i, attr in enumerate(self._attrs):
                # llama.cpp reads a byte token's value with strtol, whatever the text
                # ("<0x4G>" as 0x04, a text under 3 characters aborts it): such a file
                # is damaged, so it is refused rather than read either way
                if attr & ATTR_BYTE and not _BYTE_TOKEN.fullmatch(tokens[i]):
                    raise TokenizerError(f"{self.source}: token {i} {tokens[i]!r:.20} is a byte "
                                         f"token (type BYTE) but does not read <0xHH>")

    def _per_token(self, values: list | None, name: str, n_vocab: int) -> list | None:
        """``values`` (an array of one entry per token, or None), refused unless it has
        exactly one entry per token.

        llama.cpp reads entry i for token i and never looks at the length: a short array
        is read past its end, a long one means the arrays no longer belong together (a
        token was dropped, or another vocabulary's scores were written), so either way
        which value goes with which token is unknown.
        """
        if values is not None and len(values) != n_vocab:
            raise TokenizerError(f"{self.source}: {KEY}{name} has {len(values)} entries, "
                                 f"{KEY}tokens has {n_vocab}")
        return values

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
                                     f"(missing '{KEY}merges')")
            self._check_merges(merges)
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

    def _check_merges(self, merges: list[str]) -> None:
        """Refuse a merge that is not two non-empty texts separated by a space.

        llama.cpp splits each merge at its first space after the first character; an
        empty merge aborts it, and one with no such space or nothing after it becomes
        a pair no text ever matches, silently. Either is a damaged file.
        """
        # a space strictly inside the text is the same test; mapped without a Python-level
        # loop, as Llama 3 has 280k merges (50 ms, against 190 ms item by item)
        if all(map(operator.contains, map(_INSIDE, merges), itertools.repeat(" "))):
            return
        i = next(i for i, merge in enumerate(merges) if " " not in merge[1:-1])
        raise TokenizerError(f"{self.source}: {KEY}merges[{i}] = {merges[i]!r:.40} is not two "
                             f"texts separated by a space")

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
                raise TokenizerError(f"{self.source}: {KEY}{key} = {value} is negative")
            if value is not None and value >= n_vocab:
                # llama.cpp loads such a file, warning and keeping the default; a refusal
                # here would turn away files it runs
                kept = "none" if default is None else default
                warnings.warn(f"{self.source}: {KEY}{key} = {value} is past the vocabulary "
                              f"({n_vocab} tokens): ignored, the default ({kept}) kept, as "
                              f"llama.cpp does", TokenizerWarning)
            elif value is not None:
                default = value
            setattr(self, attr + "_id", default)
        # llama.cpp reads these as GGUF bools; the string "false" is not false.
        self.add_bos = get("add_bos_token", "bool", self.add_bos)
        self.add_eos = get("add_eos_token", "bool", self.add_eos)
        if self.add_bos and self.bos_id is None:
            raise TokenizerError(f"{self.source}: {KEY}add_bos_token is true, but there is no BOS token")
        if self.add_eos and self.eos_id is None:
            raise TokenizerError(f"{self.source}: {KEY}add_eos_token is true, but there is no EOS token")

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
