"""ggml-tune: bench MUL_MAT profiles for a model's matrix shapes, and analyze
or plot a tune file.

    ggml-tune -m model.gguf -o tune.json            # shapes and types from the model
    ggml-tune -o tune.json                          # the bundled model's
    ggml-tune --model-shape 1.1B --type Q4_0 -o tune.json --n-threads 1,2 --m-max 9
    ggml-tune analyze tune.json [--plot tune.png]
"""
import argparse
import os
import sys
import time

import ggml_py as gg
from ggml_py.cli.common import (
    ArgumentParser,
    console_script,
    file_name,
    run,
    thread_list,
    weight_type,
)
from ggml_py.core import graph
from ggml_py.files.gguf_reader import GGUFModelFile
from ggml_py.files.output import OutputPathError, atomic_output, check_output_path
from ggml_py.model.config import LlamaConfig
from ggml_py.model.bundled import default_model_path
from ggml_py.model.weights import matrix_shapes
from ggml_py.tune import data as tune
from ggml_py.tune.attention import bench_attention
from ggml_py.tune.bench import PRESETS, bench, preset_shapes

# the attention shapes of the presets: head size, heads, KV heads
PRESET_ATTENTION = {"1.1B": (64, 32, 4), "7B": (128, 32, 32), "13B": (128, 40, 40)}
KV_TYPES = {"f32": gg.Type.F32, "f16": gg.Type.F16, "q8_0": gg.Type.Q8_0, "q4_0": gg.Type.Q4_0,
            "int8": gg.Type.I8}


def kv_type_list(text):
    """--kv-types: comma-separated KV cache types (-ctk's names), or 'none'."""
    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    if names == ["none"]:
        return []
    bad = [n for n in names if n not in KV_TYPES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"expected types among {', '.join(KV_TYPES)} or none, "
                                         f"got {text!r}")
    return [KV_TYPES[n] for n in names]


def parse_threads(text):
    """--n-threads: comma-separated thread counts (1 .. 256), sorted, each once."""
    return sorted(set(thread_list(text)))


def default_thread_counts():
    """1, 2 and the count ggml-main and ggml-perplexity run at by default (the
    physical cores), so that a file benched with the defaults serves their runs."""
    return sorted({1, 2, graph.default_threads()})


def bench_parser():
    """The flags of a bench run (`ggml-tune analyze` has its own parser)."""
    p = ArgumentParser(prog="ggml-tune", description="Bench MUL_MAT task profiles per "
                                "shape, M and thread count, and the attention op's profiles "
                                "per KV type and context length; write a tune file. "
                                "'ggml-tune analyze FILE' reads one.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("-m", "--model", type=file_name,
                     help="GGUF model: bench its matrix shapes and weight types (default, "
                          "without --model-shape: the bundled Shakespeare model)")
    src.add_argument("--model-shape", choices=sorted(PRESETS), help="llama shape preset")
    p.add_argument("--type", type=weight_type,
                   help="weight type with --model-shape (default Q4_0; a model has its own)")
    p.add_argument("--n-threads", type=parse_threads, default=None,
                   help="e.g. 1,2,4 (default 1, 2 and the count ggml-main runs at: "
                        f"the physical cores, {graph.default_threads()} here)")
    p.add_argument("--m-max", type=int, default=9, help="M runs over 2^0 .. 2^m-max (default 9: 512)")
    p.add_argument("--passes", type=int, default=1,
                   help="sweeps over all the shapes, one after another; each stage keeps "
                        "its fastest (default 1)")
    p.add_argument("--kv-types", type=kv_type_list, default=[gg.Type.F16],
                   help="KV cache types whose attention (slim, flash) is benched too, at the "
                        "model's head shape (default f16; none: no attention)")
    p.add_argument("-o", "--file", required=True, type=file_name, help="tune file to write (JSON)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return p


def tqdm_progress(total):
    """A tqdm bar (on stderr) of `total` (shape, M) steps, for bench's progress."""
    from tqdm import tqdm
    return tqdm(total=total, unit="shape-M", desc="mulmat-tune", disable=None)   # (none in a file)


def run_bench(args):
    """Bench the shapes of -m or --model-shape, save the tune file; exit status 0."""
    if args.model is None and args.model_shape is None:    # as ggml-main: the bundled model
        args.model = default_model_path()
    tune.check_writable(args.file, not_over=args.model)
    if args.model:
        model_file = GGUFModelFile(args.model)
        name, shapes = matrix_shapes(model_file)
        c = LlamaConfig.from_gguf(model_file)
        heads = (c.head_dim, c.n_head, c.n_head_kv)
    else:
        type = gg.Type.Q4_0 if args.type is None else args.type
        name, shapes = f"llama-{args.model_shape}-{type.name}", preset_shapes(args.model_shape, type)
        heads = PRESET_ATTENTION[args.model_shape]
    attention_shapes = [heads + (t, t) for t in args.kv_types
                        if not (t in (gg.Type.Q8_0, gg.Type.Q4_0) and heads[0] % 32)]
    m_values = [2 ** i for i in range(args.m_max + 1)]
    if args.n_threads is None:
        args.n_threads = default_thread_counts()
    start = time.perf_counter()
    data = bench(shapes, model=name, m_values=m_values, thread_counts=args.n_threads,
                 passes=args.passes, progress=None if args.quiet else tqdm_progress)
    data.attention = bench_attention(attention_shapes, args.n_threads)
    data.save(args.file)
    passes = f", {args.passes} passes" if args.passes > 1 else ""
    print(f"ggml-tune: {len(shapes)} shapes x {len(m_values)} M x threads {args.n_threads}{passes} in "
          f"{time.perf_counter() - start:.1f} s -> {args.file}")
    return 0


def winners(data, shape, n_threads):
    """[(M, {profile name: total µs}, best name)] for one shape and thread count."""
    rows = []
    for i, m in enumerate(data.m_values):
        totals = {}
        for p in shape.profiles:
            per = p.times_us.get(n_threads)
            if per is not None:
                totals[p.profile.name] = sum(v[i] for v in per.values())
        if totals:
            rows.append((m, totals, min(totals, key=totals.get)))
    return rows


def analyze(data, out=None):
    """Print, per shape and thread count, a CSV block of totals per M and the crossovers."""
    out = out or sys.stdout
    for shape in data.shapes:
        for t in data.thread_counts:
            rows = winners(data, shape, t)
            if not rows:
                continue
            names = list(rows[0][1])
            print(f"# N={shape.n} K={shape.k} type={shape.type.name} n_threads={t}", file=out)
            print("M," + ",".join(f"{n}_us" for n in names) + ",best", file=out)
            for m, totals, best in rows:
                print(f"{m}," + ",".join(f"{totals[n]:.1f}" for n in names) + f",{best}", file=out)
            for (m0, _, b0), (m1, _, b1) in zip(rows, rows[1:]):
                if b0 != b1:
                    print(f"# crossover: {b0} -> {b1} between M={m0} and M={m1}", file=out)
            print(file=out)


def plot_path(path, inputs=None):
    """Where --plot PATH draws: PATH, with .png added when it names no format (a
    name ending in "." gets "png"); checked before anything is printed: a format
    matplotlib can write, at a path files.output's rules let it write (not `inputs`)."""
    if not path:
        raise ValueError("--plot needs a file name")
    ext = os.path.splitext(path)[1]
    if ext in ("", ".") and not os.path.isdir(path):
        path, ext = path.rstrip(".") + ".png", ".png"
    try:
        check_output_path(path, inputs)
    except OutputPathError as exc:
        raise ValueError(f"--plot {exc}") from None
    formats = _plot_formats()
    if ext[1:].lower() not in formats:
        raise ValueError(f"--plot {path}: matplotlib cannot write {ext!r} files; "
                         f"one of {', '.join(sorted(formats))}")
    _check_can_draw(path, ext[1:].lower())
    return path


def _agg_matplotlib():
    """matplotlib, its Agg (file) backend chosen; ValueError when it is not installed."""
    try:
        import matplotlib
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install 'ggml_py[plot]'") from None
    matplotlib.use("Agg")
    return matplotlib


def _plot_formats():
    """The file extensions matplotlib's Agg figures can be saved as (png, pdf, svg, ...)."""
    _agg_matplotlib()
    from matplotlib.figure import Figure
    return set(Figure().canvas.get_supported_filetypes())


def _check_can_draw(path, format):
    """ValueError unless matplotlib draws a figure with a word on it as `format` here
    (pgf needs LaTeX: a format it names may still need a program this machine lacks)."""
    import io

    from matplotlib.figure import Figure
    figure = Figure(figsize=(1, 1))
    figure.text(0.5, 0.5, "M")
    try:
        figure.savefig(io.BytesIO(), format=format)
    except Exception as exc:   # matplotlib's backends raise what their tools give
        raise ValueError(f"--plot {path}: matplotlib cannot draw {format} here "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None


def plot(data, path):
    """Time vs M per profile and thread count (log axes), one panel per shape."""
    _agg_matplotlib()
    import matplotlib.pyplot as plt
    n = len(data.shapes)
    cols = min(n, 3)
    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(5 * cols, 4 * ((n + cols - 1) // cols)),
                             squeeze=False)
    for ax, shape in zip(axes.flat, data.shapes):
        for p in shape.profiles:
            for t, per in sorted(p.times_us.items()):
                total = [sum(v[i] for v in per.values()) for i in range(len(data.m_values))]
                ax.plot(data.m_values, [x / 1e3 for x in total], marker="o", markersize=3,
                        label=f"{p.profile.name} nth={t}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{shape.n}x{shape.k} {shape.type.name}")
        ax.set_xlabel("M")
        ax.set_ylabel("ms")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(f"mulmat-tune: {data.model}")
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=100, format=os.path.splitext(path)[1][1:].lower())


def run_analyze(argv):
    """`ggml-tune analyze FILE [--plot PNG]`: the CSV blocks, and the picture."""
    p = ArgumentParser(prog="ggml-tune analyze",
                                description="Per shape and thread count: the fastest profile at "
                                            "each M and the crossover points, as CSV blocks.")
    p.add_argument("file")
    p.add_argument("--plot", metavar="PNG", help="also draw time vs M per profile (matplotlib)")
    args = p.parse_args(argv)
    path = plot_path(args.plot, inputs={args.file: "the tune file being read"}) if args.plot is not None else None
    data = tune.load(args.file, check_system=False)
    analyze(data)
    if path is not None:
        plot(data, path)
        print(f"plot -> {path}")
    return 0


def analyze_or_bench(argv):
    """`analyze FILE ...` or a bench run, by the first argument."""
    if argv[:1] == ["analyze"]:
        return run_analyze(argv[1:])
    parser = bench_parser()
    args = parser.parse_args(argv)
    if args.model_shape is None and args.type is not None:    # -m, or the bundled model
        parser.error("--type goes with --model-shape; a model's weights have their own")
    if not 1 <= args.m_max <= 12:
        parser.error("--m-max must be in 1..12 (two Ms or more: estimates interpolate between them)")
    if args.passes < 1:
        parser.error("--passes must be >= 1")
    return run_bench(args)


@console_script
def main(argv=None):
    """Entry point of the ggml-tune console script; a bad file or input (a
    TuneFileError is a ValueError) ends in one line and exit 1."""
    argv = sys.argv[1:] if argv is None else argv
    return run("ggml-tune", analyze_or_bench, argv)


if __name__ == "__main__":
    sys.exit(main())
