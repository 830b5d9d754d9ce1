"""Generate text from a prompt: the ggml-main program.

    python examples/main.py -m model.gguf -p "Once upon a time" -n 64 --temp 0.8 -s 1

See `ggml_py/cli/main.py` for the flags (llama.cpp's names) and `docs/llama.md`.
"""
import sys

from ggml_py.cli.main import cli

if __name__ == "__main__":
    sys.exit(cli())
