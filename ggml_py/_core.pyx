# cython: auto_pickle=False
# The Cython glue: owns C memory (arena, tensor structs, pool, graph arrays),
# releases the GIL around every compute, turns C status codes into exceptions.
# Everything user-facing is wrapped by the pure-Python modules of ggml_py.
# No class here can be copied or pickled: each holds raw addresses that a copy
# would share (or outlive), so each refuses with a TypeError.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uintptr_t
from libc.stdlib cimport malloc, calloc, free
from libc.string cimport memset, memcpy, strncpy
from cpython.exc cimport PyErr_CheckSignals
from cpython.pystate cimport PyThreadState_SetAsyncExc
from cpython.ref cimport PyObject
from cpython.pythread cimport (PyThread_type_lock, PyThread_allocate_lock, PyThread_free_lock,
                               PyThread_release_lock, PyLockStatus, PY_LOCK_ACQUIRED,
                               PyThread_get_thread_ident)

import math
import numbers
import operator
import os
import threading
import time
import weakref

import numpy as np

from ggml_py._ggml cimport *

cdef extern from "pthread.h" nogil:
    ctypedef unsigned long pthread_t
    int pthread_create(pthread_t *thread, const void *attr,
                       void *(*start)(void *) noexcept nogil, void *arg)
    int pthread_join(pthread_t thread, void **retval)

cdef extern from "stdlib.h" nogil:
    int posix_memalign(void **memptr, size_t alignment, size_t size)

cdef extern from "pythread.h" nogil:
    PyLockStatus PyThread_acquire_lock_timed(PyThread_type_lock lock, long long microseconds,
                                             int intr_flag)

ARENA_ALIGN = 64
TENSOR_STRUCT_SIZE = sizeof(ggml_py_tensor)
MAX_THREADS = GGML_PY_MAX_THREADS
INT64_MAX = 2 ** 63 - 1        # ne and byte sizes are int64 in C: checked as exact ints first
MAX_SPIN_US = 10_000_000.0     # 10 s: far beyond any useful spin, keeps spin_ns in int64
cdef long long LOCK_POLL_US = 20_000   # a compute waiting for a busy pool checks for Ctrl-C


def _refuse_copy(self):
    raise TypeError(f"{type(self).__name__} cannot be copied or pickled: it owns C memory "
                    f"that a copy would share or outlive")


cdef bytes _utf8_prefix(str text, Py_ssize_t max_bytes):
    """text as UTF-8, cut to at most max_bytes on a character boundary."""
    cdef bytes raw = text.encode()
    cdef Py_ssize_t n = max_bytes
    if len(raw) <= n:
        return raw
    while n > 0 and (raw[n] & 0xC0) == 0x80:   # raw[n] continues a character: back up
        n -= 1
    return raw[:n]


# ---------------------------------------------------------------------------
# kernel selection and build facts

def select_kernels(bint force_ref):
    """Point type traits at SIMD kernels or (force_ref) the scalar twins; returns which."""
    return ggml_py_select_kernels(force_ref).decode()


def build_features():
    """Bit set of enum ggml_py_feature: what this binary was compiled for."""
    return ggml_py_build_features()


def blas_config():
    """The BLAS this binary calls: vendor, version and the kernels it picked, or 'none'."""
    return ggml_py_blas_config().decode()


def type_traits_raw(int type):
    """(name, blck_size, type_size, is_quantized, vec_dot_type) or None."""
    cdef const ggml_py_type_traits *tt = ggml_py_get_type_traits(type)
    if tt == NULL:
        return None
    return (tt.name.decode(), tt.blck_size, tt.type_size, tt.is_quantized, tt.vec_dot_type,
            tt.to_float != NULL, tt.from_float != NULL, tt.vec_dot != NULL)


def row_size(int type, ne):
    """Bytes of a row of ne elements of `type` (an exact int; ne >= 0)."""
    cdef const ggml_py_type_traits *tt = _traits_or_raise(type)
    ne = operator.index(ne)
    if ne < 0:
        raise ValueError(f"a row cannot have a negative size, got {ne}")
    return tt.type_size * (ne // tt.blck_size)


# ---------------------------------------------------------------------------
# row conversions and dot products (ggml_py.core.quants wraps these)

cdef const ggml_py_type_traits *_traits_or_raise(int type) except NULL:
    cdef const ggml_py_type_traits *tt = ggml_py_get_type_traits(type)
    if tt == NULL:
        raise ValueError(f"unknown tensor type id {type}")
    return tt


def quantize_rows(int type, const float[:, ::1] x, uint8_t[:, ::1] out, bint reference=True):
    """Rows of x (each a whole number of blocks) into `type`, one row of out each.

    reference=True uses the deterministic reference quantizer, else the
    fastest one (the one mul_mat uses for activations)."""
    cdef const ggml_py_type_traits *tt = _traits_or_raise(type)
    cdef ggml_py_from_float_fn fn = tt.from_float_ref if reference else tt.from_float
    if fn == NULL:
        raise ValueError(f"{tt.name.decode()} has no conversion from float")
    cdef Py_ssize_t n_rows = x.shape[0], n = x.shape[1], i
    if out.shape[0] != n_rows or <size_t> out.shape[1] != ggml_py_row_size(type, n):
        raise ValueError("quantize_rows: output has the wrong shape")
    if n_rows == 0 or n == 0:
        return
    with nogil:
        for i in range(n_rows):
            fn(&x[i, 0], &out[i, 0], n)


def dequantize_rows(int type, const uint8_t[:, ::1] buf, float[:, ::1] out):
    """Rows of `type` blocks back to float32, one row of out each."""
    cdef const ggml_py_type_traits *tt = _traits_or_raise(type)
    if tt.to_float == NULL:
        raise ValueError(f"{tt.name.decode()} has no conversion to float")
    cdef Py_ssize_t n_rows = out.shape[0], n = out.shape[1], i
    if buf.shape[0] != n_rows or <size_t> buf.shape[1] != ggml_py_row_size(type, n):
        raise ValueError("dequantize_rows: input has the wrong shape")
    if n_rows == 0 or n == 0:
        return
    with nogil:
        for i in range(n_rows):
            tt.to_float(&buf[i, 0], &out[i, 0], n)


def kernel_pair(int type):
    """Which of (from_float_ref, from_float_simd, vec_dot_ref, vec_dot_simd) exist."""
    cdef ggml_py_kernel_pair k
    if ggml_py_get_kernel_pair(type, &k) != 0:
        raise ValueError(f"unknown tensor type id {type}")
    return (k.from_float_ref != NULL, k.from_float_simd != NULL,
            k.vec_dot_ref != NULL, k.vec_dot_simd != NULL)


def quantize_row_variant(int type, const float[::1] x, uint8_t[::1] out, bint simd):
    """Test hook: one row through the scalar twin or the SIMD quantizer of `type`."""
    cdef ggml_py_kernel_pair k
    if ggml_py_get_kernel_pair(type, &k) != 0:
        raise ValueError(f"unknown tensor type id {type}")
    cdef ggml_py_from_float_fn fn = k.from_float_simd if simd else k.from_float_ref
    if fn == NULL:
        raise ValueError("no such kernel in this build")
    if <size_t> out.shape[0] != ggml_py_row_size(type, x.shape[0]):
        raise ValueError("quantize_row_variant: output has the wrong size")
    with nogil:
        fn(&x[0], &out[0], x.shape[0])


cdef const ggml_py_row_kernels *_row_kernels_or_raise(bint simd) except NULL:
    cdef const ggml_py_row_kernels *k = ggml_py_row_kernel_set(simd)
    if k == NULL:
        raise ValueError("no SIMD row kernels in this build")
    return k


def exp_sum_variant(const float[::1] x, float max, float[::1] y, bint simd):
    """Test hook: y = exp(x - max) by the scalar or SIMD row kernel; returns the sum."""
    if y.shape[0] != x.shape[0]:
        raise ValueError("exp_sum_variant: y has the wrong size")
    cdef const ggml_py_row_kernels *k = _row_kernels_or_raise(simd)
    cdef double s
    with nogil:
        s = k.exp_sum(x.shape[0], &y[0] if y.shape[0] else NULL, &x[0] if x.shape[0] else NULL, max)
    return s


def swiglu_variant(const float[::1] x, const float[::1] g, float[::1] y, bint simd):
    """Test hook: y = silu(x) * g by the scalar or SIMD row kernel."""
    if g.shape[0] != x.shape[0] or y.shape[0] != x.shape[0] or x.shape[0] == 0:
        raise ValueError("swiglu_variant: x, g and y need one equal, non-zero size")
    cdef const ggml_py_row_kernels *k = _row_kernels_or_raise(simd)
    with nogil:
        k.swiglu(x.shape[0], &y[0], &x[0], &g[0])


def vec_dot_variant(int type, int64_t n, const uint8_t[::1] x, const uint8_t[::1] y, bint simd):
    """Test hook: dot of n elements, x in `type`, y in its vec_dot type, by the
    scalar twin or the SIMD kernel."""
    cdef ggml_py_kernel_pair k
    cdef const ggml_py_type_traits *tt = _traits_or_raise(type)
    ggml_py_get_kernel_pair(type, &k)
    cdef ggml_py_vec_dot_fn fn = k.vec_dot_simd if simd else k.vec_dot_ref
    if fn == NULL:
        raise ValueError("no such kernel in this build")
    if <size_t> x.shape[0] != ggml_py_row_size(type, n) or \
            <size_t> y.shape[0] != ggml_py_row_size(tt.vec_dot_type, n):
        raise ValueError("vec_dot_variant: buffers have the wrong size")
    cdef float s = 0
    with nogil:
        fn(n, &s, &x[0], &y[0])
    return s


# ---------------------------------------------------------------------------
# the arena

cdef class Context:
    """An arena that owns tensor structs and tensor data (one aligned numpy buffer)."""
    cdef readonly object buffer
    cdef readonly size_t mem_size
    cdef readonly size_t used
    cdef uintptr_t base

    def __cinit__(self, mem_size=16 << 20):
        # in __cinit__, not __init__: a second __init__ call must not swap the arena
        # under the tensor structs that live in it
        try:
            mem_size = operator.index(mem_size)    # not a float to truncate
        except TypeError:
            raise TypeError(f"Context: mem_size must be an integer, got {mem_size!r:.40}") from None
        if mem_size < 0:
            raise ValueError(f"Context: mem_size must be >= 0, got {mem_size}")
        try:
            raw = np.zeros(mem_size + ARENA_ALIGN, dtype=np.uint8)
        except (MemoryError, ValueError, OverflowError):   # numpy: "array is too big"
            raise MemoryError(f"Context: cannot allocate an arena of mem_size={mem_size} bytes "
                              f"({mem_size / 2**30:.1f} GiB)") from None
        start = (-raw.ctypes.data) % ARENA_ALIGN
        self.buffer = raw[start:start + mem_size]
        self.base = self.buffer.ctypes.data
        self.mem_size = mem_size
        self.used = 0

    cdef uintptr_t alloc(self, size_t nbytes) except 0:
        cdef size_t start = (self.used + ARENA_ALIGN - 1) // ARENA_ALIGN * ARENA_ALIGN
        if start + nbytes > self.mem_size:
            raise MemoryError(
                f"Context out of memory: needs {start + nbytes} bytes, has {self.mem_size} "
                f"(create it with a larger mem_size)")
        self.used = start + nbytes
        return self.base + start

    def __repr__(self):
        return f"Context(mem_size={self.mem_size}, used={self.used})"

    def __reduce_ex__(self, protocol):   # copy, deepcopy and pickle all come here
        _refuse_copy(self)


# ---------------------------------------------------------------------------
# tensors

_MAKE = object()   # new_tensor's pass: a TensorBase is never made without a struct


cdef class TensorBase:
    """A ggml_py_tensor struct living in a Context, plus what keeps its memory alive."""
    cdef ggml_py_tensor *t
    cdef readonly Context ctx
    cdef readonly tuple src          # source tensors (Python references)
    cdef readonly object owner       # numpy array whose memory holds the data
    cdef readonly uintptr_t owner_base
    cdef readonly int ndim
    cdef readonly bint read_only     # data is a read-only buffer: never a write's destination
    cdef int n_computing             # computes running over this node (its profile is then fixed)

    def __cinit__(self, *args, **kwargs):
        if len(args) != 1 or args[0] is not _MAKE or kwargs:
            raise TypeError(f"{type(self).__name__} cannot be created directly: tensors come "
                            f"from a Context (new_tensor, from_numpy, from_buffer) or an op")

    def __reduce_ex__(self, protocol):   # copy, deepcopy and pickle all come here
        _refuse_copy(self)

    @property
    def _type(self):
        return self.t.type

    @property
    def _op(self):
        return self.t.op

    @property
    def _ne(self):
        return (self.t.ne[0], self.t.ne[1], self.t.ne[2], self.t.ne[3])

    @property
    def _nb(self):
        return (self.t.nb[0], self.t.nb[1], self.t.nb[2], self.t.nb[3])

    @property
    def data_ptr(self):
        """Address of the first element."""
        return <uintptr_t> self.t.data

    @property
    def nbytes(self):
        """Bytes spanned by the data (strides included)."""
        return ggml_py_nbytes(self.t)

    @property
    def is_contiguous(self):
        """True when rows are packed with no gaps, in ggml order."""
        return ggml_py_is_contiguous(self.t)

    @property
    def name(self):
        return self.t.name.decode("utf-8", "replace")

    @name.setter
    def name(self, value):
        # cut on a character boundary: a split character would not decode
        cdef bytes raw = _utf8_prefix(str(value), GGML_PY_MAX_NAME - 1)
        memset(self.t.name, 0, GGML_PY_MAX_NAME)
        memcpy(self.t.name, <char *> raw, len(raw))

    def _profile_raw(self):
        return _profile_to_tuple(&self.t.profile)

    def _set_profile_raw(self, int32_t id, str name, stages):
        if self.n_computing:
            # the running compute sized its work buffer for the profile it started with
            raise RuntimeError(f"profile: this {_OP_NAMES.get(self.t.op, '?')} node is being "
                               f"computed (by another thread, or around this signal handler); "
                               f"set its profile before or after the compute")
        _profile_from_tuple(&self.t.profile, id, name, stages)

    def _default_profile_raw(self):
        cdef ggml_py_task_profile p = ggml_py_default_profile(self.t)
        return _profile_to_tuple(&p)

    def _op_profiles_raw(self):
        cdef ggml_py_task_profile out[GGML_PY_MAX_PROFILES]
        cdef int n = ggml_py_op_profiles(self.t, out)
        return [_profile_to_tuple(&out[i]) for i in range(n)]

    def _work_size(self, int n_threads):
        return ggml_py_node_work_size(self.t, n_threads)


cdef tuple _profile_to_tuple(const ggml_py_task_profile *p):
    return (p.id, (<const char *> p.name).decode("utf-8", "replace"),
            tuple((bool(p.stages[s].valid), bool(p.stages[s].parallel), bool(p.stages[s].wait))
                  for s in range(GGML_PY_N_STAGES)))


cdef void _profile_from_tuple(ggml_py_task_profile *p, int32_t id, str name, stages) except *:
    cdef bytes raw = _utf8_prefix(name, sizeof(p.name) - 1)
    memset(p, 0, sizeof(ggml_py_task_profile))
    p.id = id
    memcpy(p.name, <char *> raw, len(raw))
    for s, (valid, parallel, wait) in enumerate(stages):
        p.stages[s].valid = valid
        p.stages[s].parallel = parallel
        p.stages[s].wait = wait


def new_tensor(cls, Context ctx, int type, ne, nb, int ndim, int op=0, tuple src=(),
               op_params=None, TensorBase view_of=None, size_t view_offset=0,
               object external=None):
    """Create a `cls` (a TensorBase subclass) with a fresh struct in ctx.

    Data: a view of `view_of` at `view_offset` bytes, or `external` (a numpy
    array whose memory is used in place), or fresh zeroed arena memory.
    ne, nb: 4 ints each, ggml order (nb may be None for contiguous).
    Sizes are checked as exact ints before they reach C: ValueError when the
    element count or a byte size does not fit in int64, MemoryError when the
    arena is too small.
    """
    cdef const ggml_py_type_traits *tt = _traits_or_raise(type)
    ne = tuple(operator.index(n) for n in ne)
    if len(ne) != GGML_PY_MAX_DIMS or any(n < 0 for n in ne):
        raise ValueError(f"ne must be {GGML_PY_MAX_DIMS} sizes >= 0, got {ne}")
    if ne[0] % tt.blck_size:
        raise ValueError(f"a row of {tt.name.decode()} needs a multiple of {tt.blck_size} "
                         f"elements, got {ne[0]}")
    if max(ne) > INT64_MAX or math.prod(ne) > INT64_MAX:   # one size alone, with a 0 beside it
        raise ValueError(f"a tensor of ne {ne} has more elements than int64 can count")
    if nb is None:
        nb = (tt.type_size, tt.type_size * (ne[0] // tt.blck_size))
        nb += (nb[1] * ne[1], nb[1] * ne[1] * ne[2])
    nb = tuple(operator.index(n) for n in nb)
    if len(nb) != GGML_PY_MAX_DIMS or any(n < 0 for n in nb):
        raise ValueError(f"nb must be {GGML_PY_MAX_DIMS} strides >= 0, got {nb}")
    # as ggml_py_nbytes counts: the first byte to the end of the last element
    if 0 in ne:
        nbytes = 0
    elif tt.blck_size == 1:
        nbytes = tt.type_size + sum((ne[i] - 1) * nb[i] for i in range(GGML_PY_MAX_DIMS))
    else:
        nbytes = (ne[0] // tt.blck_size) * nb[0] + sum((ne[i] - 1) * nb[i]
                                                       for i in range(1, GGML_PY_MAX_DIMS))
    if max(nb) > INT64_MAX:
        raise ValueError(f"a stride of nb {nb} is more bytes than int64 can count")
    if nbytes > INT64_MAX:
        raise ValueError(f"a {tt.name.decode()} tensor of ne {ne} needs {nbytes} bytes, more "
                         f"than int64 can count")
    cdef TensorBase tensor = cls.__new__(cls, _MAKE)
    cdef ggml_py_tensor *t = <ggml_py_tensor *> ctx.alloc(sizeof(ggml_py_tensor))
    memset(t, 0, sizeof(ggml_py_tensor))
    t.type = type
    t.op = op
    for i in range(GGML_PY_MAX_DIMS):
        t.ne[i] = ne[i]
        t.nb[i] = nb[i]
    if op_params is not None:
        for i, v in enumerate(op_params):
            t.op_params[i] = v
    for i, s in enumerate(src):
        if s is not None:
            t.src[i] = (<TensorBase> s).t

    tensor.t = t
    tensor.ctx = ctx
    tensor.src = src
    tensor.ndim = ndim
    if view_of is not None:
        t.data = <void *> ((<uintptr_t> view_of.t.data) + view_offset)
        tensor.owner = view_of.owner
        tensor.owner_base = view_of.owner_base
        tensor.read_only = view_of.read_only
    elif external is not None:
        t.data = <void *> (<uintptr_t> external.ctypes.data)
        tensor.owner = external
        tensor.owner_base = external.ctypes.data
        tensor.read_only = not external.flags.writeable
    else:
        t.data = <void *> ctx.alloc(nbytes)
        tensor.owner = ctx.buffer
        tensor.owner_base = ctx.base
    t.profile = ggml_py_default_profile(t)
    return tensor


cdef void _set_contiguous_strides(ggml_py_tensor *t):
    """nb of a packed tensor of t.type and t.ne (ggml's layout)."""
    cdef const ggml_py_type_traits *tt = ggml_py_get_type_traits(t.type)
    t.nb[0] = tt.type_size
    t.nb[1] = tt.type_size * (t.ne[0] // tt.blck_size)
    for i in range(2, 4):
        t.nb[i] = t.nb[i - 1] * t.ne[i - 1]


def op_profiles_for(int op, int type0, int type1, ne0=(1, 1, 1, 1), ne1=(1, 1, 1, 1)):
    """The profiles of `op` for sources of these types (default first)."""
    cdef ggml_py_tensor node, a, b
    cdef ggml_py_task_profile out[GGML_PY_MAX_PROFILES]
    _traits_or_raise(type0)
    _traits_or_raise(type1)
    memset(&node, 0, sizeof(node))
    memset(&a, 0, sizeof(a))
    memset(&b, 0, sizeof(b))
    node.op = op
    node.type = 0
    a.type = type0
    b.type = type1
    for i in range(4):
        a.ne[i] = ne0[i]
        b.ne[i] = ne1[i]
    _set_contiguous_strides(&a)
    _set_contiguous_strides(&b)
    node.src[0] = &a
    node.src[1] = &b
    cdef int n = ggml_py_op_profiles(&node, out)
    return [_profile_to_tuple(&out[i]) for i in range(n)]


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
        """Counters since creation: {'sleeps': worker sleeps, 'wakeups': broadcasts}."""
        if self.pool == NULL:
            raise ValueError("ThreadPool is closed")
        return {"sleeps": self.pool.n_sleeps, "wakeups": self.pool.n_wakeups}

    def __repr__(self):
        return f"ThreadPool(n_threads={self.n_threads}, policy={self.policy!r}, spin_us={self.spin_us})"


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
            raise RuntimeError(f"{op}: compute failed with status {status} (node {failed_node})")


def _bad_row_id(node, op, index):
    """The message for a get_rows / set_rows node whose ids leave its rows: the first
    such id, the rows there are, and the shapes."""
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


# The C core's lists of types and ops by name (include/ggml_py.h: GGML_PY_TYPES,
# GGML_PY_OPS), from which ggml_py.core.types makes Type and Op.
TYPE_IDS = {ggml_py_type_name(i).decode(): i for i in range(GGML_PY_TYPE_COUNT)
            if ggml_py_type_name(i) != NULL}
OP_COUNT = GGML_PY_OP_COUNT
OP_IDS = {ggml_py_op_name(i).decode(): i for i in range(GGML_PY_OP_COUNT)}
_OP_NAMES = {v: k.lower() for k, v in OP_IDS.items()}
