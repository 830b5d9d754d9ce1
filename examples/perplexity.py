"""Perplexity of a text file, by llama.cpp's method: the ggml-perplexity program.

    python examples/perplexity.py -m model.gguf -f wiki.test.raw -c 512

See `ggml_py/cli/perplexity.py` and `docs/llama.md`.
"""
import sys

from ggml_py.cli.perplexity import cli

if __name__ == "__main__":
    sys.exit(cli())
