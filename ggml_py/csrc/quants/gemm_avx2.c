/* gemm_avx2.c - blocked AVX2 tiles for MUL_MAT with several src1 rows
 * (prefill): 4 weight rows x 2 activation rows per pass, so each loaded
 * weight block meets two activation blocks and each activation block four
 * weight blocks. Every output runs the very accumulation of its vec_dot
 * (same lanes, same order), so tiles and vec_dot agree bit for bit. */
#include "quants_impl.h"
#include "simd.h"
#include "mul_mat.h"

#if defined(GGML_PY_HAVE_AVX2)
#include "quants_avx2.h"

#define R0 GGML_PY_GEMM_R0
#define R1 GGML_PY_GEMM_R1

static void gemm_q4_0(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                      size_t by, float *d, int64_t ldd) {
    const int64_t nb = n / GGML_PY_QK4_0;
    const __m256i eight = _mm256_set1_epi8(8);
    __m256 acc[R0][R1];
    for (int i = 0; i < R0; i++)
        for (int j = 0; j < R1; j++) acc[i][j] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) {
        __m256i qy[R1], ysum[R1];
        float dy[R1];
        for (int j = 0; j < nr1; j++) {
            const ggml_py_block_q8_0 *yb = (const ggml_py_block_q8_0 *) (y + j * by) + ib;
            qy[j] = _mm256_loadu_si256((const __m256i *) yb->qs);
            ysum[j] = ggml_py_dot_u8s8(eight, qy[j]);
            dy[j] = FP16_TO_FP32(yb->d);
        }
        for (int i = 0; i < nr0; i++) {
            const ggml_py_block_q4_0 *xb = (const ggml_py_block_q4_0 *) (x + i * bx) + ib;
            const __m256i qx = ggml_py_nibbles32(xb->qs);
            const float dx = FP16_TO_FP32(xb->d);
            for (int j = 0; j < nr1; j++) {
                const __m256i s = _mm256_sub_epi32(ggml_py_dot_u8s8(qx, qy[j]), ysum[j]);
                acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(dx * dy[j]), _mm256_cvtepi32_ps(s), acc[i][j]);
            }
        }
    }
    for (int j = 0; j < nr1; j++)
        for (int i = 0; i < nr0; i++) d[j * ldd + i] = ggml_py_hsum_ps_avx(acc[i][j]);
}

static void gemm_q8_0(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                      size_t by, float *d, int64_t ldd) {
    const int64_t nb = n / GGML_PY_QK8_0;
    __m256 acc[R0][R1];
    for (int i = 0; i < R0; i++)
        for (int j = 0; j < R1; j++) acc[i][j] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) {
        __m256i qy[R1];
        float dy[R1];
        for (int j = 0; j < nr1; j++) {
            const ggml_py_block_q8_0 *yb = (const ggml_py_block_q8_0 *) (y + j * by) + ib;
            qy[j] = _mm256_loadu_si256((const __m256i *) yb->qs);
            dy[j] = FP16_TO_FP32(yb->d);
        }
        for (int i = 0; i < nr0; i++) {
            const ggml_py_block_q8_0 *xb = (const ggml_py_block_q8_0 *) (x + i * bx) + ib;
            const __m256i qx = _mm256_loadu_si256((const __m256i *) xb->qs);
            const __m256i ax = _mm256_sign_epi8(qx, qx);
            const float dx = FP16_TO_FP32(xb->d);
            for (int j = 0; j < nr1; j++) {
                const __m256i s = ggml_py_dot_u8s8(ax, _mm256_sign_epi8(qy[j], qx));
                acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(dx * dy[j]), _mm256_cvtepi32_ps(s), acc[i][j]);
            }
        }
    }
    for (int j = 0; j < nr1; j++)
        for (int i = 0; i < nr0; i++) d[j * ldd + i] = ggml_py_hsum_ps_avx(acc[i][j]);
}

/* F16 x F16: one accumulator per output (not bitwise equal to vec_dot_f16). */
static void gemm_f16(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                     size_t by, float *d, int64_t ldd) {
    __m256 acc[R0][R1];
    for (int i = 0; i < R0; i++)
        for (int j = 0; j < R1; j++) acc[i][j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 vy[R1];
        for (int j = 0; j < nr1; j++) {
            vy[j] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) ((const ggml_py_fp16_t *) (y + j * by) + k)));
        }
        for (int i = 0; i < nr0; i++) {
            const __m256 vx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) ((const ggml_py_fp16_t *) (x + i * bx) + k)));
            for (int j = 0; j < nr1; j++) acc[i][j] = _mm256_fmadd_ps(vx, vy[j], acc[i][j]);
        }
    }
    for (int j = 0; j < nr1; j++) {
        for (int i = 0; i < nr0; i++) {
            float sum = ggml_py_hsum_ps_avx(acc[i][j]);
            const ggml_py_fp16_t *xr = (const ggml_py_fp16_t *) (x + i * bx);
            const ggml_py_fp16_t *yr = (const ggml_py_fp16_t *) (y + j * by);
            for (int64_t kk = k; kk < n; kk++) sum += FP16_TO_FP32(xr[kk]) * FP16_TO_FP32(yr[kk]);
            d[j * ldd + i] = sum;
        }
    }
}

/* M = 1: four weight rows against one activation row, each row its own chain of
 * fmas in vec_dot's order. The activation's side of a block (its -8 * sum, its
 * scale) is worked out once for the four. */
static void gemv_q4_0(int64_t n, const char *x, size_t bx, const char *y, float *d, int64_t dd) {
    const ggml_py_block_q8_0 *yb = (const ggml_py_block_q8_0 *) y;
    const ggml_py_block_q4_0 *xr[GGML_PY_GEMV_ROWS];
    __m256 acc[GGML_PY_GEMV_ROWS];
    for (int i = 0; i < GGML_PY_GEMV_ROWS; i++) {
        xr[i] = (const ggml_py_block_q4_0 *) (x + i * bx);
        acc[i] = _mm256_setzero_ps();
    }
    const __m256i eight = _mm256_set1_epi8(8);
    for (int64_t ib = 0; ib < n / GGML_PY_QK4_0; ib++) {
        const __m256i qy = _mm256_loadu_si256((const __m256i *) yb[ib].qs);
        /* (q - 8) . y = q . y - 8 * (sum of y), lane by lane */
        const __m256i minus_ysum = _mm256_sub_epi32(_mm256_setzero_si256(), ggml_py_dot_u8s8(eight, qy));
        const __m256 dy = _mm256_set1_ps(FP16_TO_FP32(yb[ib].d));
        for (int i = 0; i < GGML_PY_GEMV_ROWS; i++) {
            const __m256i s = ggml_py_dot_u8s8_acc(minus_ysum, ggml_py_nibbles32(xr[i][ib].qs), qy);
            const __m256 dx = _mm256_cvtph_ps(_mm_set1_epi16((short) xr[i][ib].d));
            acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(s), acc[i]);
        }
    }
    for (int i = 0; i < GGML_PY_GEMV_ROWS; i++) d[i * dd] = ggml_py_hsum_ps_avx(acc[i]);
}

ggml_py_gemv_fn ggml_py_gemv_avx2(int type) {
    return type == GGML_PY_TYPE_Q4_0 ? gemv_q4_0 : NULL;
}

ggml_py_gemm_tile_fn ggml_py_gemm_tile_avx2(int type) {
    switch (type) {
        case GGML_PY_TYPE_Q4_0: return gemm_q4_0;
        case GGML_PY_TYPE_Q8_0: return gemm_q8_0;
        case GGML_PY_TYPE_F16:  return gemm_f16;
        default:                return NULL;
    }
}

#else

ggml_py_gemm_tile_fn ggml_py_gemm_tile_avx2(int type) {
    (void) type;
    return NULL;
}

ggml_py_gemv_fn ggml_py_gemv_avx2(int type) {
    (void) type;
    return NULL;
}

#endif /* GGML_PY_HAVE_AVX2 */
