"""Quantized block formats: numpy in, ggml's bytes out, and back.

    q = gg.quantize(w, gg.Q4_0)               # w float32 (..., K) -> uint8 (..., K/32*18)
    w2 = gg.dequantize(q, gg.Q4_0, w.shape)   # -> float32 (..., K)

Rows are the last axis and must be a whole number of blocks (32 elements, or
256 for the K-quants). quantize uses the deterministic reference quantizer:
the bytes are ggml's, so they can go into a GGUF file as they are.
"""

import numpy as np

from ggml_py import _core
from ggml_py.core.types import Type, exact_shape, row_bytes, type_traits


def quantize(x, type, reference=True):
    """float32 array (..., n) -> uint8 array (..., row_bytes(type, n)) of `type` blocks.
    reference=False: the conversion set_rows and MUL_MAT's activations use (the type's
    from_float: Q8_0's rounds a value that lies just at a half the other way, rarely)."""
    type = Type.of(type, "quantize")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 0:
        raise ValueError("quantize: x must have at least one dimension (rows are the last axis)")
    n = x.shape[-1]
    n_row = row_bytes(type, n)
    rows = x.reshape(int(np.prod(x.shape[:-1], dtype=np.int64)), n)   # also when n is 0
    out = np.empty((rows.shape[0], n_row), np.uint8)
    _core.quantize_rows(int(type), rows, out, bool(reference))
    return out.reshape(x.shape[:-1] + (n_row,))


def dequantize(buf, type, shape):
    """uint8 blocks of `type` -> float32 array of numpy `shape` (last axis = row length)."""
    type = Type.of(type, "dequantize")
    shape = exact_shape(shape, "dequantize")
    if not shape:
        raise ValueError("dequantize: shape must have at least one dimension")
    n = shape[-1]
    n_row = row_bytes(type, n)
    n_rows = int(np.prod(shape[:-1], dtype=np.int64))
    buf = np.ascontiguousarray(buf).view(np.uint8)
    if buf.size != n_rows * n_row:
        raise ValueError(f"dequantize: {type.name} {shape} needs {n_rows * n_row} bytes, "
                         f"buffer has {buf.size}")
    out = np.empty((n_rows, n), np.float32)
    _core.dequantize_rows(int(type), buf.reshape(n_rows, n_row), out)
    return out.reshape(shape)


# the types whose rows MUL_MAT's SIMD kernels can read interleaved by eight
ROWS8_TYPES = (Type.Q4_0, Type.Q4_K, Type.Q5_K, Type.Q6_K)


def interleave_rows8(blocks, type, out=None):
    """Q4_0, Q4_K, Q5_K or Q6_K weights (N, bytes of a row: N rows, N a multiple of 8) -> an array
    of the same shape and bytes, their rows interleaved by eight: the layout MUL_MAT's
    SIMD kernels read fastest (include/ggml_py_quants.h, ggml_py_q4_0_interleave_rows8).
    Pass it beside the weights as Context.from_buffer(..., rows8=...). out: a C-contiguous
    uint8 array of that shape, apart from the weights' memory, to write them into (and
    return) instead of a new one."""
    type = Type.of(type, "interleave_rows8")
    if type not in ROWS8_TYPES:
        raise ValueError(f"interleave_rows8: {type.name} has no interleaved layout (only "
                         f"{', '.join(t.name for t in ROWS8_TYPES)})")
    blocks = np.ascontiguousarray(blocks).view(np.uint8)
    traits = type_traits(type)
    if blocks.ndim != 2 or blocks.shape[1] % traits["type_size"] or blocks.shape[0] % 8:
        raise ValueError(f"interleave_rows8: {type.name} rows (N, bytes of a row) with N a "
                         f"multiple of 8 are interleaved, got shape {blocks.shape}")
    if out is None:
        out = np.empty_like(blocks)
    elif (not isinstance(out, np.ndarray) or out.dtype != np.uint8 or out.shape != blocks.shape
          or not out.flags.c_contiguous or not out.flags.writeable):
        raise ValueError(f"interleave_rows8: out must be a writable C-contiguous uint8 array of "
                         f"shape {blocks.shape}, got {getattr(out, 'dtype', out.__class__.__name__)} "
                         f"{getattr(out, 'shape', '')}")
    elif np.shares_memory(out, blocks):
        raise ValueError("interleave_rows8: out overlaps the weights it is made from")
    _core.interleave_rows8(int(type), blocks, out,
                           blocks.shape[1] // traits["type_size"] * traits["blck_size"])
    return out


def kernel_variants(type):
    """{'from_float': (ref, simd), 'vec_dot': (ref, simd)}: which kernels this build has."""
    q_ref, q_simd, d_ref, d_simd = _core.kernel_pair(int(Type.of(type, "kernel_variants")))
    return {"from_float": (q_ref, q_simd), "vec_dot": (d_ref, d_simd)}


def quantize_row_variant(x, type, simd):
    """Test hook: one float32 row through the scalar twin (simd=False) or the SIMD quantizer."""
    x = np.ascontiguousarray(x, dtype=np.float32).ravel()
    out = np.empty(row_bytes(type, x.size), np.uint8)
    _core.quantize_row_variant(int(Type.of(type, "quantize_row_variant")), x, out, bool(simd))
    return out


def vec_dot_variant(type, n, x, y, simd):
    """Test hook: dot of n elements, x bytes of `type`, y bytes of its vec_dot type."""
    return _core.vec_dot_variant(int(Type.of(type, "vec_dot_variant")), int(n), np.ascontiguousarray(x, np.uint8).ravel(),
                                 np.ascontiguousarray(y, np.uint8).ravel(), bool(simd))


def vec_dot_type(type):
    """The type a mul_mat converts activations to for weights of `type`."""
    return type_traits(type)["vec_dot_type"]
