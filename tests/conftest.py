"""Shared helpers for the op tests: inputs stored in several memory layouts, and a
compute that checks every thread count writes every element and gives the same bits."""
import os
import threading
import zlib

import numpy as np
import pytest

import ggml_py as gg

THREADS = (1, 2, 3, 8)
LAYOUTS = ("contiguous", "transposed", "permuted", "swapped", "strided")


@pytest.fixture
def ctx():
    return gg.Context(mem_size=16 << 20)


@pytest.fixture
def unblocked():
    """unblocked(fifo, fn) -> the exception fn() raised (None if it returned); the
    test fails, instead of hanging, when fn still waits on the FIFO after 10 s (a
    writer is then opened to free it)."""
    def run(fifo, fn):
        outcome = []

        def target():
            try:
                fn()
                outcome.append(None)
            except BaseException as exc:   # noqa: BLE001 - handed to the test
                outcome.append(exc)
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        thread.join(10)
        if thread.is_alive():
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))   # its reader is waiting
            thread.join(10)
            pytest.fail(f"waited on the FIFO {fifo}")
        return outcome[0]
    return run


@pytest.fixture
def rng(request):
    """A generator seeded by the test id, so every failure reproduces."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def shape_id(shape):
    return "x".join(str(d) for d in shape)


def _pad_value(dtype):
    # padding that poisons any stray read: NaN for floats, an out-of-range id for ints
    return np.nan if np.issubdtype(dtype, np.floating) else -1


def make_input(ctx, x, layout="contiguous", type=None):
    """A tensor whose numpy-order values are x, stored in `layout`.

    contiguous: packed rows; transposed: the last two axes swapped in memory
    (a row's elements are a column apart); permuted: every axis rotated in
    memory; swapped: packed rows, the two axes above them swapped (attention's
    heads/tokens permute); strided: a window of a padded buffer, rows a gap
    apart, at a non-zero offset. Layouts a tensor cannot have fall back.
    """
    x = np.asarray(x)
    if layout == "swapped" and x.ndim < 3:
        layout = "strided"
    if layout == "permuted" and x.ndim < 3:
        layout = "transposed"
    if layout == "transposed" and x.ndim < 2:
        layout = "strided"
    if layout == "contiguous":
        return ctx.from_numpy(x, type=type)
    if layout == "transposed":
        stored = ctx.from_numpy(np.ascontiguousarray(np.swapaxes(x, -1, -2)), type=type)
        return gg.transpose(stored)
    if layout in ("permuted", "swapped"):
        p = tuple(range(1, x.ndim)) + (0,)
        if layout == "swapped":
            p = tuple(range(x.ndim - 3)) + (x.ndim - 2, x.ndim - 3, x.ndim - 1)
        stored = ctx.from_numpy(np.ascontiguousarray(np.transpose(x, p)), type=type)
        return gg.permute(stored, np.argsort(p))
    assert layout == "strided", layout
    big_shape = tuple(d + 1 for d in x.shape[:-1]) + (x.shape[-1] + 2,)
    big = np.full(big_shape, _pad_value(x.dtype), x.dtype)
    window = tuple(slice(0, d) for d in x.shape[:-1]) + (slice(1, 1 + x.shape[-1]),)
    big[window] = x
    stored = ctx.from_numpy(big, type=type)
    itemsize = stored.strides[-1]
    return gg.view(stored, x.shape, stored.strides, offset=itemsize)


def poison(t):
    """Fill t's elements with garbage so an element a kernel skips shows up."""
    arr = t.numpy()
    arr[...] = np.nan if np.issubdtype(arr.dtype, np.floating) else -7


def same_bits(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and \
        np.array_equal(a.view(np.uint8), b.view(np.uint8))


def compute(out, *, threads=THREADS, fill=True, before=None, graph=None, exact=True):
    """Compute out's graph at each thread count and return out's values.

    Asserts the results are bitwise equal across thread counts: every output
    element is computed by exactly one thread, so the split must not matter.
    fill: poison the output first (not for ops that update their target in
    place); before: a callable run before each compute (e.g. to reset a target).
    exact=False: equal within float32 rounding (blas-mt: OpenBLAS splits its
    sgemm among its threads its own way, and with some of its kernels the last
    bits follow the split).
    """
    graph = graph or gg.build_forward(out)
    results = []
    for n in threads:
        if before is not None:
            before()
        if fill:
            poison(out)
        graph.compute(n_threads=n)
        results.append(out.numpy().copy())
    for n, r in zip(threads[1:], results[1:]):
        if exact:
            assert same_bits(results[0], r), \
                f"n_threads={n} gives other bits than n_threads={threads[0]}"
        else:   # NaN (a poisoned output left unwritten) fails the comparison
            assert np.abs(r - results[0]).max() <= 1e-5 * np.abs(results[0]).max(), \
                f"n_threads={n} gives other values than n_threads={threads[0]}"
    return results[0]


def f16(x):
    """x rounded to float16 and widened to float64 (what an F16 tensor holds)."""
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float64)
