"""Measuring MUL_MAT profiles for mulmat-tune.

For each (N, K, type), M and thread count, every profile the node supports is
run on the real kernels and each task stage is timed separately (the executor's
per-node stage clocks), the fastest of the passes.

Sampling keeps a pass short without guessing. A large product is measured on
two row slices of the weight: a few rows, which time what does not depend on N
(converting the activations, calls and thread wake-ups), and a large slice;
each stage's time is extended along the straight line through the two points to
all N rows. (Two large slices close together would not do: the noise of their
difference is multiplied by N over their distance.) The large slice is at least
an eighth of the weight (narrower ones misjudge BLAS), and where the product
is memory-bound (fewer than COMPUTE_BOUND flops per byte the profile streams: the
weight's row, plus its de-quantized copy for the BLAS profiles) at least twice
the last-level cache in those bytes: a slice that fits in the cache runs faster
per row than the whole weight. When the slice would be more than half the
weight, the product is measured whole.

Profiles are measured in turn, pass after pass (not one profile's passes in a
row), so that a slow spell on the machine does not fall on one profile only.
"""
import time

import numpy as np

import ggml_py as gg
from ggml_py.profiles import STAGES
from ggml_py.tensor import type_traits
from ggml_py.tune import ProfileTimes, ShapeTimes, TuneData

DEFAULT_M_VALUES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
FLOP_BUDGET = 2e8         # products of fewer flops are measured whole
COMPUTE_BOUND = 32        # flops per streamed byte from which a product is compute-bound
FEW_ROWS = 32             # the small slice
MIN_SAMPLE_ROWS = 1024    # the large slice: this many rows or N/8 (fewer misjudge BLAS) ...
MAX_SAMPLE_FRACTION = 0.5  # ... and at most this much of the weight, else it is measured whole

# With one thread these profiles run exactly blas's code (the same
# de-quantization, the same single-threaded sgemm on the calling thread), so
# there they are benched, and chosen, only as blas.
SAME_AS_BLAS_ON_ONE_THREAD = ("blas-split", "blas-mt")

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


def last_level_cache_bytes():
    """The size of the CPU's last-level cache (sysfs); 32 MiB when unknown."""
    import glob
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            text = open(path).read().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=32 << 20)


def row_counts(n, k, m, bytes_per_row, cache_bytes):
    """Weight rows to measure at M=m: [n] (whole), or [few, large] to extend to n.

    bytes_per_row: what one weight row costs the profile in memory (its
    stored row, plus a de-quantized copy where the profile makes one).
    """
    if 2 * n * k * m <= FLOP_BUDGET:
        return [n]
    large = max(MIN_SAMPLE_ROWS, n // 8)
    if 2 * k * m < COMPUTE_BOUND * bytes_per_row:
        large = max(large, -(-2 * cache_bytes // bytes_per_row))
    if large > MAX_SAMPLE_FRACTION * n:
        return [n]
    return [FEW_ROWS, large]


def distinct_profiles(profiles, n_threads):
    """The profiles worth benching at n_threads.

    With one thread blas-split and blas-mt are blas (SAME_AS_BLAS_ON_ONE_THREAD).
    With more, blas still runs on one thread while blas-split does the same
    work with the de-quantization shared out, so blas is left out where
    blas-split exists (quantized and F16 weights).
    """
    names = {p.name for p in profiles}
    if n_threads == 1:
        return [p for p in profiles if p.name not in SAME_AS_BLAS_ON_ONE_THREAD]
    return [p for p in profiles if not (p.name == "blas" and "blas-split" in names)]


class ShapeBench:
    """Graphs for one (N, K, type): mul_mat of row slices of one weight by M rows."""

    def __init__(self, n, k, type, m_values, rng, max_threads):
        self.n, self.k, self.type, self.max_threads = n, k, gg.Type(type), max_threads
        m_max = max(m_values)
        size = gg.row_bytes(self.type, k) * n + 4 * k * m_max + 4 * 4 * n * m_max
        self.ctx = gg.Context(mem_size=size + (16 << 20))
        self.weight = random_weight(self.ctx, rng, n, k, self.type)
        self.acts = self.ctx.from_numpy(rng.standard_normal((m_max, k)).astype(np.float32))
        self.graphs = {}
        self.first_graph = None
        whole = self.graph(n, m_values[0]).nodes[-1]   # the largest work buffer
        self.profiles = whole.profiles()
        self.bytes_per_row = {}
        for p in self.profiles:
            whole.profile = p
            self.bytes_per_row[p.name] = gg.row_bytes(self.type, k) + whole._work_size(max_threads) // n
        self.cache_bytes = last_level_cache_bytes()

    def rows(self, m, profile):
        """Weight rows to measure `profile` on at M=m (see row_counts)."""
        return row_counts(self.n, self.k, m, self.bytes_per_row[profile.name], self.cache_bytes)

    def graph(self, rows, m):
        """The graph of (first `rows` rows of the weight) x (first m activation rows),
        its work buffer reserved (allocated and paged in) for every profile."""
        key = (rows, m)
        if key not in self.graphs:
            # M is benched in order: drop the graphs of the Ms done
            self.graphs = {k: g for k, g in self.graphs.items() if k[1] == m}
            w = gg.view(self.weight, (rows, self.k)) if rows != self.n else self.weight
            b = gg.view(self.acts, (m, self.k))
            graph = gg.build_forward(gg.mul_mat(w, b))
            node = graph.nodes[-1]
            for profile in node.profiles():
                node.profile = profile
                graph.reserve(self.max_threads, share_with=self.first_graph)
            self.first_graph = self.first_graph or graph
            self.graphs[key] = graph
        return self.graphs[key]


MIN_CASE_SECONDS = 0.004  # a cheap case repeats until it has run this long ...
MAX_RUNS = 16             # ... up to this many times, in each pass
CLOSE_CALL = 1.5          # a runner-up closer than this to the fastest is measured again ...
SECOND_LOOKS = 2          # ... this many more times, in turns with the fastest


def time_stages(graph, profile, pool):
    """{stage: µs} of the graph's mul_mat under `profile` (work buffer reserved).

    Each stage keeps its fastest run: other work on the machine only ever adds
    time. One run, or for a cheap case as many as fit in MIN_CASE_SECONDS (up
    to MAX_RUNS), so that one interruption cannot mislead a choice.
    """
    node = graph.nodes[-1]   # the mul_mat (views of the operands come first)
    node.profile = profile
    samples = {s: [] for s in STAGES}
    start = time.perf_counter()
    runs = 0
    while runs < 1 or (runs < MAX_RUNS and time.perf_counter() - start < MIN_CASE_SECONDS):
        graph.reset_stats()
        graph.compute(pool=pool, profile=True)
        row = graph.stats()[-1]
        for s, v in zip(STAGES, (row.init_us, row.compute_us, row.finalize_us)):
            samples[s].append(v)
        runs += 1
    return {s: min(v) for s, v in samples.items() if profile.stages[STAGES.index(s)].valid}


def fastest(a, b):
    """Per-stage minimum of two {stage: µs} (None: the other)."""
    return b if a is None else {s: min(a[s], b[s]) for s in a}


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
    sb = ShapeBench(n, k, type, m_values, rng, max(pools))
    shape = ShapeTimes(n, k, sb.type, [ProfileTimes(p) for p in sb.profiles])
    cases = [(pt, t) for t in pools for pt in shape.profiles
             if pt.profile in distinct_profiles(sb.profiles, t)]
    winner = {}   # n_threads -> the case fastest at the previous M
    for m in m_values:
        best = {}   # (case index, rows) -> fastest {stage: µs}

        def measure(i):
            pt, t = cases[i]
            for r in sb.rows(m, pt.profile):
                times = time_stages(sb.graph(r, m), pt.profile, pools[t])
                best[i, r] = fastest(best.get((i, r)), times)

        def estimate(i):
            rows = sb.rows(m, cases[i][0].profile)
            return extend_to_rows(n, rows, [best[i, r] for r in rows])

        def total(i):
            return sum(estimate(i).values())

        for _ in range(passes):
            for i in range(len(cases)):
                measure(i)
        for t in pools:
            # a second look where a choice is at stake: the fastest profile, a
            # runner-up close behind it, and the previous M's winner if it lost
            ranked = sorted((i for i, (_, ct) in enumerate(cases) if ct == t), key=total)
            again = {ranked[0], winner.get(t, ranked[0])}
            if len(ranked) > 1 and total(ranked[1]) < CLOSE_CALL * total(ranked[0]):
                again.add(ranked[1])
            if len(again) > 1:
                for _ in range(SECOND_LOOKS):
                    for i in sorted(again):
                        measure(i)
            winner[t] = min(ranked, key=total)
        for i, (pt, t) in enumerate(cases):
            per_stage = pt.times_us.setdefault(t, {})
            for s, v in estimate(i).items():
                per_stage.setdefault(s, []).append(v)
        if bar is not None:
            bar.update(1)
    for pt in shape.profiles:
        for per_stage in pt.times_us.values():
            for s, values in per_stage.items():
                per_stage[s] = bounded_in_m(m_values, values)
    return shape


def bounded_in_m(m_values, values):
    """Each stage's time cannot fall as M grows, nor grow faster than M (twice
    the rows cost at most twice the time); other work on the machine only adds
    time, so a time above either bound was inflated and is lowered to it."""
    out = [float(v) for v in values]
    for i in range(1, len(out)):
        out[i] = min(out[i], out[i - 1] * m_values[i] / m_values[i - 1])
    for i in range(len(out) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1])
    return out
