"""A fork waits for the computes running in other threads, and holds new ones back.

OpenBLAS stops its threads in its own fork handler; with a BLAS product in flight
in another thread that handler hangs the process for good (numpy's np.dot in a
thread does the same). So `os.fork()` (multiprocessing's "fork" start method)
first waits until no other thread is running a graph (one graph's run: a forward
pass of a model), and no run starts until the fork is done. A compute counts from
the moment it holds its pool, so one still waiting for a pool held by the forking
thread (a fork from a signal handler inside a compute) is not waited for.
Ctrl-C while a fork waits is kept until the fork is done, then raised.
"""
import _thread
import os
import threading

_gate = threading.Condition()
_running = {}          # thread id -> graph runs it is inside (nested: a signal handler's)
_forks = 0             # forks waiting for the runs to end
_interrupted = False   # Ctrl-C came while a fork waited
AFTER_FORK_S = 0.01    # a Ctrl-C raised in a fork hook would be dropped: raised this much later


def enter():
    """Before a graph runs (its pool held): waits while a fork is pending, unless this
    thread is already running one (a compute from a signal handler inside another).

    Without a pending fork this is two dict operations: the GIL makes them safe, as a
    fork holds the GIL from its last look at _running through fork() itself, so no
    run can start in between."""
    me = threading.get_ident()
    if _forks and me not in _running:
        with _gate:
            _gate.wait_for(lambda: not _forks)
    _running[me] = _running.get(me, 0) + 1


def leave():
    """After a graph ran (enter's other half)."""
    me = threading.get_ident()
    if _running[me] == 1:
        del _running[me]
    else:
        _running[me] -= 1
    if _forks:
        with _gate:
            _gate.notify_all()


def _others_running():
    return any(t != threading.get_ident() for t in _running)


def _before_fork():
    global _forks, _interrupted
    with _gate:
        _forks += 1
        while _others_running():
            try:
                _gate.wait()
            except KeyboardInterrupt:    # raised here it would be dropped and the fork go on
                _interrupted = True


def _after_fork_in_parent():
    global _forks, _interrupted
    with _gate:
        _forks -= 1
        _gate.notify_all()
        interrupted, _interrupted = _interrupted, False
    if interrupted:   # the Ctrl-C, raised in the main thread once the fork has returned
        threading.Timer(AFTER_FORK_S, _thread.interrupt_main).start()


def _after_fork_in_child():
    # only the thread that forked lives on; the gate may be held by a thread that is gone
    global _gate, _running, _forks, _interrupted
    me = threading.get_ident()
    _gate = threading.Condition()
    _running = {me: _running[me]} if me in _running else {}
    _forks = 0
    _interrupted = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
