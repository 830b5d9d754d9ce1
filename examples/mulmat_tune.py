"""Bench MUL_MAT task profiles and write a tune file: the ggml-tune program.

    python examples/mulmat_tune.py -m model.gguf -o tune.json           # this model's shapes
    python examples/mulmat_tune.py --model-shape 7B --type Q4_0 --n-threads 1,2,4 -o 7b.json
    python examples/mulmat_tune.py analyze tune.json --plot tune.png    # winners, crossovers

Then `ggml-main -m model.gguf --tune-file tune.json` schedules with it. How a pass
measures is in `ggml_py/tune/bench.py`; the file, the estimates and the checks a
file must pass in `ggml_py/tune/data.py`; the flags in `ggml_py/cli/tune.py`; all of it
in `docs/tune.md`.
"""
import sys

from ggml_py.cli.tune import main

if __name__ == "__main__":
    sys.exit(main())
