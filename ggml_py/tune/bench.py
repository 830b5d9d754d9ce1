"""Measuring MUL_MAT profiles for mulmat-tune.

For each (N, K, type), M and thread count, every profile the node supports is
run on the real kernels and each task stage is timed separately (the executor's
per-node stage clocks), the fastest of the runs.

Sampling keeps a pass short without guessing. At each M:

1. Every profile runs a quick sample: the weight whole where that is cheap,
   else one slice (MIN_SAMPLE_ROWS rows; FLOP_BUDGET's worth for a profile
   tiled over rows), its time scaled to N rows. This ranks the profiles.
2. The fastest, and every profile within IN_THE_RACE of it (a quick time
   above M/M' times the previous M's counts as that bound), is measured again
   on rows that behave like the whole weight: a few rows, which time what does
   not depend on N (converting the activations, calls, thread wake-ups), and a
   large slice, each stage's time extended along the straight line through the
   two points to all N rows. (Two large slices close together would not do:
   the noise of their difference is multiplied by N over their distance.) The
   large slice is at least an eighth of the weight (narrower ones misjudge
   BLAS); where the product is memory-bound (fewer than COMPUTE_BOUND flops per
   byte the profile streams: the weight's row, plus its de-quantized copy for
   the BLAS profiles) it outgrows twice the largest cache the whole weight
   outgrows (a slice that fits in a cache runs faster per row than the whole).
   When the slice would be more than half the weight, the product runs whole.
3. After all the Ms of a shape, close calls get second looks, closest first, within
   LOOK_BUDGET of the time steps 1-2 took.

A pass is one such sweep over every shape; several passes sweep again, one
after another, and every stage keeps its fastest time over all of them.

Profiles are measured in turn (not one profile's runs in a row), so that a
slow spell on the machine falls on all of them or none.
"""
import time

import numpy as np

from ggml_py.core.graph import ThreadPool, build_forward
from ggml_py.core.ops import add, mul_mat, view
from ggml_py.core.quants import quantize
from ggml_py.core.tensor import Context
from ggml_py.core.types import row_bytes, type_traits
from ggml_py.core.types import Type
from ggml_py.core.profiles import STAGES
from ggml_py.tune.data import MAX_SHAPES, ProfileTimes, ShapeTimes, TuneData, distinct_profiles

DEFAULT_M_VALUES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
FLOP_BUDGET = 2e8         # products of fewer flops are measured whole
COMPUTE_BOUND = 32        # flops per streamed byte from which a product is compute-bound
FEW_ROWS = 32             # the small slice
MIN_SAMPLE_ROWS = 1024    # the large slice: this many rows or N/8 (fewer misjudge BLAS) ...
MAX_SAMPLE_FRACTION = 0.5  # ... and at most this much of the weight, else it is measured whole
QUICK_MIN_ROWS = 256      # quick samples of tiled profiles: FLOP_BUDGET's worth of rows, at least this many
QUICK_WHOLE_BYTES = 64 << 20  # a weight cheap in flops and in these bytes is measured whole

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
    return sorted({(n, k, Type(type)) for n, k in pairs})


def weight_type(value, what=None):
    """The Type of a matrix product's weight, or ValueError saying why it has
    none (what: the tensor, named first in the message)."""
    where = f"{what}: " if what else ""
    try:
        type = Type(value)
    except ValueError:
        raise ValueError(f"{where}tensor type {value} is not supported") from None
    if not type_traits(type)["has_vec_dot"]:
        raise ValueError(f"{where}{type.name} weights have no matrix product kernel")
    return type


def random_weight(ctx, rng, rows, k, type, distinct_rows=256):
    """A (rows, k) weight of `type`: a few hundred random rows, quantized once and
    repeated (kernel times do not depend on the values, and quantizing every
    row of a large matrix would cost more than benching it)."""
    seed_rows = min(rows, distinct_rows)
    x = rng.standard_normal((seed_rows, k)).astype(np.float32) * 0.1
    weight = ctx.new_tensor(type, (rows, k))
    blocks = quantize(x, type) if type_traits(type)["is_quantized"] else x.astype(
        weight.numpy().dtype)
    data = weight.numpy()
    for start in range(0, rows, seed_rows):
        n = min(seed_rows, rows - start)
        data[start:start + n] = blocks[:n]
    return weight


def cache_sizes(n_threads):
    """Sizes of the CPU's data caches from level 2 up, smallest first (sysfs).

    A cache private to each core counts once per thread (n_threads threads run
    on as many cores); a shared one counts once. [32 MiB] when sysfs says nothing.
    """
    import glob
    import os

    def read(path):
        with open(path) as f:
            return f.read().strip()

    sizes = []
    for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            level = int(read(f"{d}/level"))
            kind = read(f"{d}/type")
            text = read(f"{d}/size").upper()
            sharing = len(parse_cpu_list(read(f"{d}/shared_cpu_list")))
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if level < 2 or kind == "Instruction" or not digits.isdigit():
            continue
        copies = max(1, min(n_threads, (os.cpu_count() or 1) // max(1, sharing)))
        sizes.append(int(digits) * scale * copies)
    return sorted(sizes) or [32 << 20]


def parse_cpu_list(text):
    """The CPUs of a sysfs list such as "0-3,8"."""
    cpus = []
    for part in text.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def row_counts(n, k, m, bytes_per_row, cache_sizes):
    """Weight rows to measure at M=m: [n] (whole), or [few, large] to extend to n.

    bytes_per_row: what one weight row costs the profile in memory (its
    stored row, plus a de-quantized copy where the profile makes one).
    cache_sizes: the CPU's caches (cache_sizes()); a memory-bound product's
    slice must outgrow, twice over, the largest cache that the whole weight
    outgrows, so that both stream from the same level.
    """
    if 2 * n * k * m <= FLOP_BUDGET:
        return [n]
    large = max(MIN_SAMPLE_ROWS, n // 8)
    outgrown = [c for c in cache_sizes if c < n * bytes_per_row]
    if 2 * k * m < COMPUTE_BOUND * bytes_per_row and outgrown:
        large = max(large, -(-2 * max(outgrown) // bytes_per_row))
    return [n] if large > MAX_SAMPLE_FRACTION * n else [FEW_ROWS, large]


def quick_row_counts(n, k, m, bytes_per_row, tiled):
    """Rows of the quick sample, good for ranking profiles, not for choosing
    between close ones: a cheap weight whole; else one slice of
    MIN_SAMPLE_ROWS rows, or for a profile tiled over rows (its time grows
    in step with them) FLOP_BUDGET's worth, QUICK_MIN_ROWS at least. Its
    time is scaled to n rows (the part that does not depend on N, converting
    the activations and waking threads, is small beside such a slice)."""
    if 2 * n * k * m <= FLOP_BUDGET and n * bytes_per_row <= QUICK_WHOLE_BYTES:
        return [n]
    large = MIN_SAMPLE_ROWS
    if tiled:
        large = int(min(large, max(QUICK_MIN_ROWS, FLOP_BUDGET / (2 * k * m))))
    return [n] if large > MAX_SAMPLE_FRACTION * n else [large]


class ShapeBench:
    """Graphs for one (N, K, type): mul_mat of row slices of one weight by M rows."""

    def __init__(self, n, k, type, m_values, rng, max_threads):
        self.n, self.k, self.type, self.max_threads = n, k, Type(type), max_threads
        self.m_max, self.rng = max(m_values), rng
        self.release()
        whole = self.graph(n, m_values[0]).nodes[-1]   # the largest work buffer
        self.profiles = whole.profiles()
        self.bytes_per_row = {}
        for p in self.profiles:
            whole.profile = p
            self.bytes_per_row[p.name] = row_bytes(self.type, k) + whole._work_size(max_threads) // n
        self.cache_sizes = cache_sizes(max_threads)

    def rows(self, m, profile, exact=True):
        """Weight rows to measure `profile` on at M=m: row_counts, or with
        exact=False quick_row_counts (a profile with a parallel COMPUTE is tiled)."""
        if exact:
            return row_counts(self.n, self.k, m, self.bytes_per_row[profile.name], self.cache_sizes)
        return quick_row_counts(self.n, self.k, m, self.bytes_per_row[profile.name],
                                tiled=profile.compute.parallel)

    def release(self):
        """Free the weight, the activations and the graphs (made again when next needed)."""
        self.ctx = self.weight = self.acts = self.first_graph = None
        self.graphs = {}

    def graph(self, rows, m):
        """The graph of (first `rows` rows of the weight) x (first m activation rows),
        its work buffer reserved (allocated and paged in) for every profile."""
        if self.ctx is None:
            n, k, m_max = self.n, self.k, self.m_max
            size = row_bytes(self.type, k) * n + 4 * k * m_max + 4 * 4 * n * m_max
            self.ctx = Context(mem_size=size + (16 << 20))
            self.weight = random_weight(self.ctx, self.rng, n, k, self.type)
            self.acts = self.ctx.from_numpy(self.rng.standard_normal((m_max, k)).astype(np.float32))
        key = (rows, m)
        if key not in self.graphs:
            w = view(self.weight, (rows, self.k)) if rows != self.n else self.weight
            b = view(self.acts, (m, self.k))
            graph = build_forward(mul_mat(w, b))
            # inside a model's graph the workers are awake when a MUL_MAT starts (the
            # node before kept them busy): here too, not put to sleep at the end of a
            # run for the next one to wake (that cost, added to the parallel stages, put
            # `cpu` far behind on small products). A profile whose stage sleeps (wait)
            # still pays the wake-up once per run, as the node after it would.
            graph.lookahead = 0
            node = graph.nodes[-1]
            for profile in node.profiles():
                node.profile = profile
                graph.reserve(self.max_threads, share_with=self.first_graph)
            self.first_graph = self.first_graph or graph
            self.graphs[key] = graph
        return self.graphs[key]


MIN_CASE_SECONDS = 0.004  # a cheap case repeats until it has run this long ...
MAX_RUNS = 16             # ... up to this many times, in each pass
MIN_CHEAP_RUNS = 3        # a case whose fastest run is under MIN_CASE_SECONDS runs at least this often
CLOSE_CALL = 1.5          # a runner-up closer than this to the fastest is measured again ...
SECOND_LOOKS = 2          # ... this many more times, in turns with the fastest
IN_THE_RACE = 1.5         # a profile whose sample is within this of the fastest is measured exactly
LOOK_BUDGET = 0.3         # second looks may take this fraction of the first measurements' time


def time_stages(graph, profile, pool):
    """{stage: µs} of the graph's mul_mat under `profile` (work buffer reserved).

    Each stage keeps its fastest run: other work on the machine only ever adds
    time. One run, or for a cheap case as many as fit in MIN_CASE_SECONDS (up
    to MAX_RUNS) and at least MIN_CHEAP_RUNS, so that one interruption cannot
    mislead a choice (a worker descheduled for a tick turns a 10-µs product
    into a 4-ms run, and that alone can fill MIN_CASE_SECONDS).
    """
    node = graph.nodes[-1]   # the mul_mat (views of the operands come first)
    node.profile = profile
    samples = {s: [] for s in STAGES}
    start = time.perf_counter()
    runs, fastest_run = 0, float("inf")

    def again():
        if runs >= MAX_RUNS:
            return False
        cheap = fastest_run < 1e6 * MIN_CASE_SECONDS
        return (runs < 1 or time.perf_counter() - start < MIN_CASE_SECONDS
                or (cheap and runs < MIN_CHEAP_RUNS))

    while again():
        graph.reset_stats()
        graph.compute(pool=pool, profile=True)
        row = graph.stats()[-1]
        for s, v in zip(STAGES, (row.init_us, row.compute_us, row.finalize_us)):
            samples[s].append(v)
        fastest_run = min(fastest_run, row.total_us)
        runs += 1
    return {s: min(v) for s, v in samples.items() if profile.stages[STAGES.index(s)].valid}


def fastest(a, b):
    """Per-stage minimum of two {stage: µs} (None: the other)."""
    return b if a is None else {s: min(a[s], b[s]) for s in a}


def extend_to_rows(n, rows, times):
    """Each stage's time at n rows from times at 1 or 2 row counts: in
    proportion to one, along the straight line through two."""
    if len(rows) == 1:
        return {s: v * n / rows[0] for s, v in times[0].items()}
    (r1, r2), (t1, t2) = rows, times
    return {s: max(0.0, t1[s] + (t2[s] - t1[s]) * (n - r1) / (r2 - r1)) for s in t1}


def bench(shapes, model="", m_values=None, thread_counts=(1, 2), passes=1, seed=0, progress=None):
    """Bench every profile of every shape; returns TuneData.

    passes: sweeps over all the shapes, one after another (so that each
    case's runs fall at moments seconds apart); each stage keeps its fastest.
    progress: a callable(n_steps) returning a context manager with update(),
    e.g. tqdm (None: silent).
    """
    m_values = sorted(set(m_values or DEFAULT_M_VALUES))
    if len(m_values) < 2:
        raise ValueError(f"bench needs two or more Ms (estimates interpolate between them), "
                         f"got {m_values}")
    # (n, k, type) each once, and no more than a tune file holds: load would refuse the file
    shapes = [(n, k, Type.of(type, "bench")) for n, k, type in shapes]
    if len(set(shapes)) < len(shapes):
        raise ValueError("bench: a shape is given twice")
    if len(shapes) > MAX_SHAPES:
        raise ValueError(f"bench: {len(shapes)} shapes, more than a tune file holds ({MAX_SHAPES})")
    rng = np.random.default_rng(seed)
    data = TuneData(model=model, m_values=m_values, thread_counts=sorted(set(thread_counts)))
    pools = {t: ThreadPool(t) for t in thread_counts}
    try:
        bar = progress(passes * len(shapes) * len(m_values)) if progress else None
        sweeps = []   # made on the first pass, when the shape is first swept
        for pass_ in range(passes):
            for j, (n, k, type) in enumerate(shapes):
                if pass_ == 0:
                    sweeps.append(ShapeSweeps(n, k, type, m_values, pools, rng))
                sweeps[j].sweep(bar)
        data.shapes = [shape.times() for shape in sweeps]
        if bar is not None:
            bar.close()
    finally:
        for pool in pools.values():
            pool.close()
    return data


class Waker:
    """A tiny graph of one parallel op: computing it wakes a pool's workers and leaves
    them spinning (look-ahead off), so that a timed MUL_MAT starts as one inside a
    model's graph does, with the workers awake (not paying, in its first parallel
    stage, for the previous profile's sleep)."""

    def __init__(self):
        self.ctx = Context(mem_size=1 << 16)
        x = self.ctx.from_numpy(np.zeros((8, 64), np.float32))     # (8, 64)
        self.graph = build_forward(add(x, x))
        self.graph.lookahead = 0

    def wake(self, pool):
        """Wake `pool`'s workers (a ThreadPool)."""
        self.graph.compute(pool=pool)


class CaseTimes:
    """The fastest stage times measured so far of one shape's cases (profile,
    thread count), per M and row count."""

    def __init__(self, sb, cases, pools):
        self.sb, self.cases, self.pools = sb, cases, pools
        self.waker = Waker()
        self.best = {}      # (m, case index, rows) -> fastest {stage: µs}
        self.exact = set()  # (m, case index) measured on rows that behave like the whole weight

    def rows(self, m, i):
        """Row counts case i is measured on at M=m: exact ones once measure_exactly
        moved it, else the quick sample."""
        return self.sb.rows(m, self.cases[i][0].profile, exact=(m, i) in self.exact)

    def measure(self, m, i, rows=None):
        """Run case i at M=m on each of `rows` (default: all its row counts)."""
        pt, t = self.cases[i]
        for r in rows or self.rows(m, i):
            self.waker.wake(self.pools[t])
            times = time_stages(self.sb.graph(r, m), pt.profile, self.pools[t])
            self.best[m, i, r] = fastest(self.best.get((m, i, r)), times)

    def measure_exactly(self, m, i):
        """Move case i at M=m from the quick sample to exact rows, measuring
        the row counts the quick sample did not have."""
        self.exact.add((m, i))
        new = [r for r in self.rows(m, i) if (m, i, r) not in self.best]
        if new:
            self.measure(m, i, new)

    def estimate(self, m, i):
        """{stage: µs} of case i at M=m on all N rows."""
        rows = self.rows(m, i)
        return extend_to_rows(self.sb.n, rows, [self.best[m, i, r] for r in rows])

    def total(self, m, i):
        """Estimated µs of case i at M=m on all N rows, all stages summed."""
        return sum(self.estimate(m, i).values())


class ShapeSweeps:
    """The measurements of one (N, K, type), sweep after sweep over its Ms.

    Per M: every case on the quick sample (or, once a case is a contender,
    its exact rows); the contenders on exact rows. Then, in the time
    LOOK_BUDGET allows, second looks at the close calls, closest first
    (later, so that a slow spell on the machine is unlikely to fall on both
    looks). Profiles left on a quick sample keep its time (rough, and far
    from the fastest).
    """

    def __init__(self, n, k, type, m_values, pools, rng):
        self.m_values, self.pools = m_values, pools
        sb = ShapeBench(n, k, type, m_values, rng, max(pools))
        self.shape = ShapeTimes(n, k, sb.type, [ProfileTimes(p) for p in sb.profiles])
        self.cases = [(pt, t) for t in pools for pt in self.shape.profiles
                      if pt.profile in distinct_profiles(sb.profiles, t)]
        self.ct = CaseTimes(sb, self.cases, pools)

    def sweep(self, bar=None):
        """One sweep over the Ms, then second looks at its close calls."""
        try:
            start = time.perf_counter()
            close_calls = self.first_looks(bar)
            self.second_looks(close_calls, LOOK_BUDGET * (time.perf_counter() - start))
        finally:
            self.ct.sb.release()   # one shape's weight in memory at a time: the one being swept

    def first_looks(self, bar):
        """Every case at every M, the contenders on exact rows; returns the
        close calls, [(slowest / fastest total, M, case indices)]."""
        ct, cases = self.ct, self.cases
        close_calls = []
        winner = {}        # n_threads -> the case fastest at the previous M
        previous_m = None
        for m in self.m_values:
            for i in range(len(cases)):
                ct.measure(m, i)

            def plausible(i):
                # a time more than M/M' times the previous M's was inflated (one
                # interrupted quick sample must not put a profile out of the race)
                if previous_m is None:
                    return ct.total(m, i)
                return min(ct.total(m, i), ct.total(previous_m, i) * m / previous_m)

            for t in self.pools:
                # the contenders again on rows that behave like the whole weight:
                # the fastest, then every profile its sample puts within IN_THE_RACE
                ranked = sorted((i for i, (_, c) in enumerate(cases) if c == t), key=plausible)
                ct.measure_exactly(m, ranked[0])
                for i in ranked[1:]:
                    if plausible(i) < IN_THE_RACE * ct.total(m, ranked[0]):
                        ct.measure_exactly(m, i)
                # a choice at stake: the fastest, a runner-up close behind it, and
                # the previous M's winner if it lost
                ranked.sort(key=lambda i: ct.total(m, i))
                again = {ranked[0], winner.get(t, ranked[0])}
                if len(ranked) > 1 and ct.total(m, ranked[1]) < CLOSE_CALL * ct.total(m, ranked[0]):
                    again.add(ranked[1])
                again = sorted(i for i in again if (m, i) in ct.exact)
                if len(again) > 1:
                    totals = [ct.total(m, i) for i in again]
                    close_calls.append((max(totals) / max(min(totals), 1e-9), m, again))
                winner[t] = ranked[0]
            previous_m = m
            if bar is not None:
                bar.update(1)
        return close_calls

    def second_looks(self, close_calls, seconds):
        """SECOND_LOOKS more runs of each close call's cases, closest first,
        in turns, for at most `seconds`."""
        deadline = time.perf_counter() + seconds
        close_calls = sorted(close_calls, key=lambda c: c[0])
        for _ in range(SECOND_LOOKS):
            for _, m, again in close_calls:
                if time.perf_counter() < deadline:
                    for i in again:
                        self.ct.measure(m, i)

    def times(self):
        """ShapeTimes of the sweeps so far, each stage bounded in M."""
        for i, (pt, t) in enumerate(self.cases):
            per_stage = pt.times_us[t] = {}
            for m in self.m_values:
                for s, v in self.ct.estimate(m, i).items():
                    per_stage.setdefault(s, []).append(v)
            exact = [(m, i) in self.ct.exact for m in self.m_values]
            tiled = pt.profile.compute.parallel
            for s, values in per_stage.items():
                per_stage[s] = bounded_in_m(self.m_values, values, exact, capped=not tiled)
        return self.shape


def bounded_in_m(m_values, values, exact=None, capped=True):
    """Each stage's time cannot fall as M grows, nor — where capped — grow faster
    than M (twice the rows cost at most twice the time); other work on the machine
    only adds time, so a time above either bound was inflated and is lowered to it.

    exact: per M, whether the time was measured exactly (None: all were).
    Quick samples (only good for ranking) bound no other time; they are only
    held to M/M' times the time at the M' before them.
    capped: hold exact times to M/M' times the exact time at a smaller M'.
    Not for a profile tiled over rows (`cpu`), whose time grows in step with M
    (or a little faster, as its tiles outgrow a cache): there the cap would
    put a smaller M's fastest run, scaled, in place of almost every larger
    M's own — a best of several looks that the BLAS profiles, whose time grows
    more slowly than M and so rarely meets the cap, do not get — and tip the
    choice towards `cpu` at the crossover (measured: docs/tune.md).
    """
    out = [float(v) for v in values]
    exact = exact or [True] * len(out)
    idx = [i for i in range(len(out)) if exact[i]]
    if capped:
        for a, b in zip(idx, idx[1:]):
            out[b] = min(out[b], out[a] * m_values[b] / m_values[a])
    for a, b in reversed(list(zip(idx, idx[1:]))):
        out[a] = min(out[a], out[b])
    for i in range(1, len(out)):
        if not exact[i]:
            out[i] = min(out[i], out[i - 1] * m_values[i] / m_values[i - 1])
    return out
