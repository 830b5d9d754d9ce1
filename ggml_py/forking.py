"""A fork waits for the computes running in other threads, and holds new ones back.

OpenBLAS stops its threads in its own fork handler; with a BLAS product in flight
in another thread that handler hangs the process for good (numpy's np.dot in a
thread does the same). So `os.fork()` (multiprocessing's "fork" start method)
first waits until no other thread is inside a graph compute — one graph's run,
seconds at most — and no compute starts until the fork is done.
"""
import collections
import contextlib
import os
import threading

_gate = threading.Condition()
_running = collections.Counter()   # thread id -> computes it is inside
_forks = 0                          # forks waiting for the computes to end


@contextlib.contextmanager
def computing():
    """Around one graph compute: waits while a fork is pending (unless this thread
    is already computing: a compute from a signal handler inside another)."""
    me = threading.get_ident()
    with _gate:
        _gate.wait_for(lambda: not _forks or me in _running)
        _running[me] += 1
    try:
        yield
    finally:
        with _gate:
            _running[me] -= 1
            if not _running[me]:
                del _running[me]
            _gate.notify_all()


def _before_fork():
    global _forks
    me = threading.get_ident()
    with _gate:
        _forks += 1
        try:
            _gate.wait_for(lambda: not (_running.keys() - {me}))
        except BaseException:      # Ctrl-C while waiting: the fork goes on regardless
            _forks -= 1
            _gate.notify_all()
            raise


def _after_fork_in_parent():
    global _forks
    with _gate:
        _forks = max(_forks - 1, 0)
        _gate.notify_all()


def _after_fork_in_child():
    # only the thread that forked lives on; the gate may be held by a thread that is gone
    global _gate, _running, _forks
    me = threading.get_ident()
    _gate = threading.Condition()
    _running = collections.Counter({me: _running[me]} if _running.get(me) else {})
    _forks = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
