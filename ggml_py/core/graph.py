"""Graphs: topological order, planning (profiles + work buffer), computing.

`build_forward(y)` only orders nodes; `graph.plan(n)` reports what will run and
how much work buffer it needs; `graph.compute()` runs the whole graph in C with
the GIL released, on a persistent ThreadPool.
"""
import atexit
import functools
import os
import threading
from dataclasses import dataclass

import numpy as np

from ggml_py import _core
from ggml_py.core.ops import attention_pool_shape
from ggml_py.core.profiles import STAGES
from ggml_py.core.tensor import Tensor
from ggml_py.core.types import Op, Type, checked_int

DEFAULT_LOOKAHEAD = 4          # stages scanned for upcoming parallel work
MAX_LOOKAHEAD = 1 << 20        # far past any graph; keeps the C int in range
ABORT_INTERVAL_MS = 20.0       # how often the executor checks for Ctrl-C
WORK_ALIGN = 64
# A parallel stage costs a dispatch and a barrier: tenths of a µs with spinning
# workers, tens of µs to wake sleeping ones, milliseconds when another program
# holds a worker's core. A stage smaller than this runs on the main thread alone
# (docs/runtime.md, "Small nodes on one thread", has the measurements):
MIN_PARALLEL_MACS = 1 << 18        # MUL_MAT's products: N·K·M multiply-adds (~10 µs)
MIN_PARALLEL_ELEMENTS = 1 << 13    # any other stage: elements, over at least two rows
# ... times this where the workers are asleep when the stage starts (no parallel stage
# within the look-ahead before it): waking them costs a system call and tens of µs
WAKE_FACTOR = 4
MAX_THREADS = _core.MAX_THREADS   # the most threads a pool or a compute may have

_pools = {}
_pools_lock = threading.Lock()


class ThreadPool(_core.ThreadPool):
    """A persistent worker pool: ThreadPool(n_threads, policy='spin-then-sleep', spin_us=200).

    Policies: 'spin-then-sleep' (spin up to spin_us, then sleep), 'spin' (never
    sleep unless a stage says wait), 'sleep' (sleep as soon as a task is done).
    Use as a context manager or call close(); it outlives any number of graphs.
    It runs one graph at a time: computes from several Python threads take
    turns, and close() waits for a running compute.
    """

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _SharedPool(ThreadPool):
    """A pool of shared_pool: every caller with its thread count shares it (the
    computes of other threads and Llamas too), so close() — and `with` — leave
    it running for them; it is closed at exit."""

    def close(self):
        """Nothing: the pool is shared (see shared_pool)."""


@atexit.register
def _close_shared_pools():
    # Join the cached pools' workers while the interpreter is still whole.
    with _pools_lock:
        for pool in _pools.values():
            _core.ThreadPool.close(pool)
        _pools.clear()


def _reset_pools_after_fork():
    # The child has none of the parent's threads: the pools read as closed (the
    # core forgets them), and a lock some parent thread held would stay held.
    global _pools_lock
    _pools_lock = threading.Lock()
    _pools.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_pools_after_fork)


@functools.cache
def default_threads():
    """Physical cores, as llama.cpp picks by default — no more than the CPUs this
    process may run on (taskset, a cpuset, an MPI rank bound to cores), nor than
    MAX_THREADS. Asked once (psutil takes ~0.1 ms)."""
    import psutil
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        cores = min(cores, len(os.sched_getaffinity(0)))
    return max(1, min(cores, MAX_THREADS))


def thread_count(n_threads, where):
    """n_threads checked (an int in 1..256), or default_threads() for None."""
    if n_threads is None:
        return default_threads()
    return _core.check_thread_count(n_threads, where)


def aligned_bytes(nbytes):
    """An uninitialised uint8 array of nbytes starting on a WORK_ALIGN (cache-line)
    boundary: a work buffer, or a buffer of intermediates."""
    raw = np.empty(nbytes + WORK_ALIGN, np.uint8)
    start = (-raw.ctypes.data) % WORK_ALIGN
    return raw[start:start + nbytes]


def check_tune(tune, where):
    """tune as given if it is tune data or None, else a TypeError naming `where`. Tune
    data is what the planner asks estimates(n, k, type, m, n_threads) of: a TuneData
    (ggml_py.tune.data, a layer above this one, so known here by that method)."""
    if tune is not None and not callable(getattr(tune, "estimates", None)):
        raise TypeError(f"{where}: tune must be a TuneData or None, got {type(tune).__name__}")
    return tune


def shared_pool(n_threads):
    """The process's cached pool for n_threads (created on first use).

    Every caller with the same n_threads gets the same pool; computes on it
    take turns (a pool runs one graph at a time). Its close() does nothing, so
    that no caller can close it under the others; it is closed at exit."""
    n_threads = _core.check_thread_count(n_threads, "shared_pool")
    with _pools_lock:
        pool = _pools.get(n_threads)
        if pool is None or pool.closed:
            pool = _pools[n_threads] = _SharedPool(n_threads)
        return pool


@dataclass(frozen=True)
class PlanRow:
    """One node of a plan: its profile, estimated time (µs, when tuned) and why."""
    index: int
    op: Op
    name: str
    shape: tuple
    type: Type
    profile: object
    work_size: int
    reason: str = "default"          # default | fallback | tuned | estimated | user
    estimate_us: float = None


@dataclass(frozen=True)
class Plan:
    """What compute will run at n_threads: a profile per node and the work-buffer size."""
    n_threads: int
    work_size: int
    rows: tuple

    def __str__(self):
        lines = [f"plan: {len(self.rows)} nodes, {self.n_threads} threads, "
                 f"work buffer {self.work_size} bytes",
                 f"{'#':>4} {'op':<10} {'shape':<22} {'type':<5} {'work':>10} {'why':<9} "
                 f"{'est us':>9}  profile"]
        for r in self.rows:
            est = f"{r.estimate_us:9.1f}" if r.estimate_us is not None else f"{'':9}"
            lines.append(f"{r.index:>4} {r.op.name:<10} {str(r.shape):<22} {r.type.name:<5} "
                         f"{r.work_size:>10} {r.reason:<9} {est}  {r.profile}")
        return "\n".join(lines)


@dataclass(frozen=True)
class StatRow:
    """Timing of one node over the computes since profiling was switched on."""
    index: int
    op: Op
    shape: tuple
    type: Type
    profile: str
    init_us: float
    compute_us: float
    finalize_us: float

    @property
    def total_us(self):
        """init + compute + finalize µs."""
        return self.init_us + self.compute_us + self.finalize_us


class Stats(tuple):
    """Rows of StatRow; str() prints a table like ggml's graph perf print."""

    def __str__(self):
        total = sum(r.total_us for r in self)
        lines = [f"{'#':>4} {'op':<10} {'shape':<22} {'type':<5} {'profile':<12} "
                 f"{'init us':>10} {'compute us':>11} {'%':>6}"]
        for r in self:
            lines.append(f"{r.index:>4} {r.op.name:<10} {str(r.shape):<22} {r.type.name:<5} "
                         f"{r.profile:<12} {r.init_us:>10.1f} {r.compute_us:>11.1f} "
                         f"{100 * r.total_us / (total or 1.0):>6.1f}")
        lines.append(f"total: {total:.1f} us")
        return "\n".join(lines)


def choose_mul_mat_profile(node, n_threads, tune):
    """Set a MUL_MAT node's profile from tune data, else the built-in rule.

    Returns (reason, estimated µs or None): "tuned" from times benched at n_threads,
    "estimated" from times interpolated between two benched thread counts (the
    estimates' `between`), "fallback" for the built-in rule. Only the node's own profiles
    are candidates, so non-contiguous operands stay on the CPU profile.
    """
    a, b = node.src[0], node.src[1]
    n, k, m = a._ne[1], a._ne[0], b._ne[1]
    # tune data times one product of M rows; a batched one (one sgemm per batch,
    # de-quantized per batch) is not that product, so the built-in rule decides it
    if tune is not None and b._ne[2] * b._ne[3] == 1:
        own = node.profiles()
        estimates = tune.estimates(n, k, a.type, m, n_threads)
        for estimate, profile in estimates:
            match = next((p for p in own if p.id == profile.id), None)
            if match is not None and match.same_code_path(profile):
                node._plan_profile(match)   # the node's own flags, whatever the file says
                between = getattr(estimates, "between", None)
                return ("tuned" if between is None else "estimated"), estimate
    node._plan_profile(node.default_profile())
    return "fallback", None


def choose_attention_profile(node, n_threads, tune):
    """Set an ATTENTION node's profile to 'auto': each token takes slim or flash by the
    length of its own list (never by the rest of its step, so batches stay bitwise
    invariant), slim up to a limit. The limit is where flash overtakes slim in tune data
    where the node's shape (head size, heads, KV heads, K and V types) was benched at
    n_threads, for one query token; else the built-in one (slim while a block's scores
    fill at most 1 MiB: ops_attention.c).

    Returns (reason, estimated µs or None). The longest list a token can have stands
    for the context length (the window of a single sequence, or the lists of a step).
    """
    q, k, v, index = node.src[:4]
    T, H, D = q.shape
    Hkv, n_slots = attention_pool_shape(k, D)
    node._plan_profile(next(p for p in node.profiles() if p.name == "auto"))
    estimates = getattr(tune, "attention_estimates", None)
    if estimates is not None:
        def estimated(t, length):     # [(µs, profile name)], fastest first; [] if not benched
            return estimates(D, H, Hkv, k.type, v.type, t, length, n_threads)
        if estimated(1, 1):
            limit = _slim_limit(lambda length: estimated(1, length)[0][1] == "slim", n_slots)
            node._set_op_param_i32(1, limit if limit > 0 else -1)     # (-1: flash for all)
            longest = max(1, min(n_slots, index.shape[0] - 2 * T))
            times = {name: us for us, name in estimated(T, longest)}
            return "tuned", times.get("slim" if longest <= limit else "flash")
    node._set_op_param_i32(1, 0)
    return "fallback", None


def _slim_limit(slim_is_faster, n_slots):
    """The longest list (0 .. n_slots) up to which slim_is_faster(length) holds, the
    estimates being linear in the length (one crossing at most): 0 where flash is
    faster from the start; n_slots where slim is faster at n_slots (also where flash is
    faster only for short lists, as noisy tune data can say: the long lists cost most)."""
    if slim_is_faster(n_slots):
        return max(1, n_slots)
    if not slim_is_faster(1):
        return 0
    low, high = 1, n_slots           # slim_is_faster(low), not slim_is_faster(high)
    while high - low > 1:
        mid = (low + high) // 2
        if slim_is_faster(mid):
            low = mid
        else:
            high = mid
    return low


def _elements(tensor):
    return int(np.prod(tensor.shape, dtype=np.int64))


def stage_is_worth_threads(node, stage, factor=1):
    """Whether a parallel stage of node has work enough for more than one thread
    (factor times the minimum: WAKE_FACTOR where the workers must be woken).

    The kernels split a stage by rows (MUL_MAT's products by groups of weight rows),
    so one row is one thread's work whatever its length."""
    macs, elements = factor * MIN_PARALLEL_MACS, factor * MIN_PARALLEL_ELEMENTS
    if node.op == Op.MUL_MAT and node.profile.name == "cpu":
        a, b = node.src[0], node.src[1]
        if stage == "init":      # the activations converted to the weight's dot type
            return b._ne[1] * b._ne[2] * b._ne[3] >= 2 and _elements(b) >= elements
        return a._ne[1] * a._ne[0] * b._ne[1] * b._ne[2] * b._ne[3] >= macs
    if node.op == Op.MUL_MAT:    # the BLAS profiles de-quantize the whole weight
        return _elements(node.src[0]) >= elements
    if node.op == Op.ATTENTION:  # items: a kv head and a block of tokens; per token and
        q, k, index = node.src[0], node.src[1], node.src[3]   # head, its list's K and V rows
        T, H, D = q.shape
        Hkv, n_slots = attention_pool_shape(k, D)
        longest = max(1, min(n_slots, index.shape[0] - 2 * T))
        return (Hkv >= 2 or T >= 2) and 2 * T * H * longest * D >= macs
    # the rows the kernel splits: the ids of GET_ROWS, the rows SET_ROWS writes,
    # else the larger of the result's and the first source's
    if node.op == Op.GET_ROWS:
        work = _elements(node)
    elif node.op == Op.SET_ROWS:
        work = _elements(node.src[0])
    else:
        work = max(_elements(node), _elements(node.src[0]) if node.src[0] is not None else 0)
    row = max(1, node._ne[0])
    return work >= elements and work >= 2 * row


def one_thread_where_small(nodes, lookahead):
    """Put the small parallel stages of the nodes (in compute order) on the main thread.

    A stage with no parallel stage among the `lookahead` stages before it starts with
    the workers asleep (the executor's look-ahead sent them to sleep, or a `wait`
    stage did, or the compute has just begun), and must be WAKE_FACTOR times larger.
    Profiles set by hand are left as they are, and count as they run."""
    since = None        # valid stages since the last parallel one; None: workers asleep
    for node in nodes:
        profile = node.profile
        for stage, flags in zip(STAGES, profile.stages):
            if not flags.valid:
                continue
            parallel = flags.parallel
            if parallel and not node.profile_pinned:
                asleep = since is None or (lookahead > 0 and since >= lookahead)
                if not stage_is_worth_threads(node, stage, WAKE_FACTOR if asleep else 1):
                    profile = profile.with_stage(stage, parallel=False)
                    parallel = False
            if parallel:
                since = 0
            elif flags.wait or since is None:
                since = None
            else:
                since += 1
        if not node.profile_pinned:
            node._plan_profile(profile)


def topological_order(outputs):
    """Every tensor the outputs depend on, sources before users (ggml's DFS order)."""
    order, seen = [], set()
    for out in outputs:
        stack = [(out, False)]
        while stack:
            t, expanded = stack.pop()
            if id(t) in seen:
                continue
            if expanded:
                seen.add(id(t))
                order.append(t)
                continue
            stack.append((t, True))
            for s in reversed(t.src):
                if s is not None and id(s) not in seen:
                    stack.append((s, False))
    return order


def build_forward(*outputs):
    """A Graph computing `outputs` (tensors); nodes in topological order, no math done."""
    if not outputs:
        raise ValueError("build_forward: give at least one tensor")
    for t in outputs:
        if not isinstance(t, Tensor):
            raise TypeError(f"build_forward: expected Tensors, got {type(t).__name__}")
    return Graph(topological_order(outputs))


def _check_sources_first(nodes):
    """ValueError unless every node's computed sources are nodes before it (a compute
    runs the nodes in list order: a source after its user, or left out, is read
    before it is written)."""
    done = set()
    for i, t in enumerate(nodes):
        for s in t.src:
            if s is not None and s.op != Op.NONE and id(s) not in done:
                where = "comes after it" if any(s is n for n in nodes) else "is not in the graph"
                raise ValueError(f"Graph: node {i} ({t.op.name} {t.shape}) reads a {s.op.name} "
                                 f"{s.shape} that {where}; build_forward(outputs) lists every "
                                 f"node after its sources")
        done.add(id(t))


class Graph:
    """Nodes (op != NONE) and leafs of a computation, in topological order."""

    def __init__(self, tensors):
        tensors = list(tensors)
        for t in tensors:
            if not isinstance(t, Tensor):
                raise TypeError(f"Graph: expected Tensors, got {type(t).__name__}")
        self.nodes = [t for t in tensors if t.op != Op.NONE]
        self.leafs = [t for t in tensors if t.op == Op.NONE]
        _check_sources_first(self.nodes)
        self._cgraph = _core.CGraph(self.nodes)
        self._work = None
        self._stage_ns = None          # int64 (nodes * stages): profiled times, summed
        self._stage_profiles = None    # the nodes' profiles those times were taken under
        self.lookahead = DEFAULT_LOOKAHEAD

    @property
    def lookahead(self):
        """Nodes the main thread looks ahead, when it starts a parallel stage, for another
        one before telling the workers to sleep when done (0: they sleep after each)."""
        return self._lookahead

    @lookahead.setter
    def lookahead(self, value):
        self._lookahead = checked_int("graph.lookahead", value, low=0, high=MAX_LOOKAHEAD)

    def __len__(self):
        return len(self.nodes)

    def __reduce_ex__(self, protocol):
        raise TypeError("Graph cannot be copied or pickled: its nodes live in C memory "
                        "(build the graph again)")

    def plan(self, n_threads=None, tune=None):
        """Choose each MUL_MAT and ATTENTION node's profile and report the plan at n_threads.

        tune: TuneData (ggml_py.tune.data); for each MUL_MAT node whose (N, K, type)
        was benched at this thread count, the profile with the smallest
        estimated time at the node's M is chosen ("tuned"); at a thread count
        between two benched ones, from times interpolated between theirs
        ("estimated"); other nodes get the built-in rule ("fallback":
        node.default_profile()); ATTENTION nodes likewise by their shape
        (choose_attention_profile). Profiles set by hand are kept ("user").
        With more than one thread, a parallel stage too small to gain from
        threads runs on the main thread alone (stage_is_worth_threads).
        n_threads: 1..256, None for default_threads().
        """
        n_threads = thread_count(n_threads, "plan")
        check_tune(tune, "plan")
        rows = []
        for t in self.nodes:
            reason, estimate = ("user" if t.profile_pinned else "default"), None
            if t.op == Op.MUL_MAT and not t.profile_pinned:
                reason, estimate = choose_mul_mat_profile(t, n_threads, tune)
            elif t.op == Op.ATTENTION and not t.profile_pinned:
                reason, estimate = choose_attention_profile(t, n_threads, tune)
            elif not t.profile_pinned:
                t._plan_profile(t.default_profile())
            rows.append((t, reason, estimate))
        if n_threads > 1:
            one_thread_where_small(self.nodes, self.lookahead)
        rows = [PlanRow(i, t.op, t.name, t.shape, t.type, t.profile, t._work_size(n_threads),
                        reason, estimate) for i, (t, reason, estimate) in enumerate(rows)]
        return Plan(n_threads, self._cgraph.work_size(n_threads), tuple(rows))

    def _work_buffer(self, n_threads, page_in=False):
        # Sized by a C pass over the nodes; reallocated only when a plan needs more.
        size = self._cgraph.work_size(n_threads)
        if size == 0:
            return None
        if self._work is None or self._work.nbytes < size:
            self._work = aligned_bytes(size)
            if page_in:
                self._work[:] = 0
        return self._work

    def reserve(self, n_threads, share_with=None):
        """Allocate (and page in) the work buffer the current profiles need at
        n_threads, so that no later compute pays for it; returns its size.

        share_with: a graph that never runs at the same time as this one; its
        work buffer is used when it is large enough (saves memory and paging).
        """
        n_threads = thread_count(n_threads, "reserve")
        if share_with is not None and not isinstance(share_with, Graph):
            raise TypeError(f"reserve: share_with must be a Graph, got {type(share_with).__name__}")
        shared = share_with._work if share_with is not None else None
        if shared is not None and (self._work is None or self._work.nbytes < shared.nbytes):
            self._work = shared
        work = self._work_buffer(n_threads, page_in=True)
        return 0 if work is None else work.nbytes

    def compute(self, n_threads=None, pool=None, profile=False):
        """Run the graph. pool: a ThreadPool (else a cached one for n_threads).

        n_threads: 1..256, None for default_threads() (or the pool's count).
        A pool runs one graph at a time: while another thread computes on it,
        this compute waits its turn (GIL released).
        profile=True accumulates per-node stage times, read with stats().
        Ctrl-C raises KeyboardInterrupt within a few tens of ms; the pool stays usable.
        A get_rows/set_rows row id out of range raises ValueError naming the node.
        """
        if pool is not None and not isinstance(pool, _core.ThreadPool):
            raise TypeError(f"compute: pool must be a ThreadPool, got {type(pool).__name__}")
        if pool is None:
            n_threads = thread_count(n_threads, "compute")
            pool = shared_pool(n_threads) if n_threads > 1 else None
        elif n_threads is not None and thread_count(n_threads, "compute") != pool.n_threads:
            raise ValueError(f"compute: n_threads={n_threads} but the pool has {pool.n_threads}")
        n = pool.n_threads if pool is not None else 1
        stage_ns = self._stage_times(start=True) if profile else None
        self._cgraph.compute(pool, self._work_buffer(n), stage_ns, self.lookahead,
                             ABORT_INTERVAL_MS)

    def _stage_times(self, start=False):
        """The int64 (nodes * stages) sums of profiled stage times, emptied when a node's
        profile has changed since they began (they would be shown under the new one's
        name); None before the first profiled compute unless start."""
        profiles = [t._profile_raw() for t in self.nodes]
        if (self._stage_ns is None and start) or \
                (self._stage_ns is not None and profiles != self._stage_profiles):
            self._stage_ns = np.zeros(len(self.nodes) * len(STAGES), np.int64)
            self._stage_profiles = profiles
        return self._stage_ns

    def stats(self):
        """Per-node times (µs) accumulated by compute(profile=True) since the nodes'
        profiles last changed, as Stats rows."""
        ns = self._stage_times()
        if ns is None:
            raise ValueError("stats: no profiled compute yet (call compute(profile=True))")
        ns = ns.reshape(len(self.nodes), len(STAGES))
        return Stats(StatRow(i, t.op, t.shape, t.type, t.profile.name,
                             ns[i, 0] / 1e3, ns[i, 1] / 1e3, ns[i, 2] / 1e3)
                     for i, t in enumerate(self.nodes))

    def reset_stats(self):
        """Forget accumulated timings."""
        if self._stage_ns is not None:
            self._stage_ns[:] = 0
