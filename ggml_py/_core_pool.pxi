# _core_pool.pxi: the worker pool. Part of _core.pyx (textually included there):
# it shares that module's cimports and names.

# ---------------------------------------------------------------------------
# the worker pool

POLICIES = {"spin-then-sleep": 0, "spin": 1, "sleep": 2}


def check_thread_count(n_threads, where):
    """n_threads as an int in 1..MAX_THREADS, else TypeError / ValueError naming `where`."""
    if isinstance(n_threads, bool) or not isinstance(n_threads, numbers.Integral):
        raise TypeError(f"{where}: n_threads must be an int, got {n_threads!r}")
    n_threads = int(n_threads)
    if not 1 <= n_threads <= GGML_PY_MAX_THREADS:
        raise ValueError(f"{where}: n_threads must be in 1..{GGML_PY_MAX_THREADS}, got {n_threads}")
    return n_threads

_live_pools = weakref.WeakSet()   # every ThreadPool not yet freed


def _forget_pools_after_fork():
    """In a fork child every inherited pool is closed (its workers are the
    parent's): computing on it raises, freeing it joins nobody, and the
    cached pools of compute(n_threads=...) are made again on first use."""
    for pool in list(_live_pools):
        (<ThreadPool> pool)._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools_after_fork)


cdef class ThreadPool:
    """A persistent pool of n_threads (the caller counts as thread 0).

    Workers spin up to spin_us microseconds waiting for work, then sleep on a
    condition variable (policy "spin-then-sleep"); "spin" never sleeps unless a
    stage says wait; "sleep" sleeps as soon as a task is done.
    """
    cdef ggml_py_pool *pool
    cdef pthread_t *threads
    cdef int n_started
    cdef readonly int n_threads
    cdef readonly str policy
    cdef readonly double spin_us
    # One graph at a time: a compute (and close) holds run_lock throughout;
    # `holder` is the Python thread holding it, so that thread cannot wait on itself.
    cdef PyThread_type_lock run_lock
    cdef object holder
    cdef object __weakref__          # _live_pools: forgotten in a fork child

    def __cinit__(self, n_threads, policy="spin-then-sleep", spin_us=200.0):
        self.run_lock = PyThread_allocate_lock()
        if self.run_lock == NULL:
            raise MemoryError("ThreadPool: cannot allocate its lock")
        _live_pools.add(self)
        n_threads = check_thread_count(n_threads, "ThreadPool")
        if not isinstance(policy, str) or policy not in POLICIES:
            raise ValueError(f"ThreadPool: policy must be one of {sorted(POLICIES)}, got {policy!r}")
        if isinstance(spin_us, bool) or not isinstance(spin_us, numbers.Real):
            raise TypeError(f"ThreadPool: spin_us must be a number, got {type(spin_us).__name__}")
        spin_us = float(spin_us)
        if not 0 <= spin_us <= MAX_SPIN_US:   # NaN fails too
            raise ValueError(f"ThreadPool: spin_us must be in 0..{MAX_SPIN_US:g}, got {spin_us}")
        cdef void *mem = NULL
        if posix_memalign(&mem, 64, sizeof(ggml_py_pool)) != 0:
            raise MemoryError("ThreadPool: cannot allocate the pool")
        self.pool = <ggml_py_pool *> mem
        if ggml_py_pool_init(self.pool, n_threads, POLICIES[policy], int(spin_us * 1000)) != 0:
            free(mem)
            self.pool = NULL
            raise RuntimeError("ThreadPool: cannot initialise mutex/condition variable")
        self.n_threads = n_threads
        self.policy = policy
        self.spin_us = spin_us
        self.threads = <pthread_t *> calloc(n_threads, sizeof(pthread_t))
        self.n_started = 1
        for i in range(1, n_threads):
            if pthread_create(&self.threads[i], NULL, ggml_py_pool_worker_main,
                              &self.pool.workers[i]) != 0:
                self._close()
                raise RuntimeError(f"ThreadPool: could not start worker {i}")
            self.n_started += 1

    def close(self):
        """Stop and join the workers; the pool cannot be used afterwards.

        A compute running on the pool in another thread is waited for first."""
        if self.pool == NULL:
            return
        self._lock("ThreadPool.close")
        try:
            self._close()
        finally:
            self._unlock()

    cdef int _lock(self, str what) except -1:
        """Take run_lock, waiting with the GIL released (Ctrl-C still raises)."""
        cdef PyLockStatus got
        if self.run_lock == NULL:   # a fork child could not make its fresh lock
            raise MemoryError(f"{what}: the pool has no lock")
        me = threading.get_ident()
        if self.holder == me:
            raise RuntimeError(f"{what}: this thread is already computing on the pool")
        while True:
            with nogil:
                got = PyThread_acquire_lock_timed(self.run_lock, LOCK_POLL_US, 1)
            if got == PY_LOCK_ACQUIRED:
                break
            PyErr_CheckSignals()
        self.holder = me
        return 0

    cdef void _unlock(self) noexcept:
        self.holder = None
        PyThread_release_lock(self.run_lock)

    cdef void _close(self) noexcept:
        # C-level, so __dealloc__ can call it: a Python method lookup there can
        # fail at interpreter shutdown (a half-torn-down subclass instance)
        if self.pool == NULL:
            return
        with nogil:
            ggml_py_pool_stop(self.pool)
            for i in range(1, self.n_started):
                pthread_join(self.threads[i], NULL)
            ggml_py_pool_destroy(self.pool)
        free(self.pool)
        free(self.threads)
        self.pool = NULL
        self.threads = NULL

    cdef void _forget(self) noexcept:
        # In a fork child: the workers stayed in the parent, and run_lock may be
        # held by a parent thread that does not exist here. Drop the C pool
        # without stopping or joining anyone (its memory is left as it is), so
        # that the pool reads as closed, and take a fresh lock.
        self.pool = NULL
        self.threads = NULL
        self.n_started = 1
        self.holder = None
        self.run_lock = PyThread_allocate_lock()

    def __dealloc__(self):
        # nothing computes on the pool now: a compute holds a reference to it
        self._close()
        if self.run_lock != NULL:
            PyThread_free_lock(self.run_lock)
            self.run_lock = NULL

    def __reduce_ex__(self, protocol):
        _refuse_copy(self)

    @property
    def busy(self):
        """True while a compute (or close) holds the pool."""
        return self.holder is not None

    @property
    def closed(self):
        return self.pool == NULL

    def stats(self):
        """Counters since creation: {'sleeps': worker sleeps, 'wakeups': broadcasts,
        'stolen': workers' shares the main thread ran because they came late,
        'solo_spells': times the main thread went on alone after a worker lost its
        core, 'solo_stages': parallel stages it ran alone then}."""
        if self.pool == NULL:
            raise ValueError("ThreadPool is closed")
        return {"sleeps": self.pool.n_sleeps, "wakeups": self.pool.n_wakeups,
                "stolen": self.pool.n_stolen, "solo_spells": self.pool.n_solo_spells,
                "solo_stages": self.pool.n_solo_stages}

    def __repr__(self):
        return f"ThreadPool(n_threads={self.n_threads}, policy={self.policy!r}, spin_us={self.spin_us})"
