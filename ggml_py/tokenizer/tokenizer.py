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

:class:`Tokenizer` ties together the modules of this room that do the work:
``vocab`` (the vocabulary, loaded and checked; ``metadata``: the typed reads and
the errors), ``partition`` (special tokens split out of the text), ``spm`` and
``bpe`` (the two algorithms), ``decode`` (pieces, detokenize and
:class:`IncrementalDecoder`) and ``pretokenize`` (the pre-tokenizers, the byte
mapping and the UTF-8 handling). The code is pure Python on the standard library and
the ``regex`` package (its error type derives from ggml_py's
``ModelLoadError``). A path is read with ggml_py's GGUF reader (files/gguf_file.py);
a file open with it (``GGUFFile``), or a ``gguf.GGUFReader``, can be passed in.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

from ggml_py.files.gguf_metadata import tokenizer_fields, read_gguf_metadata
# ggml_py's own package __init__ has imported this already; no extra cost.
from ggml_py.files.gguf_reader import ModelLoadError
from ggml_py.tokenizer import bpe, decode, spm
from ggml_py.tokenizer.decode import IncrementalDecoder
from ggml_py.tokenizer.metadata import TokenizerError, TokenizerWarning
from ggml_py.tokenizer.partition import split_special
# The token types stay importable from here, with the names of __all__.
from ggml_py.tokenizer.vocab import (TOKEN_TYPE_BYTE, TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL,
                                     TOKEN_TYPE_UNDEFINED, TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_UNUSED,
                                     TOKEN_TYPE_USER_DEFINED, Vocab)

__all__ = [
    "Tokenizer",
    "TokenizerError",
    "TokenizerWarning",
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


class Tokenizer(Vocab):
    """A llama.cpp-compatible tokenizer built from GGUF ``tokenizer.*`` metadata.

    Build one with :meth:`from_gguf` (a path, or a file open as a ``GGUFFile`` or a
    ``gguf.GGUFReader``) or
    :meth:`from_metadata` / the constructor (a mapping of metadata keys to
    values, e.g. what a model loader already read). The vocabulary and the
    queries on it (``n_vocab``, ``bos_id``, ``is_eog``, ``token_text``, ...)
    are :class:`~ggml_py.tokenizer.vocab.Vocab`'s.
    """

    def __init__(self, fields: Mapping[str, Any], source: str = "<metadata>") -> None:
        """Build the tokenizer from GGUF metadata ``fields`` (key -> value).

        Values may be plain Python values, numpy arrays or ``gguf.ReaderField``
        objects. ``source`` names the origin (e.g. the file path) in error
        messages. Raises :class:`TokenizerError` (a ``ValueError``) if the
        metadata holds no usable tokenizer or a value of the wrong type.
        """
        super().__init__(fields, source)
        self._word_cache: dict[str, list[int]] = {}   # byte-level BPE: each word's ids

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
        fragments: list[str | int] = split_special(self, text, parse_special) if text else []
        output: list[int] = []
        if add_special and self.add_bos:
            output.append(self.bos_id)
        if self.is_spm:
            spm.tokenize_fragments(self, fragments, output)
        else:
            for fragment in fragments:
                if isinstance(fragment, int):
                    output.append(fragment)
                else:
                    bpe.tokenize_fragment(self, fragment, output, self._word_cache)
        if add_special and self.add_eos:
            output.append(self.eos_id)
        return output

    # -- detokenize ---------------------------------------------------------

    def token_to_piece(self, token_id: int, special: bool = True, lstrip: int = 0) -> bytes:
        """The bytes a token stands for, like llama.cpp's ``llama_token_to_piece``.

        Byte tokens ``<0xNN>`` give the raw byte, SentencePiece ``\u2581``
        becomes a space, byte-level BPE text is mapped back to bytes. Control
        and unknown tokens give their text if ``special`` is true, else
        nothing. Up to ``lstrip`` leading spaces are removed. A piece may be
        part of a multi-byte UTF-8 character.
        """
        return decode.token_to_piece(self, token_id, special, lstrip)

    def detokenize_bytes(self, ids: Iterable[int], remove_special: bool = False,
                         unparse_special: bool = False) -> bytes:
        """Like :meth:`detokenize` but returns the raw UTF-8 bytes."""
        return decode.detokenize_bytes(self, ids, remove_special, unparse_special)

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
