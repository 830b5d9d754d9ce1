"""Measuring MUL_MAT profiles for mulmat-tune.

For each (N, K, type), M and thread count, every profile the node supports is
run on the real kernels and each task stage is timed separately (the executor's
per-node stage clocks), median over passes.

Sampling keeps a pass short without guessing: when a product is large (many
flops, so compute-bound and cache effects small) it is measured on two row
slices of the weight, r and 2r rows, and each stage's time is extended along
the straight line through them to all N rows. Small products (memory-bound,
where the weight's size matters) are always measured whole.
"""
import time

import numpy as np

import ggml_py as gg
from ggml_py.profiles import STAGES
from ggml_py.tensor import type_traits
from ggml_py.tune import ProfileTimes, ShapeTimes, TuneData

DEFAULT_M_VALUES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
FLOP_BUDGET = 2e8         # flops above which a measurement is sampled on row slices
MIN_SAMPLE_ROWS = 256

MATMUL_TENSORS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")

# llama shapes: n_embd, n_ff, n_vocab, n_embd of the K/V projections (GQA)
PRESETS = {
    "1.1B": (2048, 5632, 32000, 256),
    "7B": (4096, 11008, 32000, 4096),
    "13B": (5120, 13824, 32000, 5120),
}


def preset_shapes(preset, type):
    """The distinct (N, K, type) matrix products of a llama preset."""
    if preset not in PRESETS:
        raise ValueError(f"unknown model shape {preset!r}; presets: {', '.join(PRESETS)}")
    n_embd, n_ff, n_vocab, n_embd_kv = PRESETS[preset]
    pairs = [(n_embd, n_embd), (n_embd_kv, n_embd), (n_ff, n_embd), (n_embd, n_ff), (n_vocab, n_embd)]
    return sorted({(n, k, gg.Type(type)) for n, k in pairs})


def model_shapes(model):
    """(model name, distinct (N, K, type)) of a GGUF model's matrix products.

    model: a path, or an open GGUFModelFile.
    """
    from ggml_py.gguf_model import GGUFModelFile
    f = model if isinstance(model, GGUFModelFile) else GGUFModelFile(model)
    shapes = set()
    for t in f.reader.tensors:
        base = t.name.rsplit(".", 1)[0].split(".")[-1]
        is_output = t.name == "output.weight" or (t.name == "token_embd.weight"
                                                  and not f.has_tensor("output.weight"))
        if len(t.shape) == 2 and (base in MATMUL_TENSORS or is_output):
            k, n = int(t.shape[0]), int(t.shape[1])   # GGUF lists ne order
            shapes.add((n, k, gg.Type(int(t.tensor_type))))
    if not shapes:
        raise ValueError(f"{f.path}: no llama matrix products found")
    return model_name(f), sorted(shapes)


def model_name(f):
    """The name a tune file records for a GGUFModelFile: general.name, else the file name."""
    import os
    return str(f.get("general.name", default=None) or os.path.basename(f.path))


def random_weight(ctx, rng, rows, k, type, distinct_rows=256):
    """A (rows, k) weight of `type`: a few hundred random rows, quantized once and
    repeated (kernel times do not depend on the values, and quantizing every
    row of a large matrix would cost more than benching it)."""
    seed_rows = min(rows, distinct_rows)
    x = rng.standard_normal((seed_rows, k)).astype(np.float32) * 0.1
    weight = ctx.new_tensor(type, (rows, k))
    blocks = gg.quantize(x, type) if type_traits(type)["is_quantized"] else x.astype(
        weight.numpy().dtype)
    data = weight.numpy()
    for start in range(0, rows, seed_rows):
        n = min(seed_rows, rows - start)
        data[start:start + n] = blocks[:n]
    return weight


def row_counts(n, k, m):
    """Weight rows to measure at M=m: [n] (whole), or [r, 2r] to extend to n."""
    if 2 * n * k * m <= FLOP_BUDGET or n < 4 * MIN_SAMPLE_ROWS:
        return [n]
    r = max(MIN_SAMPLE_ROWS, min(int(FLOP_BUDGET / (6 * k * m)), n // 2))
    return [r, 2 * r]


class ShapeBench:
    """Graphs for one (N, K, type): mul_mat of row slices of one weight by M rows."""

    def __init__(self, n, k, type, m_values, rng):
        self.n, self.k, self.type = n, k, gg.Type(type)
        self.rows = {m: row_counts(n, k, m) for m in m_values}
        self.max_rows = max(max(r) for r in self.rows.values())
        m_max = max(m_values)
        size = (gg.row_bytes(self.type, k) * self.max_rows + 4 * k * m_max
                + 4 * self.max_rows * m_max * 4)
        self.ctx = gg.Context(mem_size=size + (16 << 20))
        self.weight = random_weight(self.ctx, rng, self.max_rows, k, self.type)
        self.acts = self.ctx.from_numpy(rng.standard_normal((m_max, k)).astype(np.float32))
        self.graphs = {}

    def graph(self, rows, m, max_threads=1):
        """The graph of (first `rows` rows of the weight) x (first m activation rows),
        its work buffer reserved (allocated and paged in) for every profile."""
        key = (rows, m)
        if key not in self.graphs:
            w = gg.view(self.weight, (rows, self.k)) if rows != self.max_rows else self.weight
            b = gg.view(self.acts, (m, self.k))
            graph = gg.build_forward(gg.mul_mat(w, b))
            node = graph.nodes[-1]
            for profile in node.profiles():
                node.profile = profile
                graph.reserve(max_threads)
            self.graphs[key] = graph
        return self.graphs[key]


MIN_CASE_SECONDS = 0.004  # cheap cases repeat until they have run this long ...
MAX_RUNS = 16             # ... up to this many times


def time_stages(graph, profile, pool, passes):
    """{stage: µs} of the graph's mul_mat under `profile` (work buffer reserved).

    Each stage keeps its fastest run: other work on the machine only ever adds
    time. At least `passes` runs; cheap cases run more (up to MAX_RUNS, for
    MIN_CASE_SECONDS), so one interruption cannot mislead a choice.
    """
    node = graph.nodes[-1]   # the mul_mat (views of the operands come first)
    node.profile = profile
    samples = {s: [] for s in STAGES}
    start = time.perf_counter()
    runs = 0
    while runs < passes or (runs < MAX_RUNS and time.perf_counter() - start < MIN_CASE_SECONDS):
        graph.reset_stats()
        graph.compute(pool=pool, profile=True)
        row = graph.stats()[-1]
        for s, v in zip(STAGES, (row.init_us, row.compute_us, row.finalize_us)):
            samples[s].append(v)
        runs += 1
    return {s: min(v) for s, v in samples.items() if profile.stages[STAGES.index(s)].valid}


def extend_to_rows(n, rows, times):
    """Each stage's time at n rows from times at 1 or 2 row counts (straight line)."""
    if len(rows) == 1:
        return times[0]
    (r1, r2), (t1, t2) = rows, times
    return {s: max(0.0, t1[s] + (t2[s] - t1[s]) * (n - r1) / (r2 - r1)) for s in t1}


def bench(shapes, model="", m_values=None, thread_counts=(1, 2), passes=1, seed=0, progress=None):
    """Bench every profile of every shape; returns TuneData.

    progress: a callable(n_steps) returning a context manager with update(),
    e.g. tqdm (None: silent).
    """
    m_values = sorted(set(m_values or DEFAULT_M_VALUES))
    rng = np.random.default_rng(seed)
    data = TuneData(model=model, m_values=m_values, thread_counts=list(thread_counts))
    pools = {t: gg.ThreadPool(t) for t in thread_counts}
    try:
        steps = len(shapes) * len(m_values)
        bar = progress(steps) if progress else None
        for n, k, type in shapes:
            data.shapes.append(bench_shape(n, k, type, m_values, pools, passes, rng, bar))
        if bar is not None:
            bar.close()
    finally:
        for pool in pools.values():
            pool.close()
    return data


def bench_shape(n, k, type, m_values, pools, passes, rng, bar=None):
    """ShapeTimes of one (N, K, type)."""
    sb = ShapeBench(n, k, type, m_values, rng)
    max_threads = max(pools)
    profiles = sb.graph(sb.rows[m_values[0]][-1], m_values[0], max_threads).nodes[-1].profiles()
    shape = ShapeTimes(n, k, sb.type, [ProfileTimes(p) for p in profiles])
    for m in m_values:
        rows = sb.rows[m]
        for pt in shape.profiles:
            for t, pool in pools.items():
                times = [time_stages(sb.graph(r, m, max_threads), pt.profile, pool, passes)
                         for r in rows]
                per_stage = pt.times_us.setdefault(t, {})
                for s, v in extend_to_rows(n, rows, times).items():
                    per_stage.setdefault(s, []).append(v)
        if bar is not None:
            bar.update(1)
    for pt in shape.profiles:
        for per_stage in pt.times_us.values():
            for s, values in per_stage.items():
                per_stage[s] = monotone_in_m(values)
    return shape


def monotone_in_m(values):
    """Each stage's time cannot fall as M grows, and other work on the machine
    only adds time: a time above a later (larger-M) one was inflated, so every
    entry becomes the least of itself and all that follow."""
    out = [float(v) for v in values]
    for i in range(len(out) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1])
    return out
