"""python -m ggml_py.cli.bench: the same as the ggml-bench command."""
import sys

from ggml_py.cli.bench import main

sys.exit(main())
