"""Tools that make model files: a Hugging Face checkpoint to GGUF, re-typing (quantizing) a GGUF, random test models."""
