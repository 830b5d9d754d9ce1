"""Token ids back to text: llama.cpp's ``llama_token_to_piece`` and ``llama_detokenize``.

A token's piece is bytes (a byte token's one byte, SentencePiece's ``\u2581`` a
space, byte-level BPE text mapped back to bytes); pieces are joined before the
UTF-8 decoding, and byte-level vocabularies get llama.cpp's ``clean_spaces``
edits. :class:`IncrementalDecoder` gives the same text one id at a time.
"""

from __future__ import annotations

import codecs
from typing import Iterable

from ggml_py.tokenizer.pretokenize import byte_decode, clean_spaces
from ggml_py.tokenizer.vocab import (ATTR_BYTE, ATTR_CONTROL, ATTR_NORMAL, ATTR_UNKNOWN,
                                     ATTR_USER_DEFINED, SPACE_ESCAPE, Vocab)

# Tokens rendered by detokenize only when unparse_special is set.
_ATTR_SPECIAL = ATTR_UNKNOWN | ATTR_CONTROL


def token_to_piece(vocab: Vocab, token_id: int, special: bool = True, lstrip: int = 0) -> bytes:
    """The bytes of token ``token_id``: see ``Tokenizer.token_to_piece``."""
    token_id = vocab.checked_id(token_id)
    if not special and vocab._attrs[token_id] & _ATTR_SPECIAL:
        return b""
    piece = vocab._pieces[token_id]
    if piece is None:
        piece = vocab._pieces[token_id] = _render_piece(vocab, token_id)
    while lstrip > 0 and piece[:1] == b" ":
        piece = piece[1:]
        lstrip -= 1
    return piece


def _render_piece(vocab: Vocab, token_id: int) -> bytes:
    attr = vocab._attrs[token_id]
    text = vocab._tokens[token_id]
    if attr & (_ATTR_SPECIAL | ATTR_USER_DEFINED):
        return text.encode("utf-8", "surrogateescape")
    if attr & ATTR_NORMAL:
        if vocab.is_spm:
            return text.replace(SPACE_ESCAPE, " ").encode("utf-8", "surrogateescape")
        return byte_decode(text)
    if attr & ATTR_BYTE:
        return bytes([int(text[3:5], 16)])     # "<0xHH>", checked at load
    return b""  # unused / undefined tokens render as nothing


def detokenize_bytes(vocab: Vocab, ids: Iterable[int], remove_special: bool = False,
                     unparse_special: bool = False) -> bytes:
    """The bytes of ``ids`` joined: see ``Tokenizer.detokenize``."""
    ids = list(ids)
    # The space SentencePiece put in front of the text is taken off again,
    # unless a BOS token is being removed (llama.cpp does exactly this).
    remove_space = vocab.add_space_prefix
    if remove_special and vocab.add_bos and ids and ids[0] == vocab.bos_id:
        remove_space = False
        ids = ids[1:]
    if remove_special and vocab.add_eos and ids and ids[-1] == vocab.eos_id:
        ids = ids[:-1]
    pieces = []
    for token_id in ids:
        pieces.append(token_to_piece(vocab, token_id, unparse_special, 1 if remove_space else 0))
        remove_space = False
    text = b"".join(pieces)
    return clean_spaces(text) if vocab.clean_spaces else text


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

    def __init__(self, tokenizer: Vocab, *, remove_special: bool = False,
                 unparse_special: bool = False, strip_leading_space: bool | None = None) -> None:
        """Start decoding a new sequence of ids with ``tokenizer`` (a ``Tokenizer``; any
        ``Vocab`` will do)."""
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
        self._pending += token_to_piece(self._tokenizer, token_id, self._unparse_special, lstrip)

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
            if data[cut - 1] == 0x20:
                # A cut right after a space is never final: step over the whole run
                # of spaces at once (one at a time made a long run quadratic).
                cut = len(data[:cut].rstrip(b" "))
                continue
            space = data.rfind(b" ", 0, cut)
            if space < 0:
                return cut - offset
            after = data[space + 1:cut]
            if len(after) >= 3 or (after and b"'" not in data[max(space - 3, 0):cut]):
                return cut - offset
            cut = space
        return 0
