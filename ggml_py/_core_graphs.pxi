# _core_graphs.pxi: the fork gate and graphs: planning's C side, compute without the GIL. Part of _core.pyx (textually included there):
# it shares that module's cimports and names.

# ---------------------------------------------------------------------------
# the fork gate
#
# OpenBLAS stops its threads in its own fork handler, and with a BLAS product in
# flight in another thread that handler hangs the process for good (numpy's np.dot
# in a thread does the same). So a fork waits until no other thread is running a
# graph, and no run starts while a fork is pending (other fork hooks, run after
# this one, may let other threads run before fork() itself). A run counts once it
# holds its pool, so a fork from a signal handler inside a compute does not wait
# for a thread queued on that pool. The counting is C code: no other thread and no
# signal handler runs between its steps.

cdef dict _runs = {}              # thread id -> graph runs it is inside (nested: a signal handler's)
cdef dict _holds = {}             # thread id -> CGraphs whose nodes its computes hold (queued ones too)
cdef int _forks = 0               # forks pending (from their hook to their return)
cdef object _fork_kept = None     # (thread id, exception type) a signal handler raised in a fork's wait
FORK_POLL_S = 0.002               # how often a fork, or a run held back by one, looks again
FORK_RAISE_DELAY_S = 0.01         # an exception kept from a fork's wait: raised this long after it


cdef int _run_begin() except -1:
    """Count a graph run of this thread; while a fork is pending a first run waits."""
    cdef unsigned long me = PyThread_get_thread_ident()
    while _forks and me not in _runs:
        time.sleep(FORK_POLL_S)       # nothing counted yet: Ctrl-C may end the wait
    _runs[me] = _runs.get(me, 0) + 1
    return 0


cdef void _run_end() noexcept:
    cdef unsigned long me = PyThread_get_thread_ident()
    cdef long n = _runs[me]
    if n == 1:
        del _runs[me]
    else:
        _runs[me] = n - 1


cdef bint _others_running() noexcept:
    cdef unsigned long me = PyThread_get_thread_ident()
    return len(_runs) > (me in _runs)


def _fork_wait():
    """Before a fork: wait for other threads' runs to end. An exception a signal handler
    raises meanwhile (Ctrl-C, a SIGTERM handler's SystemExit) is kept and raised after the
    fork: raised in a fork hook it would be dropped, and the fork would go on."""
    global _forks, _fork_kept
    _forks += 1
    while _others_running():
        try:
            time.sleep(FORK_POLL_S)
        except BaseException as exc:
            if _fork_kept is None:
                _fork_kept = (PyThread_get_thread_ident(), type(exc))


def _raise_in_thread(unsigned long thread_id, exc_type):
    """Raise exc_type in the thread thread_id (at its next bytecode)."""
    PyThreadState_SetAsyncExc(<long> thread_id, <PyObject *> exc_type)


def _fork_done_in_parent():
    """After a fork, in the parent: runs may start; a kept exception is raised in the
    thread that forked once the fork has returned (as its type: a SystemExit's code is lost)."""
    global _forks, _fork_kept
    _forks -= 1
    if _fork_kept is not None:
        timer = threading.Timer(FORK_RAISE_DELAY_S, _raise_in_thread, _fork_kept)
        _fork_kept = None
        timer.daemon = True
        timer.start()


def _fork_done_in_child():
    """In a fork child only the thread that forked lives on."""
    global _runs, _forks, _fork_kept
    cdef unsigned long me = PyThread_get_thread_ident()
    _runs = {me: _runs[me]} if me in _runs else {}
    # the other threads' computes, running or queued for a pool, will never end here:
    # their graphs' nodes are let go (else computing them, or setting a profile, would
    # say another thread computes them, for ever)
    for thread_id, graphs in list(_holds.items()):
        if thread_id != me:
            for g in graphs:
                (<CGraph> g)._hold_profiles(-1)
            del _holds[thread_id]
    _forks = 0
    _fork_kept = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_fork_wait, after_in_parent=_fork_done_in_parent,
                        after_in_child=_fork_done_in_child)


# ---------------------------------------------------------------------------
# graphs

cdef int _abort_requested(void *data) noexcept nogil:
    # Runs the Python signal handlers (installed for main-thread computes only); a raised exception
    # (KeyboardInterrupt) is kept to be re-raised once the executor has stopped.
    with gil:
        try:
            PyErr_CheckSignals()
        except BaseException as exc:
            (<list> data).append(exc)
            return 1
    return 0


cdef class CGraph:
    """The node array the executor walks; keeps its tensors alive."""
    cdef ggml_py_tensor **nodes
    cdef int n_nodes
    cdef readonly tuple tensors

    def __cinit__(self, tensors):
        self.tensors = tuple(tensors)
        self.n_nodes = len(self.tensors)
        self.nodes = <ggml_py_tensor **> malloc(max(1, self.n_nodes) * sizeof(ggml_py_tensor *))
        if self.nodes == NULL:
            raise MemoryError()
        for i, t in enumerate(self.tensors):
            if not isinstance(t, TensorBase):   # the cast below would read any object as a tensor
                raise TypeError(f"CGraph: expected tensors, got {type(t).__name__}")
            self.nodes[i] = (<TensorBase> t).t

    def __dealloc__(self):
        free(self.nodes)

    def __reduce_ex__(self, protocol):
        _refuse_copy(self)

    def work_size(self, int n_threads):
        """Work-buffer bytes at n_threads: the largest need over the nodes, plus a
        cache line per thread (each thread's scratch starts on its own line)."""
        cdef ggml_py_cgraph g
        g.n_nodes = self.n_nodes
        g.nodes = self.nodes
        return ggml_py_graph_work_size(&g, n_threads)

    cdef void _hold_profiles(self, int step):
        """Mark the nodes as computed (+1) or no longer (-1): a profile change meanwhile
        (another thread, a signal handler between nodes) raises instead of running a
        kernel on a work buffer sized for another profile."""
        cdef TensorBase t
        for t in self.tensors:
            t.n_computing += step

    cdef int _check_not_computing(self) except -1:
        """RuntimeError when a node this graph writes is being computed now (this graph or
        another one holding the node, in another thread or the compute a signal handler
        interrupted): both would write its result.
        Checked and then held with the GIL, so two computes cannot both pass."""
        cdef TensorBase t
        for t in self.tensors:
            if t.n_computing and t.t.op not in (GGML_PY_OP_NONE, GGML_PY_OP_VIEW, GGML_PY_OP_RESHAPE,
                                                GGML_PY_OP_PERMUTE, GGML_PY_OP_TRANSPOSE):
                raise RuntimeError("compute: this graph's nodes are already being computed (by "
                                   "another thread, or the compute a signal handler runs in); a "
                                   "graph holds one set of results: build a graph per thread")
        return 0

    def compute(self, ThreadPool pool, work, stage_ns, int lookahead, double abort_interval_ms):
        """Run every node.

        Raises KeyboardInterrupt (or what a signal handler raised) when aborted,
        ValueError naming the op and node when a kernel meets a bad row id.
        """
        cdef ggml_py_cgraph g
        cdef ggml_py_cplan plan
        cdef ggml_py_pool *cpool = NULL
        cdef list raised = []
        cdef int status
        cdef int32_t failed_node = -1
        g.n_nodes = self.n_nodes
        g.nodes = self.nodes
        memset(&plan, 0, sizeof(plan))
        if work is not None:
            plan.work_size = work.nbytes
            plan.work_data = <void *> (<uintptr_t> work.ctypes.data)
        if stage_ns is not None:
            if stage_ns.dtype != np.int64 or stage_ns.size < self.n_nodes * GGML_PY_N_STAGES:
                raise ValueError("stage_ns must be int64 with n_nodes * 3 entries")
            plan.stage_ns = <int64_t *> (<uintptr_t> stage_ns.ctypes.data)
        plan.lookahead = lookahead
        plan.failed_node = &failed_node
        # Python runs signal handlers in the main thread only: elsewhere the check would
        # only take the GIL, and a daemon thread's compute still running after the
        # interpreter has finalized would crash taking it (PyGILState_Ensure)
        if abort_interval_ms >= 0 and threading.current_thread() is threading.main_thread():
            plan.abort_callback = _abort_requested
            plan.abort_data = <void *> raised
            plan.abort_interval_ns = <int64_t> (abort_interval_ms * 1e6)
        if pool is not None and pool.pool == NULL:
            raise ValueError("compute: the ThreadPool is closed")
        self._check_not_computing()
        self._hold_profiles(1)
        cdef unsigned long me = PyThread_get_thread_ident()
        _holds.setdefault(me, []).append(self)
        try:
            # the work buffer was sized before the profiles were held: a profile set in
            # between (another thread) may need more, which no kernel must find out
            if ggml_py_graph_work_size(&g, pool.n_threads if pool is not None else 1) > plan.work_size:
                raise RuntimeError("compute: a node's profile changed while the compute started "
                                   "(its work buffer is too small); compute again")
            if pool is not None:
                pool._lock("compute")   # another thread's compute on this pool finishes first
            try:
                if pool is not None:
                    if pool.pool == NULL:
                        raise ValueError("compute: the ThreadPool is closed")
                    cpool = pool.pool
                _run_begin()            # a fork from another thread waits for this run
                try:
                    with nogil:
                        status = ggml_py_graph_compute(&g, &plan, cpool)
                finally:
                    _run_end()
            finally:
                if pool is not None:
                    pool._unlock()
        finally:
            held = _holds.get(me)
            if held is not None and self in held:   # (unless a fork child let it go)
                held.remove(self)
                if not held:
                    del _holds[me]
                self._hold_profiles(-1)
        if status == GGML_PY_STATUS_ABORTED:
            if raised:
                raise raised[0]
            raise KeyboardInterrupt("graph compute aborted")
        if status != GGML_PY_STATUS_OK:
            op = _OP_NAMES.get((<TensorBase> self.tensors[failed_node]).t.op, "?")
            if status == GGML_PY_STATUS_BAD_INDEX:
                raise ValueError(_bad_row_id(self.tensors[failed_node], op, failed_node))
            if status == GGML_PY_STATUS_COMM:
                raise RuntimeError(_comm_failed(self.tensors[failed_node], op, failed_node))
            raise RuntimeError(f"{op}: compute failed with status {status} (node {failed_node})")


def _comm_failed(node, op, index):
    """The message for an ALL_REDUCE node whose MPI call failed: its MPI error code (the
    MPI library's own text for it is MPI.Get_error_string(code), in mpi4py)."""
    cdef ggml_py_comm c
    memcpy(&c, (<TensorBase> node).t.op_params, sizeof(c))
    return (f"{op}: MPI_Allreduce of {node.shape} failed with MPI error code {c.last_error} "
            f"(node {index}): another process of the communicator may have ended")


def _bad_row_id(node, op, index):
    """The message for a get_rows / set_rows node whose ids leave its rows: the first
    such id, the rows there are, and the shapes."""
    if node.op == GGML_PY_OP_ATTENTION:
        return (f"{op}: kv_index {node.src[3].shape} names a slot outside 0..{node.src[1]._ne[1] - 1} "
                f"or a list outside its slot lists (node {index})")
    rows = node.src[0] if node.op == GGML_PY_OP_GET_ROWS else node    # set_rows: dst's view
    ids = node.src[1]
    n_rows = rows._ne[1]
    values = ids.numpy()
    bad = values[(values < 0) | (values >= n_rows)]
    which = f"row id {int(bad.flat[0])}" if bad.size else "a row id"
    if n_rows == 0:
        return f"{op}: {which} asks for a row of a {rows.shape}, which has none (node {index})"
    return (f"{op}: {which} is outside 0..{n_rows - 1} (a {rows.shape} has {n_rows} rows "
            f"in each matrix; ids {ids.shape}) (node {index})")
