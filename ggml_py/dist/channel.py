"""How the ranks of a split model talk besides the all-reduces inside each graph: rank 0's
orders (what every rank runs next: a forward pass, a batch step, a change of the KV
cache), and the gathering of the logits, of which each rank computes a slice of the
vocabulary.

An order is a small tuple (token ids, positions, slot lists: never activations),
broadcast from rank 0. A rank waiting for one polls for it, spinning for SPIN_S and then
sleeping between polls, so that ranks whose rank 0 is idle (a server between requests)
do not each hold a core (MPICH's blocking calls spin for as long as they wait).
"""
import contextlib
import os
import pickle
import time

import numpy as np

from ggml_py.dist.launch import rank_line

SPIN_S = 0.01       # a waiting rank polls this long for the next order, then sleeps ...
SLEEP_S = 0.0002    # ... this long between polls
INLINE = 4096       # bytes of the first broadcast: a decode step's order fits in it
ABORT_GRACE_S = 0.5  # between a rank's error line and MPI_Abort (see collective)


class Channel:
    """Rank 0's orders to the other ranks of `comm` (an mpi4py intracommunicator)."""

    def __init__(self, comm):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        # an order's length (int64), then its first INLINE - 8 bytes; the rest, if any,
        # follows in a second broadcast (one collective a step for small orders)
        self._first = np.zeros(INLINE, np.uint8)
        self.closed = False      # rank 0 has sent its last order ("close")

    def send(self, *order):
        """Rank 0: broadcast an order (a tuple of picklable values) to the other ranks;
        RuntimeError once they have been told to stop (nobody would take it)."""
        if self.closed:
            raise RuntimeError("the other ranks of this split model have stopped serving "
                               "(its Llama is closed)")
        self.closed = order[0] == "close"
        data = pickle.dumps(order, protocol=pickle.HIGHEST_PROTOCOL)
        first = self._first
        first[:8] = np.frombuffer(np.int64(len(data)).tobytes(), np.uint8)
        head = min(len(data), INLINE - 8)
        first[8:8 + head] = np.frombuffer(data, np.uint8, head)
        self.comm.Ibcast(first, root=0).Wait()
        if len(data) > head:
            self.comm.Bcast(bytearray(data[head:]), root=0)

    def receive(self):
        """Another rank: the next order of rank 0 (waits for it)."""
        first = self._first
        request = self.comm.Ibcast(first, root=0)
        deadline = time.perf_counter() + SPIN_S
        while not request.Test():
            if time.perf_counter() > deadline:
                time.sleep(SLEEP_S)
        n = int(first[:8].view(np.int64)[0])
        head = min(n, INLINE - 8)
        data = bytearray(first[8:8 + head])
        if n > head:
            rest = bytearray(n - head)
            self.comm.Bcast(rest, root=0)
            data += rest
        return pickle.loads(data)


def top_candidates(row, k):
    """The ids of the k highest of row (float32 (n,), no NaN), ties taken lowest id
    first: the candidates the sampler's top-k keeps (model/sampling.top_k's rule)."""
    n = len(row)
    if k >= n:
        return np.arange(n)
    if k == 1:
        return np.array([int(np.argmax(row))])
    kth = -np.partition(-row, k - 1)[k - 1]
    above = np.flatnonzero(row > kth)
    tied = np.flatnonzero(row == kth)[:k - len(above)]
    return np.concatenate([above, tied])


def gather_logits(comm, local, bounds, k):
    """Rank 0 gets the logits (n, V): every rank's columns bounds[r] .. bounds[r + 1] - 1.

    local: this rank's float32 (n, bounds[r+1] - bounds[r]). k None: whole rows are
    gathered; k an int: only each row's k highest of each rank (a sampler that keeps the
    top k, greedy's 1), and rank 0's array is -inf elsewhere. Returns the (n, V) array on
    rank 0, None on the others. Every rank calls it with the same n and k.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    n, V = local.shape[0], bounds[-1]
    widths = np.diff(bounds)
    if k is None or k >= widths.min():
        send = np.ascontiguousarray(local, np.float32)
        counts = n * widths
        recv = np.empty(n * V, np.float32) if rank == 0 else None
        comm.Gatherv(send, [recv, counts, n * np.asarray(bounds[:-1]), _mpi().FLOAT] if rank == 0
                     else None, root=0)
        if rank != 0:
            return None
        out = np.empty((n, V), np.float32)
        for r in range(size):
            out[:, bounds[r]:bounds[r + 1]] = recv[n * bounds[r]:n * bounds[r + 1]].reshape(n, widths[r])
        return out
    # each row's k best: values and global ids, packed in one int32 buffer (n, 2k)
    send = np.empty((n, 2 * k), np.int32)
    local = np.asarray(local, np.float32)
    for i in range(n):
        row = _nan_as_lowest(local[i])
        ids = top_candidates(row, k)
        send[i, :k] = row[ids].view(np.int32)
        send[i, k:] = ids + bounds[rank]
    recv = np.empty((size, n, 2 * k), np.int32) if rank == 0 else None
    comm.Gather(send, recv, root=0)
    if rank != 0:
        return None
    out = np.full((n, V), -np.inf, np.float32)
    rows = np.arange(n)[:, None]
    for r in range(size):
        out[rows, recv[r, :, k:]] = recv[r, :, :k].view(np.float32)
    return out


def _nan_as_lowest(row):
    """row, or (where it holds a NaN) a copy with its NaNs -inf: never a candidate."""
    if not np.isnan(row.max()):      # (max is NaN where any value is)
        return row
    return np.where(np.isnan(row), np.float32(-np.inf), row)


def _mpi():
    from mpi4py import MPI  # (a communicator is in use: loaded already)
    return MPI


@contextlib.contextmanager
def collective(comm):
    """Around a part every rank runs together (an order's forward pass and gather): an
    exception in it leaves the other ranks waiting in a collective call for good, so it
    ends the whole job (MPI_Abort), after a line on stderr that names the rank."""
    try:
        yield
    except BaseException as exc:   # noqa: BLE001 - any end of a step ends the job
        interrupted = isinstance(exc, KeyboardInterrupt)
        what = "interrupted" if interrupted else f"error: {exc}" if str(exc) else \
            f"error: {type(exc).__name__}"
        rank_line(f"rank {comm.Get_rank()}: {what} (a split model's ranks wait for each other: "
                  f"ending every rank)")
        # mpiexec forwards each rank's output through a pipe that the abort tears down:
        # on a busy machine the line was lost unless its reader had a moment to run
        time.sleep(ABORT_GRACE_S)
        comm.Abort(130 if interrupted else 1)
        os._exit(1)    # (Abort does not return)
