"""Whether this process was started by mpiexec, and the program side of a split model:
rank 0 runs the program, the other ranks serve it (docs/distributed.md)."""
import os
import signal
import sys
import threading
import time

# set by the process managers of MPICH (Hydra: PMI_*), Open MPI and PMIx for each process
MPIEXEC_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE")


def rank_line(text):
    """text and a newline on stderr in one write: mpiexec merges the ranks' pipes into one,
    so a line written in two parts (print's text, then its newline) may be cut by another
    rank's line."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def launched_by_mpiexec():
    """Whether a process manager (mpiexec) started this process."""
    return any(name in os.environ for name in MPIEXEC_VARIABLES)


def mpiexec_size():
    """The processes mpiexec started with this one, from its environment (no MPI import);
    1 when not started by mpiexec (or it does not say)."""
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"):
        try:
            return max(1, int(os.environ[name]))
        except (KeyError, ValueError):
            continue
    return 1


def world():
    """MPI.COMM_WORLD when mpiexec started this program with more than one process, else
    None; mpi4py is imported only under mpiexec. ValueError where it is not installed."""
    if not launched_by_mpiexec():
        return None
    # MPICH (read at MPI_Init): a wait inside a collective sleeps (nanosleep) between
    # spells of polling instead of only yielding, so that a rank waiting for another
    # leaves it the core where they share one (measured on a busy 2-core machine:
    # 2 ranks' decode x1.2 - x1.6); a user's own setting wins
    os.environ.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
    try:
        from mpi4py import MPI
    except ImportError:
        raise ValueError("started by mpiexec with --tp, but mpi4py is not installed: "
                         "pip install 'ggml_py[mpi]'") from None
    comm = MPI.COMM_WORLD
    return comm if comm.Get_size() > 1 else None


_joined = False   # this process has taken part in the ranks' start (join_start)


def join_start(comm, error=None):
    """Every rank of a program's split model, where the ranks meet to load it: they
    learn whether each got as far as loading the model (error: this rank's exception,
    or None). Raises error (this rank's) or, where another rank failed, ValueError
    naming it, on every rank: a rank that stopped early (a bad flag, a file missing on
    its host) then ends the others instead of leaving them waiting for it."""
    global _joined
    _joined = True
    message = None if error is None else (str(error) or type(error).__name__)
    failed = [(r, m) for r, m in enumerate(comm.allgather(message)) if m is not None]
    if error is not None:
        raise error
    if failed:
        raise ValueError("; ".join(f"rank {r} stopped before loading the model: {m}"
                                   for r, m in failed) + " (a split model needs every rank)")


def leave_before_start(argv, status):
    """A program's rank that ends before join_start (a bad flag or input, --help, an
    error of rank 0 before it loads the model) when it was asked to split the model
    (--tp in argv) under mpiexec with more processes: it joins the start with that
    failure, so that the other ranks, which wait there, stop too (its own error line says
    why). status: how it ended, an exit status or the exception."""
    if _joined or "--tp" not in argv or mpiexec_size() < 2:
        return
    try:
        comm = world()
    except ValueError:
        return
    if comm is None:
        return
    if isinstance(status, SystemExit):
        status = status.code or 0
    if isinstance(status, BaseException):
        what = str(status) or type(status).__name__
    else:
        what = f"exit status {status}"
    try:
        join_start(comm, RuntimeError(what))
    except RuntimeError:
        pass


def serve_and_exit(llm, log=False):
    """A program's rank other than 0: run rank 0's steps until it closes its Llama (it
    does at exit), then end the process with status 0. Ctrl-C and SIGTERM, which mpiexec
    passes to every rank, are rank 0's to handle (rank 0 ending by one ends the job); a
    SIGTERM this rank alone was sent (a scheduler's, `kill`) ends every rank when rank 0
    has not ended the job TERM_GRACE_S later.
    log (--tp-log): this rank says on stderr what it holds, and at the end how long it
    served (lines starting "rank N:"); otherwise it writes nothing but its errors (and
    open_llama's warning of F32 copies)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: end_job_unless_ended(llm.comm))
    if log:
        rank_line(share_line(llm))
    start = time.perf_counter()
    llm.serve()
    if log:
        rank_line(f"rank {llm.rank}: served rank 0's steps for {time.perf_counter() - start:.2f} s")
    raise SystemExit(0)


TERM_GRACE_S = 10.0   # a SIGTERM of a serving rank: the time rank 0 has to end the job first


def end_job_unless_ended(comm):
    """After a SIGTERM of a serving rank: in TERM_GRACE_S, unless this process has ended by
    then (rank 0 ended the job: mpiexec passed the signal to every rank), one line on
    stderr and MPI_Abort for every rank (a timer thread: the main one may be in a step)."""
    def end():
        rank_line(f"rank {comm.Get_rank()}: terminated (SIGTERM): ending every rank")
        comm.Abort(143)
    timer = threading.Timer(TERM_GRACE_S, end)
    timer.daemon = True
    timer.start()


def share_line(llm):
    """One line on what rank llm.rank of a split model holds: its heads, its weights'
    bytes, its threads."""
    share, whole = llm.model.config, llm.config
    weights = llm.model.weights
    matrices = [w for lw in weights.layers for w in vars(lw).values() if w is not None]
    mib = sum(w.nbytes for w in matrices + [weights.output]) / 2**20
    return (f"rank {llm.rank} of {llm.n_ranks}: {share.n_head} of {whole.n_head} query heads, "
            f"{share.n_head_kv} of {whole.n_head_kv} KV heads, {mib:.1f} MiB of weights, "
            f"{llm.model.n_threads} thread{'s' if llm.model.n_threads != 1 else ''}")
