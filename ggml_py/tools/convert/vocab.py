"""The checkpoint's tokenizer as GGUF stores it: a SentencePiece ``tokenizer.model``
or a Hugging Face ``tokenizer.json``, with the checkpoint's added and special tokens.

``transformers`` is not needed: a byte-level BPE ``tokenizer.json``'s pre-tokenizer
is named (``tokenizer.ggml.pre``) from its regexes, not from the HF tokenizer's output
as llama.cpp does, and special tokens are read with gguf's ``SpecialVocab`` as
llama.cpp's converter reads them.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from ggml_py.tokenizer.pretokenize import CONTRACTIONS_ANY_CASE, RE_GPT2, PRE_TOKENIZERS
from ggml_py.tools.convert.common import ConvertError, is_count, json_object, read_json
from ggml_py.tools.convert.config import LlamaParams
from ggml_py.tools.convert.sentencepiece_model import read_sentencepiece_model


# GGUF token types (gguf.TokenType); SentencePiece numbers its piece types the same way
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = range(1, 7)


@dataclass
class Vocab:
    """A tokenizer as GGUF stores it (tokenizer.ggml.*); types are GGUF token types."""
    model: str                  # "llama" (SentencePiece) or "gpt2" (byte-level BPE)
    pre: str                    # tokenizer.ggml.pre: "default", or a byte-level BPE pre-tokenizer
    tokens: list[str]
    scores: list[float] | None
    types: list[int]
    merges: list[str] | None
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool | None
    chat_template: str | list | None = None   # tokenizer_config.json's, as gguf.SpecialVocab reads it


def _tokenizer_config(model_dir: Path) -> dict:
    path = model_dir / "tokenizer_config.json"
    return json_object(path) if path.is_file() else {}


def vocab_from_sentencepiece(path: Path) -> Vocab:
    """A ``llama`` vocabulary from a SentencePiece ``tokenizer.model`` (unigram or BPE), with
    its own special ids (read_vocab applies the checkpoint's)."""
    m = read_sentencepiece_model(path)
    if m["model_type"] not in (1, 2):
        raise ConvertError(f"{path}: SentencePiece model type {m['model_type']} (only unigram/BPE)")

    def opt_id(i: int) -> int | None:
        return i if 0 <= i < len(m["pieces"]) else None

    return Vocab("llama", "default", m["pieces"], m["scores"], m["types"], None,
                 opt_id(m["bos_id"]), opt_id(m["eos_id"]), opt_id(m["unk_id"]), opt_id(m["pad_id"]),
                 add_bos=True, add_eos=False, add_space_prefix=m["add_dummy_prefix"])


def _looks_special(text: str) -> bool:
    """llama.cpp's does_token_look_special: added tokens some checkpoints forget to mark special."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or text.startswith("<|") and text.endswith("|>")
            or text.startswith("<｜") and text.endswith("｜>")
            or text.startswith("<unused") and text.endswith(">"))


def added_token(text: str, special: bool) -> tuple[str, int]:
    """(text, type) of an added token as llama.cpp's converter writes it: CONTROL when marked
    special or looking special, else USER_DEFINED with SentencePiece's "▁" as a space."""
    if special or _looks_special(text):
        return text, CONTROL
    return text.replace("▁", " "), USER_DEFINED


def sentencepiece_added_tokens(model_dir: Path, tok_cfg: dict) -> dict[int, tuple[str, int]]:
    """{id: (text, type)} of the tokens added to a SentencePiece vocabulary (by a fine-tune),
    as llama.cpp's _create_vocab_sentencepiece reads them: added_tokens.json (USER_DEFINED),
    then tokenizer_config.json's added_tokens_decoder, which wins (see added_token)."""
    added = {}
    path = model_dir / "added_tokens.json"
    if path.is_file():
        for text, i in json_object(path).items():
            if not is_count(i):
                raise ConvertError(f"{path}: token {text!r} has id {i!r}, not a non-negative integer")
            added[i] = (text, USER_DEFINED)
    decoder = tok_cfg.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        raise ConvertError(f"{model_dir / 'tokenizer_config.json'}: added_tokens_decoder is not an object")
    for key, entry in decoder.items():
        content = entry.get("content") if isinstance(entry, dict) else None
        if not (key.isascii() and key.isdigit()) or not isinstance(content, str):
            raise ConvertError(f"{model_dir / 'tokenizer_config.json'}: added_tokens_decoder entry "
                               f"{key!r}: {entry!r} is not an id and {{\"content\": text}}")
        added[int(key)] = added_token(content, bool(entry.get("special")))
    return added


def _merge_text(merge, path: Path) -> str:
    """A tokenizer.json merge, "a b" or ["a", "b"], as GGUF's "a b"."""
    if isinstance(merge, str):
        return merge
    if isinstance(merge, list) and len(merge) == 2 and all(isinstance(m, str) for m in merge):
        return " ".join(merge)
    raise ConvertError(f"{path}: merge {merge!r} is not \"a b\" or [\"a\", \"b\"]")


def read_tokenizer_json(path: Path) -> tuple[dict, list[str], list[dict]]:
    """(tokenizer.json, its BPE merges as "a b", its added tokens), every id checked."""
    tj = read_json(path)
    bpe = tj.get("model") if isinstance(tj, dict) else None
    if not isinstance(bpe, dict):
        raise ConvertError(f"{path}: not a tokenizer.json with a model vocabulary")
    if bpe.get("type", "BPE") != "BPE":
        raise ConvertError(f"{path}: tokenizer model {bpe.get('type')!r} is not supported (only BPE)")
    vocab = bpe.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise ConvertError(f"{path}: the model vocabulary is {vocab!r}, not an object of tokens")
    for text, i in vocab.items():
        if not is_count(i):
            raise ConvertError(f"{path}: token {text!r} has id {i!r}, not a non-negative integer")
    added = tj.get("added_tokens") or []
    if not isinstance(added, list):
        raise ConvertError(f"{path}: added_tokens is not a list")
    for t in added:
        if not isinstance(t, dict) or not isinstance(t.get("content"), str) or not is_count(t.get("id")):
            raise ConvertError(f"{path}: added token {t!r} has no text and integer id")
    merges = bpe.get("merges") or []
    if not isinstance(merges, list):
        raise ConvertError(f"{path}: merges is not a list")
    return tj, [_merge_text(m, path) for m in merges], added


# HF writes the contractions case-insensitively; llama.cpp (ggml_py.tokenizer.pretokenize) spells the cases out
_HF_CONTRACTIONS = "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
# tokenizer.ggml.pre names a byte-level BPE checkpoint can get, in order of preference: the
# names llama.cpp's converter writes, for the pre-tokenizers ggml_py.tokenizer.pretokenize implements
BPE_PRE_NAMES = ("llama-bpe", "smaug-bpe", "gpt-2", "trillion", "qwen2", "stablelm2",
                 "starcoder", "command-r")


def _pre_tokenizer_regexes(pre) -> list[str] | None:
    """The regexes a byte-level tokenizer.json pre_tokenizer splits with, in order and in
    llama.cpp's spelling; None unless it is Split (Isolated) / Digits steps and one ByteLevel
    that adds no prefix space (its use_regex is GPT-2's regex)."""
    steps = pre.get("pretokenizers") if isinstance(pre, dict) and pre.get("type") == "Sequence" else [pre]
    regexes, byte_level = [], 0
    for step in steps if isinstance(steps, list) else [None]:
        step = step if isinstance(step, dict) else {}
        pattern = step.get("pattern") if isinstance(step.get("pattern"), dict) else {}
        if (step.get("type") == "Split" and isinstance(pattern.get("Regex"), str)
                and step.get("behavior") == "Isolated" and not step.get("invert")):
            regexes.append(pattern["Regex"].replace(_HF_CONTRACTIONS, CONTRACTIONS_ANY_CASE))
        elif step.get("type") == "Digits":
            regexes.append(r"\p{N}" if step.get("individual_digits") else r"\p{N}+")
        elif step.get("type") == "ByteLevel" and not step.get("add_prefix_space"):
            byte_level += 1
            if step.get("use_regex", True):
                regexes.append(RE_GPT2)
        else:
            return None
    return regexes if byte_level == 1 else None


def bpe_pre_name(tj: dict, tok_cfg: dict, path: Path) -> str:
    """tokenizer.ggml.pre of a byte-level BPE tokenizer.json: the llama.cpp name whose
    pre-tokenizer splits with the same regexes as its pre_tokenizer; among names sharing
    them, the one with the same ignore_merges (the BPE model's) and clean_spaces
    (tokenizer_config.json's clean_up_tokenization_spaces). llama.cpp's converter hashes the
    HF tokenizer's output instead; like it, an unknown pre-tokenizer is refused."""
    pre = tj.get("pre_tokenizer")
    regexes = _pre_tokenizer_regexes(pre)
    names = [n for n in BPE_PRE_NAMES if [r.pattern for r in PRE_TOKENIZERS[n].patterns] == regexes]
    if not names:
        found = json.dumps(pre)       # one line, whatever the regexes hold
        raise ConvertError(f"{path}: BPE pre-tokenizer not recognized: {found[:400]} "
                           f"(known: those of {', '.join(BPE_PRE_NAMES)})")
    ignore_merges = bool(tj["model"].get("ignore_merges"))
    clean = tok_cfg.get("clean_up_tokenization_spaces")

    def mismatch(name: str) -> tuple[bool, bool]:
        pt = PRE_TOKENIZERS[name]
        return pt.ignore_merges != ignore_merges, isinstance(clean, bool) and pt.clean_spaces != clean

    return min(names, key=mismatch)


def vocab_from_tokenizer_json(path: Path, tok_cfg: dict, n_vocab: int) -> Vocab:
    """A Hugging Face ``tokenizer.json`` with a BPE model, with its own special ids
    (read_vocab applies the checkpoint's).

    Byte-fallback BPE (llama/SentencePiece style) becomes a ``llama`` vocabulary
    whose scores rank merges (a token made by merge r scores -r); byte-level BPE
    becomes a ``gpt2`` vocabulary with its merges and pre-tokenizer (bpe_pre_name).
    """
    tj, merges, added_list = read_tokenizer_json(path)
    bpe = tj["model"]
    vocab: dict[str, int] = bpe["vocab"]
    added = {t["content"]: t for t in added_list}
    n = max([*vocab.values(), *(t["id"] for t in added.values())]) + 1
    if n > n_vocab:
        raise ConvertError(f"tokenizer has {n} tokens, config.json vocab_size is {n_vocab}")
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [UNUSED] * n
    for text, i in vocab.items():
        tokens[i], types[i] = text, NORMAL
    for t in added.values():
        tokens[t["id"]], types[t["id"]] = added_token(t["content"], bool(t.get("special")))

    spm_style = bool(bpe.get("byte_fallback")) or "<0x0A>" in vocab
    if not spm_style:
        pre = bpe_pre_name(tj, tok_cfg, path)
        return Vocab("gpt2", pre, tokens, None, types, merges, None, None, None, None,
                     add_bos=PRE_TOKENIZERS[pre].add_bos, add_eos=False, add_space_prefix=None)
    # llama.cpp's SPM tokenizer merges the bigram whose result scores highest,
    # HF's BPE the pair with the lowest merge rank: score = -(first rank making it).
    scores = [0.0] * n
    for rank in range(len(merges) - 1, -1, -1):
        merged = merges[rank].replace(" ", "", 1)
        if merged in vocab:
            scores[vocab[merged]] = -float(rank)
    for i, text in enumerate(tokens):
        if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            types[i] = BYTE
    unk = vocab.get(_token_text(tok_cfg.get("unk_token")) or "<unk>")
    if unk is not None:
        types[unk] = UNKNOWN
    # The "▁" prefix is a Prepend normalizer, or a Metaspace pre-tokenizer
    # that prepends (HF's two spellings of SentencePiece's add_dummy_prefix).
    spec = json.dumps([tj.get("normalizer"), tj.get("pre_tokenizer")])
    prefix = ('"Prepend"' in spec or '"prepend_scheme": "first"' in spec
              or '"prepend_scheme": "always"' in spec or '"add_prefix_space": true' in spec)
    return Vocab("llama", "default", tokens, scores, types, None, vocab.get("<s>"), vocab.get("</s>"),
                 unk, None, add_bos=True, add_eos=False, add_space_prefix=prefix)


def _token_text(entry) -> str | None:
    """tokenizer_config.json's "eos_token" and friends: a text, or {"content": text, ...}."""
    text = entry.get("content") if isinstance(entry, dict) else entry
    return text if isinstance(text, str) else None


def apply_special_tokens(vocab: Vocab, model_dir: Path, tok_cfg: dict) -> None:
    """The checkpoint's special token ids and add_bos / add_eos, over the tokenizer's own.

    First as llama.cpp's converter (gguf.SpecialVocab): an id is tokenizer_config.json's
    ``bos_token`` (...) text among tokenizer.json's added tokens, else config.json's
    ``bos_token_id`` (...); add_bos / add_eos are tokenizer_config.json's
    ``add_bos_token`` / ``add_eos_token``, else what tokenizer.json's post_processor
    template adds. An id that finds none is the text among all tokens (so the tokens of
    added_tokens.json count), else the tokenizer's own. The chat template (one text, or
    a list of named ones) is tokenizer_config.json's, else chat_template.jinja's or
    chat_template.json's, as gguf.SpecialVocab reads it.
    """
    import gguf

    # its warnings (template tokens it cannot place, ids it skips) would break the
    # one-line error output; what it skips is covered by the fallbacks below
    quiet = logging.getLogger("gguf.vocab")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        special = gguf.SpecialVocab(model_dir, n_vocab=len(vocab.tokens))
    except (ValueError, TypeError, AttributeError, KeyError, IndexError) as e:
        raise ConvertError(f"{model_dir}: cannot read the special tokens ({e})") from None
    finally:
        quiet.setLevel(level)
    ids: dict[str, int] = {}
    for i, text in enumerate(vocab.tokens):
        ids.setdefault(text, i)
    for kind in ("bos", "eos", "unk", "pad"):
        tid = special.special_token_ids.get(kind)
        if tid is None:
            tid = ids.get(_token_text(tok_cfg.get(f"{kind}_token")))
        if tid is not None:
            setattr(vocab, f"{kind}_id", tid)
    vocab.add_bos = special.add_special_token.get("bos", vocab.add_bos)
    vocab.add_eos = special.add_special_token.get("eos", vocab.add_eos)
    template = special.chat_template
    if isinstance(template, list) and not all(
            isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("template"), str)
            for c in template):
        raise ConvertError(f"{model_dir}: chat_template: a list must hold "
                           '{"name": text, "template": text} objects')
    vocab.chat_template = template


def read_vocab(model_dir: Path, p: LlamaParams, log=print) -> Vocab:
    """The checkpoint's tokenizer (tokenizer.model, else tokenizer.json), padded with
    [PAD<i>] tokens to config.json's vocab_size, its added tokens and special ids applied."""
    tok_cfg = _tokenizer_config(model_dir)
    if (model_dir / "tokenizer.model").is_file():
        vocab = vocab_from_sentencepiece(model_dir / "tokenizer.model")
        added = sentencepiece_added_tokens(model_dir, tok_cfg)
    elif (model_dir / "tokenizer.json").is_file():
        vocab = vocab_from_tokenizer_json(model_dir / "tokenizer.json", tok_cfg, p.n_vocab)
        added = {}      # tokenizer.json holds its added tokens
    else:
        raise ConvertError(f"{model_dir}: no tokenizer (tokenizer.model or tokenizer.json)")
    if len(vocab.tokens) > p.n_vocab:
        raise ConvertError(f"tokenizer has {len(vocab.tokens)} tokens, config.json vocab_size is {p.n_vocab}")
    for i in range(len(vocab.tokens), p.n_vocab):     # pad to the embedding rows, as llama.cpp does
        vocab.tokens.append(f"[PAD{i}]")
        vocab.types.append(UNUSED)
        if vocab.scores is not None:
            vocab.scores.append(-10000.0)   # llama.cpp's converter's score for these
    for i, (text, kind) in sorted(added.items()):
        if i >= p.n_vocab:      # llama.cpp's converter skips these too
            log(f"warning: added token {text!r} has id {i}, not below vocab_size {p.n_vocab}: skipped")
            continue
        vocab.tokens[i], vocab.types[i], vocab.scores[i] = text, kind, -1000.0
    apply_special_tokens(vocab, model_dir, tok_cfg)
    return vocab
