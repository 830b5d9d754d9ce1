"""python -m ggml_py.bench: the same as the ggml-bench command."""
import sys

from ggml_py.bench import main

sys.exit(main())
