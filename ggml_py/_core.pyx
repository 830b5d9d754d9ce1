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


# The C core's lists of types and ops by name (include/ggml_py.h: GGML_PY_TYPES,
# GGML_PY_OPS), from which ggml_py.core.types makes Type and Op.
TYPE_IDS = {ggml_py_type_name(i).decode(): i for i in range(GGML_PY_TYPE_COUNT)
            if ggml_py_type_name(i) != NULL}
OP_COUNT = GGML_PY_OP_COUNT
OP_IDS = {ggml_py_op_name(i).decode(): i for i in range(GGML_PY_OP_COUNT)}
_OP_NAMES = {v: k.lower() for k, v in OP_IDS.items()}


# the rest of the module, one file per part
include "_core_kernels.pxi"
include "_core_tensors.pxi"
include "_core_pool.pxi"
include "_core_graphs.pxi"
