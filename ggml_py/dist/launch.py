"""Whether this process was started by mpiexec, and the program side of a split model:
rank 0 runs the program, the other ranks serve it (docs/distributed.md)."""
import os
import signal
import sys
import time

# set by the process managers of MPICH (Hydra: PMI_*), Open MPI and PMIx for each process
MPIEXEC_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE")


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


def serve_and_exit(llm, log=False):
    """A program's rank other than 0: run rank 0's steps until it closes its Llama (it
    does at exit), then end the process with status 0. Ctrl-C and SIGTERM, which mpiexec
    passes to every rank, are rank 0's to handle (rank 0 ending by one ends the job).
    log (--tp-log): this rank says on stderr what it holds, and at the end how long it
    served (lines starting "rank N:"); otherwise it writes nothing but its errors."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if log:
        print(share_line(llm), file=sys.stderr, flush=True)
    start = time.perf_counter()
    llm.serve()
    if log:
        print(f"rank {llm.rank}: served rank 0's steps for {time.perf_counter() - start:.2f} s",
              file=sys.stderr, flush=True)
    raise SystemExit(0)


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
