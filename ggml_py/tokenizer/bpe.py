"""Byte-level BPE (``tokenizer.ggml.model = gpt2``): llama.cpp's ``llm_tokenizer_bpe``.

The text is split into words by the vocabulary's pre-tokenizer
(``tokenizer.ggml.pre``), each word's bytes are mapped to GPT-2's printable
characters, and merges are applied by rank, lowest first.
"""

from __future__ import annotations

import heapq

from ggml_py.tokenizer.pretokenize import byte_encode, is_clean, llama_code_points
from ggml_py.tokenizer.vocab import Vocab

# Bound the per-word cache of the byte-level BPE so long-running
# processes do not grow without limit.
WORD_CACHE_LIMIT = 100_000


def tokenize_fragment(vocab: Vocab, text: str, output: list[int], cache: dict[str, list[int]]) -> None:
    """Append the ids of ``text`` (raw text between special tokens) to ``output``.

    ``cache`` maps a pre-tokenized word to its ids, for the words seen before;
    it is emptied when it reaches ``WORD_CACHE_LIMIT`` words.
    """
    if not is_clean(text):
        text = llama_code_points(text)
    for word in vocab._pre_tokenizer.split(text):
        ids = cache.get(word)
        if ids is None:
            ids = _word_ids(vocab, byte_encode(word))
            if len(cache) >= WORD_CACHE_LIMIT:
                cache.clear()
            cache[word] = ids
        output.extend(ids)


def _word_ids(vocab: Vocab, word: str) -> list[int]:
    """llama.cpp's ``llm_tokenizer_bpe`` on one byte-encoded word."""
    token_to_id = vocab._token_to_id
    if vocab.ignore_merges:
        token_id = token_to_id.get(word)
        if token_id is not None:
            return [token_id]
    ids = []
    for symbol in _merge(vocab, word):
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


def _merge(vocab: Vocab, word: str) -> list[str]:
    """Apply merges, lowest rank first (leftmost on ties); return the symbols."""
    symbols = list(word)
    n = len(symbols)
    if n < 2:
        return symbols
    ranks = vocab._merge_ranks
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
