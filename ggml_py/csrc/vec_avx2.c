/* vec_avx2.c - AVX2/FMA/F16C versions of the float dot products and row functions. */
#include <math.h>

#include "impl.h"
#include "simd.h"
#include "vec.h"

#if defined(GGML_PY_HAVE_AVX2)

void ggml_py_vec_dot_f32_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i),      _mm256_loadu_ps(y + i),      acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8),  _mm256_loadu_ps(y + i + 8),  acc1);
        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc0);
    }
    float sum = ggml_py_hsum_ps_avx(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++) sum += x[i] * y[i];
    *s = sum;
}

void ggml_py_vec_dot_f16_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_fp16_t *x = vx, *y = vy;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 x0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (x + i)));
        const __m256 y0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (y + i)));
        const __m256 x1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (x + i + 8)));
        const __m256 y1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (y + i + 8)));
        acc0 = _mm256_fmadd_ps(x0, y0, acc0);
        acc1 = _mm256_fmadd_ps(x1, y1, acc1);
    }
    float sum = ggml_py_hsum_ps_avx(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) sum += ggml_py_fp16_to_fp32(x[i]) * ggml_py_fp16_to_fp32(y[i]);
    *s = sum;
}

double ggml_py_vec_exp_sum_f32_avx2(int64_t n, float *y, const float *x, float max) {
    if (max == -INFINITY) return ggml_py_vec_exp_sum_f32_ref(n, y, x, max);
    const __m256 vmax = _mm256_set1_ps(max);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = ggml_py_exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax));
        _mm256_storeu_ps(y + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    double sum = ggml_py_hsum_ps_avx(acc);
    for (; i < n; i++) {
        y[i] = expf(x[i] - max);
        sum += y[i];
    }
    return sum;
}

void ggml_py_vec_swiglu_f32_avx2(int64_t n, float *y, const float *x, const float *g) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 e = ggml_py_exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), v));
        const __m256 silu = _mm256_div_ps(v, _mm256_add_ps(one, e));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(silu, _mm256_loadu_ps(g + i)));
    }
    for (; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i])) * g[i];
}

/* lanes 4k .. 4k + 3 in acc[k]: sixteen floats squared, widened four at a time, added */
void ggml_py_vec_sum_sq_f32_avx2(int64_t n, const float *x, double *lanes) {
    __m256d acc[4];
    for (int k = 0; k < 4; k++) acc[k] = _mm256_loadu_pd(lanes + 4 * k);
    int64_t i = 0;
    for (; i + GGML_PY_SUM_SQ_LANES <= n; i += GGML_PY_SUM_SQ_LANES) {
        for (int h = 0; h < 2; h++) {
            const __m256 v = _mm256_loadu_ps(x + i + 8 * h), sq = _mm256_mul_ps(v, v);
            acc[2 * h] = _mm256_add_pd(acc[2 * h], _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
            acc[2 * h + 1] = _mm256_add_pd(acc[2 * h + 1], _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
        }
    }
    for (int k = 0; k < 4; k++) _mm256_storeu_pd(lanes + 4 * k, acc[k]);
    for (; i < n; i++) lanes[i % GGML_PY_SUM_SQ_LANES] += (double) (x[i] * x[i]);
}

#endif
