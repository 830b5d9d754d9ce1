"""`ggml-bench`: benchmarks that print figures as ratios to yardsticks measured
in the same run. Each subcommand is a module with add_arguments(parser) and
run(args)."""
import importlib
import sys

from ggml_py.cli.common import ArgumentParser

SUBCOMMANDS = {
    "pool": ("ggml_py.bench.pool", "per-node dispatch overhead and idle cost of the worker pool"),
    "model": ("ggml_py.bench.model", "llama-bench-style prompt (pp) and generation (tg) tokens/s"),
}


def main(argv=None):
    """Entry point of the ggml-bench console script."""
    parser = ArgumentParser(prog="ggml-bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        module.add_arguments(sub.add_parser(name, help=help_text, description=help_text))
        modules[name] = module
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return modules[args.command].run(args) or 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
