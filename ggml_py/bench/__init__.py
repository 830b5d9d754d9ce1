"""ggml-bench: benchmarks of ggml_py, one subcommand per module.

    ggml-bench mulmat --types q4_0,f16 --m 1,512 --json

Each subcommand module has `add_arguments(parser)` and `run(args) -> int`;
SUBCOMMANDS maps names to module paths, imported only when chosen.
"""
import argparse
import importlib
import importlib.util
import sys

SUBCOMMANDS = {
    "mulmat": ("ggml_py.bench.mulmat", "MUL_MAT per type, shape, batch size, profile and thread count"),
    "pool": ("ggml_py.bench.pool", "worker pool dispatch and wake-up latency"),
}


def _available():
    """Subcommands whose module is present in this installation."""
    found = {}
    for name, (module, help_text) in SUBCOMMANDS.items():
        if importlib.util.find_spec(module) is not None:
            found[name] = (module, help_text)
    return found


def main(argv=None):
    """Parse `ggml-bench <subcommand> [options]` and run the subcommand; returns its exit code."""
    parser = argparse.ArgumentParser(prog="ggml-bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="subcommand")
    modules = {}
    for name, (module_name, help_text) in _available().items():
        module = importlib.import_module(module_name)
        module.add_arguments(sub.add_parser(name, help=help_text, description=help_text))
        modules[name] = module
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return modules[args.command].run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
