"""The worker pool and executor: many random profiles without deadlock, idle
workers that really sleep during `wait` stages, Ctrl-C, pool lifetime."""
import faulthandler
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest

import ggml_py as gg
from ggml_py.core import graph as core_graph

WATCHDOG_S = 240   # a deadlock kills the run with every thread's traceback


@pytest.fixture
def watchdog():
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def small_graph(rng):
    """A few nodes of different ops; returns (graph, output, numpy reference)."""
    ctx = gg.Context(mem_size=4 << 20)
    a_np = rng.standard_normal((13, 24)).astype(np.float32)
    b_np = rng.standard_normal((5, 24)).astype(np.float32)
    c_np = rng.standard_normal((5, 13)).astype(np.float32)
    a, b, c = ctx.from_numpy(a_np), ctx.from_numpy(b_np), ctx.from_numpy(c_np)
    y = gg.soft_max(gg.add(gg.mul_mat(a, b), c), scale=0.5)
    y = gg.rms_norm(gg.mul(y, c), eps=1e-6)
    ref = (b_np @ a_np.T + c_np) * 0.5
    ref = np.exp(ref - ref.max(1, keepdims=True))
    ref = ref / ref.sum(1, keepdims=True) * c_np
    ref = ref / np.sqrt((ref * ref).mean(1, keepdims=True) + 1e-6)
    return gg.build_forward(y), y, ref


def randomize_profiles(graph, rng):
    """Random parallel/wait flags on every valid stage of every node."""
    for node in graph.nodes:
        p = node.profile
        for stage in ("init", "compute", "finalize"):
            if getattr(p, stage).valid:
                p = p.with_stage(stage, parallel=bool(rng.integers(2)), wait=bool(rng.integers(2)))
        node.profile = p


def test_stress_random_profiles_and_threads(watchdog):
    rng = np.random.default_rng(0)
    pools = {n: gg.ThreadPool(n, policy=policy, spin_us=spin)
             for n, policy, spin in ((1, "spin-then-sleep", 50), (2, "spin-then-sleep", 20),
                                     (3, "sleep", 0), (4, "spin", 0), (8, "spin-then-sleep", 5))}
    graphs = [small_graph(rng) for _ in range(4)]
    for i in range(10_000):
        graph, y, ref = graphs[i % len(graphs)]
        randomize_profiles(graph, rng)
        graph.lookahead = int(rng.integers(0, 6))
        pool = pools[int(rng.choice(list(pools)))]
        graph.compute(pool=pool)
        if i % 97 == 0:
            np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-5)
    for pool in pools.values():
        pool.close()


def test_pools_from_many_python_threads(watchdog):
    """Each Python thread drives its own pool; the GIL is released while computing."""
    errors = []

    def work(seed):
        try:
            rng = np.random.default_rng(seed)
            graph, y, ref = small_graph(rng)
            with gg.ThreadPool(2, spin_us=10) as pool:
                for _ in range(300):
                    graph.compute(pool=pool)
            np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-5)
        except Exception as exc:   # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def long_single_stage_graph(wait):
    """One big mul_mat whose COMPUTE runs on the main thread only (~0.1 s)."""
    rng = np.random.default_rng(1)
    ctx = gg.Context(mem_size=96 << 20)
    a = ctx.from_numpy(rng.standard_normal((2048, 2048)).astype(np.float32))
    b = ctx.from_numpy(rng.standard_normal((384, 2048)).astype(np.float32))
    y = gg.mul_mat(a, b)
    graph = gg.build_forward(y)
    node = graph.nodes[0]
    by_name = {p.name: p for p in node.profiles()}
    single = by_name.get("blas", by_name["cpu"])    # sgemm on the calling thread only
    node.profile = single.with_stage("compute", parallel=False, wait=wait)
    return graph


def worker_cores_used(graph, pool, min_seconds=0.6):
    """CPU time of every thread but this one / wall time, while computing.

    Per-thread times keep the measure honest on a busy machine: the main thread
    does the work; what the workers burn beside it is the idle cost.
    """
    graph.compute(pool=pool)   # warm up: page in, settle the workers
    proc, me = psutil.Process(), threading.get_native_id()

    def others():
        return sum(t.user_time + t.system_time for t in proc.threads() if t.id != me)

    # long enough for the kernel's 10 ms CPU-time ticks to be a small error
    t0, c0 = time.perf_counter(), others()
    while time.perf_counter() - t0 < min_seconds:
        graph.compute(pool=pool)
    t1, c1 = time.perf_counter(), others()
    return (c1 - c0) / (t1 - t0)


def test_wait_stage_puts_workers_to_sleep():
    graph = long_single_stage_graph(wait=True)
    with gg.ThreadPool(2, policy="spin") as pool:
        idle = worker_cores_used(graph, pool)
        sleeps = pool.stats()["sleeps"]
    assert idle < 0.05, f"the idle worker used {100 * idle:.1f} % of a core during a wait stage"
    assert sleeps >= 1


def test_without_wait_spinning_workers_burn_a_core():
    graph = long_single_stage_graph(wait=False)
    with gg.ThreadPool(2, policy="spin") as pool:
        idle = worker_cores_used(graph, pool)
        sleeps = pool.stats()["sleeps"]
    assert sleeps == 0, "without wait, spin-policy workers must never sleep"
    # A spinning worker yields its core now and then, so on a machine already
    # busier than its cores it gets little CPU; judge CPU time only when it is free.
    if os.getloadavg()[0] < psutil.cpu_count() - 0.5:
        assert idle > 0.3, f"spin policy should keep the worker busy: {100 * idle:.1f} % of a core"


def test_spin_then_sleep_stops_spinning_after_the_budget():
    graph = long_single_stage_graph(wait=False)
    with gg.ThreadPool(2, policy="spin-then-sleep", spin_us=100) as pool:
        idle = worker_cores_used(graph, pool)
    assert idle < 0.05, f"the worker kept spinning past its budget: {100 * idle:.1f} % of a core"


def long_graph(n_nodes=1000):
    """Many few-ms nodes: a long compute that can be interrupted between nodes."""
    rng = np.random.default_rng(2)
    ctx = gg.Context(mem_size=(8 << 20) + n_nodes * (80 << 10))   # a, then 64 KiB per node
    a = ctx.from_numpy(rng.standard_normal((1024, 1024)).astype(np.float32) / 32)
    x = ctx.from_numpy(rng.standard_normal((16, 1024)).astype(np.float32))
    for _ in range(n_nodes):
        x = gg.mul_mat(a, x)
    return gg.build_forward(x)


def test_ctrl_c_interrupts_the_compute_part_way(watchdog):
    graph = long_graph(n_nodes=3000)   # 1 - 2 s: well past the signal on a fast machine
    pool = gg.ThreadPool(2)
    sent = []

    def interrupt():
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)   # a background job ignores it
    timer = threading.Timer(0.3, interrupt)
    timer.start()
    t_start = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            graph.compute(pool=pool, profile=True)
        raised = time.perf_counter()
    finally:
        timer.join()
        signal.signal(signal.SIGINT, previous)
    assert sent, "the compute finished before the signal was sent"
    assert raised - t_start > 0.25
    # stopped part-way (no wall-clock bound: a loaded machine may be slow to deliver it):
    # the first nodes ran, the last ones did not
    ran = [r.compute_us > 0 for r in graph.stats()]
    assert ran[0] and not ran[-1], f"{sum(ran)} of {len(ran)} nodes ran"

    # the pool is still usable
    rng = np.random.default_rng(3)
    graph2, y, ref = small_graph(rng)
    graph2.compute(pool=pool)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-5)
    pool.close()


def test_a_profile_cannot_change_while_its_node_is_computed(watchdog):
    # the compute sized its work buffer for the profiles it started with: a profile
    # needing more (blas-split on a quantized weight: all of it in f32) set meanwhile,
    # from another thread or from a signal handler (run between nodes), overran it
    graph = long_graph()
    node = graph.nodes[-1]
    before = node.profile
    other = next(p for p in node.profiles() if p.name != before.name)
    errors = []

    def from_another_thread():
        time.sleep(0.1)
        try:
            node.profile = other
        except RuntimeError as e:
            errors.append(str(e))

    thread = threading.Thread(target=from_another_thread)
    thread.start()
    graph.compute(n_threads=2)
    thread.join()
    assert errors and "this mul_mat node is being computed" in errors[0]
    assert node.profile == before

    def handler(signum, frame):
        node.profile = other
    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(RuntimeError, match="being computed"):
            graph.compute(n_threads=2)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    node.profile = other           # between computes, as ever
    assert node.profile.name == other.name


def test_a_graph_computes_in_one_thread_at_a_time(watchdog):
    # a second compute of the same nodes (another thread; here a signal handler run
    # between nodes) would write the same results: refused, the first one unharmed
    graph = long_graph()
    graph.compute(n_threads=1)
    expected = graph.nodes[-1].numpy().copy()
    errors = []

    def handler(signum, frame):
        try:
            graph.compute(n_threads=1)
        except RuntimeError as e:
            errors.append(str(e))
    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        graph.compute(n_threads=2)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert errors and "already being computed" in errors[0]
    np.testing.assert_array_equal(graph.nodes[-1].numpy(), expected)
    graph.compute(n_threads=1)     # afterwards, as ever


def test_a_profile_set_between_sizing_and_starting_is_caught():
    # Graph.compute sizes the work buffer, then the C compute holds the profiles: a profile
    # that needs more, set in between (another thread), must not reach a kernel
    rng = np.random.default_rng(0)
    ctx = gg.Context(mem_size=8 << 20)
    w = ctx.from_numpy(rng.standard_normal((256, 256)).astype(np.float32), type=gg.Q8_0)
    x = ctx.from_numpy(rng.standard_normal((4, 256)).astype(np.float32))
    y = gg.mul_mat(w, x)
    graph = gg.build_forward(y)
    node = graph.nodes[-1]
    node.profile = next(p for p in node.profiles() if p.name == "cpu")
    blas = next(p for p in node.profiles() if p.name == "blas")
    sized = graph._work_buffer

    def sized_then_changed(n, page_in=False):
        work = sized(n, page_in)
        node.profile = blas          # de-quantizes all of w into the work buffer
        return work

    graph._work_buffer = sized_then_changed
    with pytest.raises(RuntimeError, match="profile changed while the compute started"):
        graph.compute(n_threads=1)
    del graph._work_buffer
    graph.compute(n_threads=1)       # sized for blas now: runs
    assert np.isfinite(y.numpy()).all()


def test_closed_pool_is_an_error():
    pool = gg.ThreadPool(2)
    pool.close()
    pool.close()   # closing twice is fine
    graph, _, _ = small_graph(np.random.default_rng(4))
    with pytest.raises(ValueError, match="closed"):
        graph.compute(pool=pool)


@pytest.mark.parametrize("kwargs, match", [
    ({"n_threads": 0}, "n_threads"),
    ({"n_threads": 100000}, "n_threads"),
    ({"n_threads": 2, "policy": "nap"}, "policy"),
    ({"n_threads": 2, "spin_us": -1.0}, "spin_us"),
])
def test_bad_pool_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gg.ThreadPool(**kwargs)


def test_more_threads_than_cores_and_cached_pools():
    graph, y, ref = small_graph(np.random.default_rng(5))
    for n in (1, 2, 3, 8, 16):
        y.numpy()[:] = 0
        graph.compute(n_threads=n)
        np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-5)
    assert gg.shared_pool(3) is gg.shared_pool(3)


def test_a_shared_pool_is_not_closed_under_its_other_users():
    # `with gg.shared_pool(2) as p:` in one thread while another computes with
    # n_threads=2 (the same pool): closing it made the other's computes fail
    graph, y, ref = small_graph(np.random.default_rng(7))
    other, _, _ = small_graph(np.random.default_rng(8))
    stop, errors = threading.Event(), []

    def compute_until_stopped():
        while not stop.is_set():
            try:
                graph.compute(n_threads=2)
            except Exception as exc:      # noqa: BLE001 - recorded, the test fails on it
                errors.append(exc)
                return

    worker = threading.Thread(target=compute_until_stopped)
    worker.start()
    try:
        for _ in range(300):
            with gg.shared_pool(2) as pool:
                other.compute(pool=pool)
            pool.close()
    finally:
        stop.set()
        worker.join()
    assert errors == [] and not gg.shared_pool(2).closed and gg.shared_pool(2) is pool
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-5)


def test_default_threads_are_no_more_than_the_cpus_the_process_may_use(monkeypatch):
    # under `taskset -c 0` (or an MPI rank bound to one core) it said 2
    import psutil
    core_graph.default_threads.cache_clear()
    try:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
        assert gg.default_threads() == 1
        core_graph.default_threads.cache_clear()
        # nor more than a pool may have (ggml-main at its default failed on 300 cores)
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(1000)), raising=False)
        monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 1000)
        assert gg.default_threads() == gg.MAX_THREADS
    finally:
        core_graph.default_threads.cache_clear()


def test_pool_n_threads_must_match():
    graph, _, _ = small_graph(np.random.default_rng(6))
    with gg.ThreadPool(2) as pool, pytest.raises(ValueError, match="n_threads"):
        graph.compute(n_threads=3, pool=pool)


# ---- one graph at a time per pool ------------------------------------------------------------

def run_in_threads(targets, timeout_s):
    """Run callables in daemon threads; join with a timeout; returns (still_alive, errors)."""
    errors = []

    def guarded(fn):
        try:
            fn()
        except BaseException as exc:   # reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(fn,), daemon=True) for fn in targets]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [t for t in threads if t.is_alive()], errors


def test_threads_sharing_the_cached_pool_take_turns(watchdog):
    """compute(n_threads=2) from two Python threads uses one cached pool: they must
    take turns (a hang before the pool had a run lock)."""
    def work(seed):
        def run():
            graph, y, ref = small_graph(np.random.default_rng(seed))
            for _ in range(400):
                graph.compute(n_threads=2)
            np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-5)
        return run

    alive, errors = run_in_threads([work(10), work(11)], timeout_s=60)
    assert not alive, "two threads computing on one shared pool hung"
    assert not errors, errors


def test_threads_sharing_an_explicit_pool_take_turns(watchdog):
    pool = gg.ThreadPool(2)

    def work(seed):
        def run():
            graph, y, ref = small_graph(np.random.default_rng(seed))
            for _ in range(300):
                graph.compute(pool=pool)
            np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-5)
        return run

    alive, errors = run_in_threads([work(s) for s in (12, 13, 14)], timeout_s=60)
    assert not alive, "three threads computing on one pool hung"
    assert not errors, errors
    pool.close()


def test_close_waits_for_a_running_compute(watchdog):
    """close() from another thread during a compute waits for it, then closes (it used
    to free the pool under the running compute, which never returned)."""
    graph = long_graph(n_nodes=150)
    pool = gg.ThreadPool(2)

    def close():
        deadline = time.monotonic() + 30
        while not pool.busy and time.monotonic() < deadline:   # the compute holds the pool
            time.sleep(0.0005)
        pool.close()

    alive, errors = run_in_threads([lambda: graph.compute(pool=pool), close], timeout_s=60)
    assert not alive, "compute or close hung"
    assert not errors, errors          # the compute ran to its end on a live pool
    assert pool.closed and not pool.busy
    with pytest.raises(ValueError, match="closed"):
        graph.compute(pool=pool)


@pytest.mark.parametrize("n_threads, exc", [(-1, ValueError), (-5, ValueError), (0, ValueError),
                                            (257, ValueError), (1.5, TypeError),
                                            (True, TypeError), ("2", TypeError)])
def test_bad_thread_counts(n_threads, exc):
    graph, _, _ = small_graph(np.random.default_rng(7))
    with pytest.raises(exc, match="n_threads"):
        graph.compute(n_threads=n_threads)
    with pytest.raises(exc, match="n_threads"):
        graph.plan(n_threads)
    with pytest.raises(exc, match="n_threads"):
        graph.reserve(n_threads)
    with pytest.raises(exc, match="n_threads"):
        gg.ThreadPool(n_threads)
    with gg.ThreadPool(2) as pool, pytest.raises(exc, match="n_threads"):
        graph.compute(n_threads=n_threads, pool=pool)


def test_thread_count_as_numpy_int_and_none():
    graph, y, ref = small_graph(np.random.default_rng(8))
    graph.compute(n_threads=np.int64(2))
    assert graph.plan(np.int32(2)).n_threads == 2
    assert graph.plan().n_threads == gg.default_threads()
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("spin_us, exc", [(float("nan"), ValueError), (float("inf"), ValueError),
                                          (1e300, ValueError), (-0.5, ValueError),
                                          ("10", TypeError), (True, TypeError)])
def test_bad_spin_us(spin_us, exc):
    with pytest.raises(exc, match="spin_us"):
        gg.ThreadPool(2, spin_us=spin_us)


def test_pool_and_graph_cannot_be_copied_or_pickled():
    import copy
    import pickle
    graph, _, _ = small_graph(np.random.default_rng(9))
    with gg.ThreadPool(2) as pool:
        for obj in (pool, graph, graph._cgraph):
            for dup in (copy.copy, copy.deepcopy, pickle.dumps):
                with pytest.raises(TypeError, match="cannot be copied or pickled"):
                    dup(obj)


def wait_for_child(pid, message, timeout_s=30):
    """A forked child's exit code; kill it and fail with `message` if it hangs."""
    deadline = time.time() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.time() > deadline:
            os.kill(pid, signal.SIGKILL)
            pytest.fail(message)
        time.sleep(0.05)


def _compute_in_child(queue):
    ctx = gg.Context(mem_size=1 << 20)
    y = gg.neg(ctx.from_numpy(np.arange(64, dtype=np.float32)))
    gg.build_forward(y).compute(n_threads=2)      # the cached pool, made again here
    queue.put(float(y.numpy().sum()))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_fork_child_makes_its_own_pools_and_exits(watchdog):
    """Pools' workers stay in the parent: in the child the inherited pools read as
    closed, compute(n_threads=n) makes new ones, and exiting joins nobody."""
    import multiprocessing
    ctx = gg.Context(mem_size=1 << 20)
    gg.build_forward(gg.neg(ctx.from_numpy(np.ones(64, np.float32)))).compute(n_threads=2)
    user_pool = gg.ThreadPool(2)
    fork = multiprocessing.get_context("fork")
    queue = fork.Queue()
    child = fork.Process(target=_compute_in_child, args=(queue,))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
        pytest.fail("computing in a fork child hung on the parent's pool")
    assert child.exitcode == 0
    assert queue.get(timeout=5) == -float(np.arange(64).sum())
    pid = os.fork()
    if pid == 0:   # what exiting does (the atexit hook, freeing pools), then out at once
        try:
            core_graph._close_shared_pools()
            user_pool.close()
        finally:
            os._exit(0)
    assert wait_for_child(pid, "a fork child hung closing the pools it inherited") == 0
    with core_graph._pools_lock:    # held at the fork, as by another thread making a pool
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ctx = gg.Context(mem_size=1 << 20)
            y = gg.neg(ctx.from_numpy(np.arange(64, dtype=np.float32)))
            gg.build_forward(y).compute(n_threads=2)
            code = 0 if y.numpy().sum() == -np.arange(64).sum() else 1
        finally:
            os._exit(code)
    assert wait_for_child(pid, "a fork child hung on the pool lock held at the fork") == 0
    user_pool.close()


FORK_WHILE_COMPUTING = """
import os, threading, time
import numpy as np
import ggml_py as gg
rng = np.random.default_rng(0)
ctx = gg.Context(mem_size=16 << 20)
a = ctx.from_numpy(rng.standard_normal((512, 512)).astype(np.float32))
b = ctx.from_numpy(rng.standard_normal((64, 512)).astype(np.float32))
graph = gg.build_forward(gg.mul_mat(a, b))      # M = 64: a BLAS profile, where the build has BLAS
done, stop = [0], []
def loop():
    while not stop:
        graph.compute(n_threads=2)
        done[0] += 1
thread = threading.Thread(target=loop)
thread.start()
time.sleep(0.2)
for _ in range(10):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    before = done[0]
    while done[0] == before:
        time.sleep(0.01)
stop.append(1)
thread.join()
print("forked 10 times; computes", done[0])
"""


LONG_GRAPH = """
import os, signal, threading, time
import numpy as np
import ggml_py as gg
rng = np.random.default_rng(0)
ctx = gg.Context(mem_size=64 << 20)
a = ctx.from_numpy(rng.standard_normal((1024, 1024)).astype(np.float32))
b = ctx.from_numpy(rng.standard_normal((16, 1024)).astype(np.float32))
x = gg.mul_mat(a, b)
for _ in range(N_NODES):
    x = gg.add(x, gg.mul_mat(a, b))
long = gg.build_forward(x)
"""

FORK_FROM_A_SIGNAL_HANDLER = LONG_GRAPH.replace("N_NODES", "200") + """
short = gg.build_forward(gg.mul_mat(a, b))
pool = gg.ThreadPool(1)
waiting = threading.Thread(target=lambda: short.compute(pool=pool))   # waits for the pool
forked = threading.Event()
def handler(signum, frame):
    pid = os.fork()              # inside `long`'s compute, while `waiting` waits for its pool
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    forked.set()
    print("forked in the handler", flush=True)
signal.signal(signal.SIGALRM, handler)
threading.Timer(0.05, waiting.start).start()
signal.setitimer(signal.ITIMER_REAL, 0.2)
long.compute(pool=pool)
while not forked.is_set():       # a fast machine: `long` again until the alarm comes
    long.compute(pool=pool)
waiting.join()
print("both computes done")
"""

FORK_WITH_A_COMPUTE_QUEUED = LONG_GRAPH.replace("N_NODES", "400") + """
short = gg.build_forward(gg.mul_mat(a, b))
pool = gg.ThreadPool(2)
running = threading.Thread(target=lambda: long.compute(pool=pool))
running.start()
time.sleep(0.05)
queued = threading.Thread(target=lambda: short.compute(pool=pool))   # waits for the pool
queued.start()
time.sleep(0.05)
pid = os.fork()                  # waits for `running`; `queued` then holds the pool, not run
if pid == 0:
    short.compute(n_threads=2)   # its nodes are not another thread's here: no such thread
    short.nodes[-1].profile = short.nodes[-1].profile
    print("the child computed the queued graph", flush=True)
    os._exit(0)
os.waitpid(pid, 0)
running.join()
queued.join()
"""

FORK_INTERRUPTED = LONG_GRAPH.replace("N_NODES", "300") + """
signal.signal(signal.SIGINT, signal.default_int_handler)   # even where started ignoring it
started = threading.Event()
def run():
    started.set()
    long.compute(n_threads=1)
    print("compute done", flush=True)
thread = threading.Thread(target=run)
thread.start()
started.wait()
time.sleep(0.05)
threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()   # while the fork waits
try:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    time.sleep(5)
    print("no KeyboardInterrupt")
except KeyboardInterrupt:
    try:
        os.wait()                      # the child: the fork did happen
        print("KeyboardInterrupt after the fork", flush=True)
    except ChildProcessError:
        print("KeyboardInterrupt instead of the fork", flush=True)
thread.join()
"""


FORK_AFTER_INTERRUPTED_COMPUTES = """
import os, signal, threading, time
import numpy as np
import ggml_py as gg
ctx = gg.Context(mem_size=16 << 20)
a = ctx.from_numpy(np.ones((256, 256), np.float32))
graph = gg.build_forward(gg.mul_mat(a, ctx.from_numpy(np.ones((8, 256), np.float32))))
armed = [False]
def handler(signum, frame):
    if armed[0]:
        raise KeyboardInterrupt        # often as a short compute returns
signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)
interrupted, start = 0, time.monotonic()
while time.monotonic() - start < 1:
    try:
        armed[0] = True
        graph.compute(n_threads=1)
        armed[0] = False
    except KeyboardInterrupt:
        armed[0] = False
        interrupted += 1
signal.setitimer(signal.ITIMER_REAL, 0)
def fork():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
thread = threading.Thread(target=fork)
thread.start()
thread.join()
print("forked after", "some" if interrupted else "no", "interrupted computes")
"""

def run_script(script, tmp_path, what):
    """Run a Python script in a new interpreter, outside the source tree (`-c` there
    would import the unbuilt package); its stdout, or a failure if it hangs."""
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=60, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} hung")
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_fork_waits_for_the_computes_of_other_threads(tmp_path):
    # OpenBLAS's fork handler hangs with a BLAS product in flight in another thread
    # (every fork here, before): a fork now waits for the running compute to end
    out = run_script(FORK_WHILE_COMPUTING, tmp_path, "a fork while another thread computed")
    assert "forked 10 times" in out
    # a compute that waits for the pool the forking thread holds is not waited for
    out = run_script(FORK_FROM_A_SIGNAL_HANDLER, tmp_path, "a fork from a signal handler")
    assert out.splitlines() == ["forked in the handler", "both computes done"]
    # a compute interrupted as it ends (a signal handler raising) leaves no run counted
    out = run_script(FORK_AFTER_INTERRUPTED_COMPUTES, tmp_path, "a fork after interrupted computes")
    assert out.strip() == "forked after some interrupted computes"
    # a graph another thread was waiting to compute is the child's to compute
    out = run_script(FORK_WITH_A_COMPUTE_QUEUED, tmp_path, "a fork with a compute queued")
    assert out.strip() == "the child computed the queued graph"
    # Ctrl-C while the fork waits: the fork still waits, then the KeyboardInterrupt comes
    out = run_script(FORK_INTERRUPTED, tmp_path, "a fork interrupted while it waited")
    assert sorted(out.splitlines()) == ["KeyboardInterrupt after the fork", "compute done"]


def test_graph_arguments_of_the_wrong_kind_are_named():
    graph, _, _ = small_graph(np.random.default_rng(8))
    with pytest.raises(TypeError, match="pool must be a ThreadPool, got int"):
        graph.compute(pool=3)
    with pytest.raises(TypeError, match="share_with must be a Graph, got Plan"):
        graph.reserve(2, share_with=graph.plan(2))
    for bad, error in ((1.5, TypeError), (-5, ValueError), (None, TypeError),
                       (10 ** 10, ValueError), (True, TypeError)):
        with pytest.raises(error, match="graph.lookahead must be"):
            graph.lookahead = bad           # refused when set, not at every compute after
    assert graph.lookahead == core_graph.DEFAULT_LOOKAHEAD
    graph.lookahead = np.int64(2)
    assert graph.lookahead == 2 and type(graph.lookahead) is int
    graph.lookahead = 0
    graph.compute(n_threads=2)


@pytest.mark.parametrize("value, on", [("1", True), ("yes", True), ("0", False), ("no", False),
                                       ("false", False), (" off ", False), ("", False)])
def test_force_ref_reads_the_usual_spellings(value, on):
    import subprocess
    import sys
    code = "import ggml_py.core.system as s; print(s.FORCE_REF)"
    import tempfile
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, GGML_PY_FORCE_REF=value),
                          cwd=tempfile.gettempdir())   # the installed package, not a source tree
    assert proc.stdout.strip() == str(on), proc.stderr


DAEMON_COMPUTING_AT_EXIT = """
import ctypes, threading, time
import numpy as np
import ggml_py as gg
ctypes.CDLL(SLOW_EXIT)            # a C exit handler: the process lives on after Python ends
ctx = gg.Context(mem_size=256 << 20)
x = ctx.from_numpy(np.random.default_rng(0).random((4096, 4096), np.float32))
graph = gg.build_forward(*[gg.gelu(x) for _ in range(2)])     # nodes of tens of ms
def loop():
    while True:
        graph.compute(n_threads=1)
threading.Thread(target=loop, daemon=True).start()
time.sleep(0.2)
print("main done")
"""


CC = os.environ.get("CC", "cc")    # as tests/test_tsan.py builds its C


@pytest.mark.skipif(shutil.which(CC) is None, reason="no C compiler to build the slow exit handler")
def test_a_daemon_thread_computing_when_python_exits(tmp_path):
    # a daemon thread's compute went on after the interpreter had finalized and took
    # the GIL for the signal check (only the main thread runs handlers): a segfault
    source = tmp_path / "slow_exit.c"
    source.write_text("#include <unistd.h>\n"
                      "__attribute__((destructor)) static void slow(void) { usleep(500000); }\n")
    library = tmp_path / "libslow_exit.so"
    subprocess.run([CC, "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    script = DAEMON_COMPUTING_AT_EXIT.replace("SLOW_EXIT", repr(str(library)))
    assert run_script(script, tmp_path, "a daemon thread computing at exit") == "main done\n"


def test_the_pool_benchmark_counts_other_threads_cpu_time():
    # the idle cost is workers' CPU time over the wall time: the scheduler's nanosecond
    # counters (or psutil's ticks) of every thread but the caller
    from ggml_py.cli.bench.pool import thread_cpu_seconds
    me = threading.get_native_id()

    def burn():
        start = time.thread_time()
        while time.thread_time() - start < 0.1:
            pass

    # a thread that has ended leaves /proc: measure one that is still there
    done = threading.Event()

    def burn_then_wait():
        burn()
        done.set()
        stop.wait()

    stop = threading.Event()
    worker = threading.Thread(target=burn_then_wait)
    before = thread_cpu_seconds(me)
    worker.start()
    done.wait()
    used = thread_cpu_seconds(me) - before
    stop.set()
    worker.join()
    assert 0.09 <= used < 1.0
