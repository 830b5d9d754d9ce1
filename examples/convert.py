"""Convert a Hugging Face-style llama checkpoint directory to GGUF (same as ``ggml-convert``).

    python examples/convert.py MODEL_DIR [--outfile OUT.gguf] [--outtype f32|f16|bf16]
"""
import sys

from ggml_py.cli.convert import main

if __name__ == "__main__":
    sys.exit(main())
