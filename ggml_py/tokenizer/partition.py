"""Special-token partitioning: the special and user-defined tokens split out of text.

llama.cpp's ``tokenizer_st_partition`` (src/llama-vocab.cpp): before any merging,
each special token's text found in the text becomes its id, and only the raw
text between them is tokenized.
"""

from __future__ import annotations

from ggml_py.tokenizer.vocab import ATTR_CONTROL, ATTR_LSTRIP, ATTR_RSTRIP, ATTR_UNKNOWN, Vocab


def split_special(vocab: Vocab, text: str, parse_special: bool) -> list[str | int]:
    """Split ``text`` into raw-text fragments and special-token ids.

    Each special token, longest first, is searched in the remaining text
    fragments; matches become ids. Control and unknown tokens are only
    searched when ``parse_special`` is set.
    """
    fragments: list[str | int] = [text]
    for token_id in vocab._special_tokens:
        attr = vocab._attrs[token_id]
        if not parse_special and attr & (ATTR_CONTROL | ATTR_UNKNOWN):
            continue
        token_text = vocab._tokens[token_id]
        if not any(isinstance(f, str) and token_text in f for f in fragments):
            continue
        split: list[str | int] = []
        for fragment in fragments:
            if isinstance(fragment, str) and token_text in fragment:
                _split_on_token(fragment, token_text, token_id, attr, split)
            else:
                split.append(fragment)
        fragments = split
    return fragments


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
