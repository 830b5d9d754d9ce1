"""Text to token ids and back, exactly as llama.cpp: SentencePiece and byte-level BPE vocabularies."""
from ggml_py.tokenizer.tokenizer import (IncrementalDecoder, Tokenizer, TokenizerError,
                                        TokenizerWarning)

__all__ = ["IncrementalDecoder", "Tokenizer", "TokenizerError", "TokenizerWarning"]
