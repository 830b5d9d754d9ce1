"""SentencePiece BPE (``tokenizer.ggml.model = llama``): llama.cpp's ``llm_tokenizer_spm``.

Spaces are escaped as ``\u2581`` (with a space put in front of the text where
``add_space_prefix`` asks for it), then the adjacent pair whose merge is the
best-scoring token is merged first; what is left without a token falls back to
the byte tokens ``<0xNN>``.
"""

from __future__ import annotations

import heapq

from ggml_py.tokenizer.pretokenize import is_clean, text_bytes, utf8_symbol_lengths
from ggml_py.tokenizer.vocab import SPACE_ESCAPE, Vocab


def tokenize_fragments(vocab: Vocab, fragments: list[str | int], output: list[int]) -> None:
    """Append the ids of ``fragments`` (raw texts and special-token ids, as
    ``partition.split_special`` gives them) to ``output``."""
    # A space is prefixed to text at the start and after a special token,
    # as SentencePiece does for the start of a sentence.
    prev_is_special = True
    for fragment in fragments:
        if isinstance(fragment, int):
            output.append(fragment)
            prev_is_special = True
            continue
        if vocab.add_space_prefix and prev_is_special:
            fragment = " " + fragment
        _tokenize_text(vocab, fragment.replace(" ", SPACE_ESCAPE), output)
        prev_is_special = False


def _tokenize_text(vocab: Vocab, text: str, output: list[int]) -> None:
    """llama.cpp's ``llm_tokenizer_spm``: merge the best-scoring adjacent pair first.

    llama.cpp starts from one symbol per UTF-8 sequence, its length read
    from the lead byte alone. For valid text that is one symbol per
    character. Text with invalid UTF-8 (surrogate escapes) is worked on
    as bytes, one character per byte (latin-1), so that a stray lead
    byte takes the bytes after it into its symbol exactly as in llama.cpp.
    """
    if is_clean(text):
        _merge(vocab, text, None, vocab._token_to_id.get, "utf-8", output)
        return
    data = text_bytes(text)
    token_to_id = vocab._token_to_id

    def lookup(piece: str) -> int | None:
        return token_to_id.get(piece.encode("latin-1").decode("utf-8", "surrogateescape"))

    _merge(vocab, data.decode("latin-1"), utf8_symbol_lengths(data), lookup, "latin-1", output)


def _merge(vocab: Vocab, text: str, lengths: list[int] | None, lookup, encoding: str,
           output: list[int]) -> None:
    """The merges of :func:`_tokenize_text` on ``text``.

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
    scores = vocab._scores
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
            output.extend(_byte_token(vocab, b) for b in piece.encode(encoding))
        i = next_sym[i]


def _byte_token(vocab: Vocab, byte: int) -> int:
    token_id = vocab._byte_tokens[byte]
    if token_id is None:
        # llama.cpp fails here; a vocabulary without byte tokens is
        # better served by its unknown token.
        if vocab.unk_id is None:
            raise ValueError(f"{vocab.source}: no byte-fallback token for byte 0x{byte:02X}")
        return vocab.unk_id
    return token_id
