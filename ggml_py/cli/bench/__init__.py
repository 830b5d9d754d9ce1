"""ggml-bench: benchmarks of ggml_py that print figures as ratios to yardsticks
measured in the same run, one subcommand per module.

    ggml-bench pool
    ggml-bench mulmat --types q4_0,f16 --m 1,512 --json

Each subcommand module has `add_arguments(parser)` and `run(args) -> int`;
SUBCOMMANDS maps names to module paths.
"""
import importlib
import sys

from ggml_py.cli.common import ArgumentParser, console_script, run

SUBCOMMANDS = {
    "mulmat": ("ggml_py.cli.bench.mulmat", "MUL_MAT per type, shape, batch size, profile and thread count"),
    "pool": ("ggml_py.cli.bench.pool", "per-node dispatch overhead and idle cost of the worker pool"),
    "model": ("ggml_py.cli.bench.model", "llama-bench-style prompt (pp) and generation (tg) tokens/s"),
    "batch": ("ggml_py.cli.bench.batch", "many sequences per step: aggregate decode tokens/s per batch size"),
    "attn": ("ggml_py.cli.bench.attn", "time per attention layer against context length, per profile and KV type"),
}


@console_script
def main(argv=None):
    """Parse `ggml-bench <subcommand> [options]` and run the subcommand; returns its exit code."""
    parser = ArgumentParser(prog="ggml-bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="subcommand", required=True)
    modules = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        module.add_arguments(sub.add_parser(name, help=help_text, description=help_text))
        modules[name] = module
    first = (sys.argv[1:] if argv is None else argv)[:1]
    if first and first[0].startswith("-") and first[0] not in ("-h", "--help"):
        # (argparse would only say that a subcommand is required)
        parser.error(f"unrecognized argument {first[0]}: the subcommand comes first "
                     f"({', '.join(SUBCOMMANDS)})")
    args = parser.parse_args(argv)
    # a bad flag ends in one line and status 2 (argparse); a bad file or model in
    # one line and status 1; Ctrl-C in status 130
    return run("ggml-bench", modules[args.command].run, args) or 0
