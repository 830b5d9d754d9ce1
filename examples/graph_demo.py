"""A first look at ggml_py: build a small graph, plan it, compute it on a thread
pool, check it against numpy and print where the time went.

    python examples/graph_demo.py [--threads 2]
"""
import time

import numpy as np

import ggml_py as gg
from ggml_py.cli.common import ArgumentParser, positive_int, thread_count


def build_mlp(ctx, rng, batch, width, depth):
    """depth layers of rms_norm -> mul_mat -> swiglu gate; returns (input, output, weights)."""
    x = ctx.new_tensor(gg.F32, (batch, width), name="x")
    weights, h = [], x
    for i in range(depth):
        w_up = ctx.from_numpy((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32),
                              name=f"w_up.{i}")
        w_gate = ctx.from_numpy((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32),
                                name=f"w_gate.{i}")
        n = gg.rms_norm(h, eps=1e-6)
        h = gg.add(h, gg.swiglu(gg.mul_mat(w_gate, n), gg.mul_mat(w_up, n)))
        weights.append((w_up.numpy(), w_gate.numpy()))
    y = gg.soft_max(h, scale=0.5)
    y.name = "probs"
    return x, y, weights


def numpy_reference(x, weights):
    h = x.astype(np.float64)
    for w_up, w_gate in weights:
        n = h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-6)
        g, u = n @ w_gate.T, n @ w_up.T
        h = h + g / (1 + np.exp(-g)) * u
    z = h * 0.5
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def main(argv=None):
    parser = ArgumentParser(prog="graph_demo.py", description=__doc__.splitlines()[0])
    parser.add_argument("-t", "--threads", type=thread_count, default=gg.default_threads())
    parser.add_argument("--width", type=positive_int, default=512)
    parser.add_argument("--depth", type=positive_int, default=4)
    parser.add_argument("--batch", type=positive_int, default=32)
    args = parser.parse_args(argv)

    print(gg.system_info())
    rng = np.random.default_rng(0)
    ctx = gg.Context(mem_size=64 << 20)
    x, y, weights = build_mlp(ctx, rng, args.batch, args.width, args.depth)
    graph = gg.build_forward(y)
    print(graph.plan(args.threads))

    x.numpy()[:] = rng.standard_normal((args.batch, args.width)).astype(np.float32)
    with gg.ThreadPool(args.threads) as pool:
        graph.compute(pool=pool)                      # warm-up
        start = time.perf_counter()
        graph.compute(pool=pool, profile=True)
        elapsed = time.perf_counter() - start
    err = np.abs(y.numpy() - numpy_reference(x.numpy(), weights)).max()
    print(f"\ncomputed {len(graph)} nodes in {1e3 * elapsed:.2f} ms on {args.threads} threads; "
          f"max |ggml_py - numpy float64| = {err:.2e}")
    print(graph.stats())
    return 0 if err < 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
