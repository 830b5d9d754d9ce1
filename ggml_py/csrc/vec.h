/* vec.h - row conversions, dot products and row functions of the float types. */
#ifndef GGML_PY_VEC_H
#define GGML_PY_VEC_H

#include <stdint.h>

void ggml_py_vec_dot_f32_ref(int64_t n, float *s, const void *x, const void *y);
void ggml_py_vec_dot_f16_ref(int64_t n, float *s, const void *x, const void *y);
void ggml_py_vec_dot_bf16_ref(int64_t n, float *s, const void *x, const void *y);
void ggml_py_vec_dot_f32_avx2(int64_t n, float *s, const void *x, const void *y);
void ggml_py_vec_dot_f16_avx2(int64_t n, float *s, const void *x, const void *y);

void ggml_py_f16_to_f32_row(const void *x, float *y, int64_t n);
void ggml_py_f32_to_f16_row(const float *x, void *y, int64_t n);
void ggml_py_bf16_to_f32_row(const void *x, float *y, int64_t n);
void ggml_py_f32_to_bf16_row(const float *x, void *y, int64_t n);
void ggml_py_f32_to_f32_row(const float *x, void *y, int64_t n);
void ggml_py_f32_row_to_f32(const void *x, float *y, int64_t n);

/* Row functions (f32, packed rows), each a scalar reference and an AVX2 twin:
 *   exp_sum: y[i] = exp(x[i] - max) for x[i] <= max; returns the sum of y
 *            (softmax's numerators and denominator; -inf gives exactly 0)
 *   swiglu:  y[i] = silu(x[i]) * g[i], silu(x) = x / (1 + exp(-x))
 *   sum_sq:  lanes[i % 16] += (double) (x[i] * x[i]): a sum of squares in sixteen double
 *            lanes, which the caller adds in lane order (GGML_PY_SUM_SQ_LANES); a row may
 *            come in pieces of a multiple of 16 elements. One running double sum is a
 *            chain of dependent adds, 2048 of them for a row of a 1.1B model. */
#define GGML_PY_SUM_SQ_LANES 16
typedef double (*ggml_py_exp_sum_fn)(int64_t n, float *y, const float *x, float max);
typedef void (*ggml_py_swiglu_fn)(int64_t n, float *y, const float *x, const float *g);
typedef void (*ggml_py_sum_sq_fn)(int64_t n, const float *x, double *lanes);

double ggml_py_vec_exp_sum_f32_ref(int64_t n, float *y, const float *x, float max);
double ggml_py_vec_exp_sum_f32_avx2(int64_t n, float *y, const float *x, float max);
void ggml_py_vec_swiglu_f32_ref(int64_t n, float *y, const float *x, const float *g);
void ggml_py_vec_swiglu_f32_avx2(int64_t n, float *y, const float *x, const float *g);
void ggml_py_vec_sum_sq_f32_ref(int64_t n, const float *x, double *lanes);
void ggml_py_vec_sum_sq_f32_avx2(int64_t n, const float *x, double *lanes);

struct ggml_py_row_kernels {
    ggml_py_exp_sum_fn exp_sum;
    ggml_py_swiglu_fn  swiglu;
    ggml_py_sum_sq_fn  sum_sq;
};

/* The row kernels in use: set by ggml_py_select_kernels (SIMD, or the references). */
const struct ggml_py_row_kernels *ggml_py_row_kernels(void);
/* The reference (simd = 0) or SIMD (simd = 1, NULL where this build has none) set. */
const struct ggml_py_row_kernels *ggml_py_row_kernel_set(int simd);
void ggml_py_row_kernels_select(int simd);

#endif /* GGML_PY_VEC_H */
