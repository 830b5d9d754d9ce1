# _core_kernels.pxi: row conversions and dot products: test hooks of the kernels. Part of _core.pyx (textually included there):
# it shares that module's cimports and names.

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


def interleave_rows8(int type, const uint8_t[:, ::1] src, uint8_t[:, ::1] dst, int64_t n):
    """Q4_0, Q4_K, Q5_K or Q6_K rows of n values (src: one row of blocks each) into dst
    (the same shape), interleaved by eight as MUL_MAT's rows8 kernels read them
    (ggml_py_q4_0_interleave_rows8 and the K-quants' in include/ggml_py_quants.h)."""
    cdef void (*interleave)(const void *, void *, int64_t, int64_t) noexcept nogil
    if type == GGML_PY_TYPE_Q4_0:
        interleave = ggml_py_q4_0_interleave_rows8
    elif type == GGML_PY_TYPE_Q4_K:
        interleave = ggml_py_q4_K_interleave_rows8
    elif type == GGML_PY_TYPE_Q5_K:
        interleave = ggml_py_q5_K_interleave_rows8
    elif type == GGML_PY_TYPE_Q6_K:
        interleave = ggml_py_q6_K_interleave_rows8
    else:
        raise ValueError("interleave_rows8: Q4_0, Q4_K, Q5_K or Q6_K only")
    cdef Py_ssize_t n_rows = src.shape[0]
    if n % ggml_py_get_type_traits(type).blck_size or n_rows % 8 or \
            <size_t> src.shape[1] != ggml_py_row_size(type, n) or \
            dst.shape[0] != n_rows or dst.shape[1] != src.shape[1]:
        raise ValueError("interleave_rows8: wrong shapes")
    if n_rows == 0 or n == 0:
        return
    with nogil:
        interleave(&src[0, 0], &dst[0, 0], n_rows, n)


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


def sum_sq_variant(const float[::1] x, double[::1] lanes, bint simd):
    """Test hook: lanes[i % 16] += x[i] * x[i] (as a double) by the scalar or SIMD row kernel."""
    if lanes.shape[0] != 16:
        raise ValueError("sum_sq_variant: lanes must hold 16 doubles")
    cdef const ggml_py_row_kernels *k = _row_kernels_or_raise(simd)
    with nogil:
        k.sum_sq(x.shape[0], &x[0] if x.shape[0] else NULL, &lanes[0])


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
