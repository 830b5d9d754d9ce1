/* vec_ref.c - scalar reference kernels for the float types. Always built; the
 * SIMD versions must agree with these. */
#include <math.h>

#include "impl.h"
#include "vec.h"

void ggml_py_vec_dot_f32_ref(int64_t n, float *s, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    /* eight partial sums, like the SIMD lanes, so results stay close */
    float sum[8] = { 0 };
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 8; j++) sum[j] += x[i + j] * y[i + j];
    }
    for (; i < n; i++) sum[0] += x[i] * y[i];
    *s = ((sum[0] + sum[4]) + (sum[1] + sum[5])) + ((sum[2] + sum[6]) + (sum[3] + sum[7]));
}

void ggml_py_vec_dot_f16_ref(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_fp16_t *x = vx, *y = vy;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        sum += (double) (ggml_py_fp16_to_fp32(x[i]) * ggml_py_fp16_to_fp32(y[i]));
    }
    *s = (float) sum;
}

void ggml_py_vec_dot_bf16_ref(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_bf16_t *x = vx, *y = vy;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        sum += (double) (ggml_py_bf16_to_fp32(x[i]) * ggml_py_bf16_to_fp32(y[i]));
    }
    *s = (float) sum;
}

/* With F16C the row conversions take eight at a time the one instruction that
 * ggml_py_fp16_to_fp32 / ggml_py_fp32_to_fp16 take one at a time: the same bits. */
void ggml_py_f16_to_f32_row(const void *vx, float *y, int64_t n) {
    const ggml_py_fp16_t *x = vx;
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (x + i))));
#endif
    for (; i < n; i++) y[i] = ggml_py_fp16_to_fp32(x[i]);
}

void ggml_py_f32_to_f16_row(const float *x, void *vy, int64_t n) {
    ggml_py_fp16_t *y = vy;
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *) (y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), 0));
#endif
    for (; i < n; i++) y[i] = ggml_py_fp32_to_fp16(x[i]);
}

void ggml_py_bf16_to_f32_row(const void *vx, float *y, int64_t n) {
    const ggml_py_bf16_t *x = vx;
    for (int64_t i = 0; i < n; i++) y[i] = ggml_py_bf16_to_fp32(x[i]);
}

void ggml_py_f32_to_bf16_row(const float *x, void *vy, int64_t n) {
    ggml_py_bf16_t *y = vy;
    for (int64_t i = 0; i < n; i++) y[i] = ggml_py_fp32_to_bf16(x[i]);
}

void ggml_py_f32_to_f32_row(const float *x, void *vy, int64_t n) {
    memcpy(vy, x, (size_t) n * sizeof(float));
}

void ggml_py_f32_row_to_f32(const void *vx, float *y, int64_t n) {
    memcpy(y, vx, (size_t) n * sizeof(float));
}

/* ---- row functions ------------------------------------------------------------ */

double ggml_py_vec_exp_sum_f32_ref(int64_t n, float *y, const float *x, float max) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        y[i] = (max == -INFINITY) ? 0.0f : expf(x[i] - max);
        sum += y[i];
    }
    return sum;
}

void ggml_py_vec_swiglu_f32_ref(int64_t n, float *y, const float *x, const float *g) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i])) * g[i];
}

void ggml_py_vec_sum_sq_f32_ref(int64_t n, const float *x, double *lanes) {
    for (int64_t i = 0; i < n; i++) lanes[i % GGML_PY_SUM_SQ_LANES] += (double) (x[i] * x[i]);
}

static const struct ggml_py_row_kernels row_ref = {
    ggml_py_vec_exp_sum_f32_ref, ggml_py_vec_swiglu_f32_ref, ggml_py_vec_sum_sq_f32_ref,
};
#if defined(__AVX2__) && defined(__FMA__)
static const struct ggml_py_row_kernels row_simd = {
    ggml_py_vec_exp_sum_f32_avx2, ggml_py_vec_swiglu_f32_avx2, ggml_py_vec_sum_sq_f32_avx2,
};
#define ROW_SIMD (&row_simd)
#else
#define ROW_SIMD NULL
#endif
static const struct ggml_py_row_kernels *row_selected = &row_ref;

const struct ggml_py_row_kernels *ggml_py_row_kernels(void) { return row_selected; }

const struct ggml_py_row_kernels *ggml_py_row_kernel_set(int simd) { return simd ? ROW_SIMD : &row_ref; }

void ggml_py_row_kernels_select(int simd) {
    const struct ggml_py_row_kernels *k = ggml_py_row_kernel_set(simd);
    row_selected = k != NULL ? k : &row_ref;
}
