"""Files on disk: reading GGUF headers and metadata, writing GGUF files, and the rules every output follows."""
