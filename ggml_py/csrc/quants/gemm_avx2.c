/* gemm_avx2.c - blocked AVX2 tiles for MUL_MAT: 4 weight rows x 2 activation
 * rows per pass (x 1 for a single activation row, as in decoding), so each
 * loaded weight block meets two activation blocks and each activation block
 * four weight blocks, in independent chains of fmas. Every output runs the very
 * accumulation of its vec_dot (same lanes, same order), so tiles and vec_dot
 * agree bit for bit (F16 excepted: see gemm_f16_body). */
#include "quants_impl.h"
#include "simd.h"
#include "mul_mat.h"

#if defined(GGML_PY_HAVE_AVX2)
#include "quants_avx2.h"

#define R0 GGML_PY_GEMM_R0
#define R1 GGML_PY_GEMM_R1

/* The tile bodies are inlined into full-size and one-column specializations
 * (FULL_SIZES below), where the compiler keeps every accumulator in a register. */
#define INLINE static inline __attribute__((always_inline))

INLINE void gemm_q4_0_body(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                           size_t by, float *d, int64_t ldd, int64_t dd) {
    const int64_t nb = n / GGML_PY_QK4_0;
    const __m256i eight = _mm256_set1_epi8(8);
    __m256 acc[R0][R1];
    for (int i = 0; i < R0; i++)
        for (int j = 0; j < R1; j++) acc[i][j] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) {
        __m256i qy[R1], minus_ysum[R1];
        __m256 dy[R1];
        for (int j = 0; j < nr1; j++) {
            const ggml_py_block_q8_0 *yb = (const ggml_py_block_q8_0 *) (y + j * by) + ib;
            qy[j] = _mm256_loadu_si256((const __m256i *) yb->qs);
            /* (q - 8) . y = q . y - 8 * (sum of y), lane by lane */
            minus_ysum[j] = _mm256_sub_epi32(_mm256_setzero_si256(), ggml_py_dot_u8s8(eight, qy[j]));
            dy[j] = _mm256_set1_ps(FP16_TO_FP32(yb->d));
        }
        for (int i = 0; i < nr0; i++) {
            const ggml_py_block_q4_0 *xb = (const ggml_py_block_q4_0 *) (x + i * bx) + ib;
            const __m256i qx = ggml_py_nibbles32(xb->qs);
            const __m256 dx = _mm256_cvtph_ps(_mm_set1_epi16((short) xb->d));
            for (int j = 0; j < nr1; j++) {
                const __m256i s = ggml_py_dot_u8s8_acc(minus_ysum[j], qx, qy[j]);
                acc[i][j] = _mm256_fmadd_ps(_mm256_mul_ps(dx, dy[j]), _mm256_cvtepi32_ps(s), acc[i][j]);
            }
        }
    }
    for (int j = 0; j < nr1; j++)
        for (int i = 0; i < nr0; i++) d[j * ldd + i * dd] = ggml_py_hsum_ps_avx(acc[i][j]);
}

INLINE void gemm_q8_0_body(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                           size_t by, float *d, int64_t ldd, int64_t dd) {
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
        for (int i = 0; i < nr0; i++) d[j * ldd + i * dd] = ggml_py_hsum_ps_avx(acc[i][j]);
}

/* Q4_K or (five_bits) Q5_K x Q8_K: per super-block, each weight row's scales and
 * values are unpacked once for its activation rows; each output then takes
 * vec_dot_q4_K's / vec_dot_q5_K's steps. The two blocks differ only by Q5_K's qh. */
INLINE void gemm_k4_body(int five_bits, int64_t n, int nr0, int nr1, const char *x, size_t bx,
                         const char *y, size_t by, float *d, int64_t ldd, int64_t dd) {
    const int64_t nb = n / GGML_PY_QK_K;
    const size_t block = five_bits ? sizeof(ggml_py_block_q5_K) : sizeof(ggml_py_block_q4_K);
    float acc[R0][R1] = { { 0 } };
    for (int64_t ib = 0; ib < nb; ib++) {
        for (int i = 0; i < nr0; i++) {
            const ggml_py_block_q4_K *b4 = (const ggml_py_block_q4_K *) (x + i * bx + ib * block);
            const ggml_py_block_q5_K *b5 = (const ggml_py_block_q5_K *) b4;
            const uint8_t *qs = five_bits ? b5->qs : b4->qs, *qh = five_bits ? b5->qh : NULL;
            uint8_t sc[8], mn[8];
            for (int j = 0; j < 8; j++) ggml_py_get_scale_min_k4(j, b4->scales, &sc[j], &mn[j]);
            __m256i isum[R1];
            for (int j = 0; j < nr1; j++) isum[j] = _mm256_setzero_si256();
            for (int c = 0; c < 4; c++) {
                __m256i lo, hi;
                ggml_py_k4_chunk_values(qs, qh, c, &lo, &hi);
                for (int j = 0; j < nr1; j++) {
                    const ggml_py_block_q8_K *yb = (const ggml_py_block_q8_K *) (y + j * by) + ib;
                    isum[j] = _mm256_add_epi32(isum[j], ggml_py_k4_chunk_dot(lo, hi, yb->qs + 64 * c, sc + 2 * c));
                }
            }
            for (int j = 0; j < nr1; j++) {
                const ggml_py_block_q8_K *yb = (const ggml_py_block_q8_K *) (y + j * by) + ib;
                acc[i][j] += ggml_py_k4_finish(yb, isum[j], mn, b4->d, b4->dmin);
            }
        }
    }
    for (int j = 0; j < nr1; j++)
        for (int i = 0; i < nr0; i++) d[j * ldd + i * dd] = acc[i][j];
}

INLINE void gemm_q4_K_body(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                           size_t by, float *d, int64_t ldd, int64_t dd) {
    gemm_k4_body(0, n, nr0, nr1, x, bx, y, by, d, ldd, dd);
}

INLINE void gemm_q5_K_body(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                           size_t by, float *d, int64_t ldd, int64_t dd) {
    gemm_k4_body(1, n, nr0, nr1, x, bx, y, by, d, ldd, dd);
}

/* Q6_K x Q8_K: per super-block, each weight row's 6-bit values are unpacked once
 * for its activation rows; each output then takes vec_dot_q6_K's steps. */
INLINE void gemm_q6_K_body(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                           size_t by, float *d, int64_t ldd, int64_t dd) {
    const int64_t nb = n / GGML_PY_QK_K;
    float acc[R0][R1] = { { 0 } };
    for (int64_t ib = 0; ib < nb; ib++) {
        for (int i = 0; i < nr0; i++) {
            const ggml_py_block_q6_K *xb = (const ggml_py_block_q6_K *) (x + i * bx) + ib;
            __m256i isum[R1];
            for (int j = 0; j < nr1; j++) isum[j] = _mm256_setzero_si256();
            for (int c = 0; c < 2; c++) {
                const uint8_t *ql = xb->ql + 64 * c, *qh = xb->qh + 32 * c;
                const int8_t *sc = xb->scales + 8 * c;
                __m256i q[4];
                ggml_py_q6_K_half(ql, qh, q);
                for (int j = 0; j < nr1; j++) {
                    const int8_t *q8 = ((const ggml_py_block_q8_K *) (y + j * by) + ib)->qs + 128 * c;
                    for (int g = 0; g < 4; g++) {
                        isum[j] = _mm256_add_epi32(isum[j], ggml_py_q6_K_dot32(q[g], q8 + 32 * g, sc[2 * g], sc[2 * g + 1]));
                    }
                }
            }
            for (int j = 0; j < nr1; j++) {
                const ggml_py_block_q8_K *yb = (const ggml_py_block_q8_K *) (y + j * by) + ib;
                const float scale = FP16_TO_FP32(xb->d) * yb->d;
                acc[i][j] += scale * (float) ggml_py_hsum_i32_8(isum[j]);
            }
        }
    }
    for (int j = 0; j < nr1; j++)
        for (int i = 0; i < nr0; i++) d[j * ldd + i * dd] = acc[i][j];
}

/* F16 x F16: one accumulator per output (not bitwise equal to vec_dot_f16). */
INLINE void gemm_f16_body(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                          size_t by, float *d, int64_t ldd, int64_t dd) {
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
            d[j * ldd + i * dd] = sum;
        }
    }
}

#define FULL_SIZES(name)                                                                    \
    static void name(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,  \
                     size_t by, float *d, int64_t ldd, int64_t dd) {                        \
        if (nr0 == R0 && nr1 == R1) name##_body(n, R0, R1, x, bx, y, by, d, ldd, dd);       \
        else if (nr0 == R0 && nr1 == 1) name##_body(n, R0, 1, x, bx, y, by, d, ldd, dd);    \
        else name##_body(n, nr0, nr1, x, bx, y, by, d, ldd, dd);                             \
    }
FULL_SIZES(gemm_q4_0)
FULL_SIZES(gemm_q8_0)
FULL_SIZES(gemm_f16)
FULL_SIZES(gemm_q4_K)
FULL_SIZES(gemm_q5_K)
FULL_SIZES(gemm_q6_K)

ggml_py_gemm_tile_fn ggml_py_gemm_tile_avx2(int type, int64_t m) {
    switch (type) {
        case GGML_PY_TYPE_Q4_0: return gemm_q4_0;
        case GGML_PY_TYPE_Q8_0: return gemm_q8_0;
        case GGML_PY_TYPE_F16:  return gemm_f16;
        /* the K-quants' super-blocks gain nothing from four rows at M = 1, where
         * two threads read four far-apart rows of them slower (x0.6 - x0.9 on an
         * AMD EPYC VM) than vec_dot reads neighbouring rows */
        case GGML_PY_TYPE_Q4_K: return m > 1 ? gemm_q4_K : NULL;
        case GGML_PY_TYPE_Q5_K: return m > 1 ? gemm_q5_K : NULL;
        case GGML_PY_TYPE_Q6_K: return m > 1 ? gemm_q6_K : NULL;
        default:                return NULL;
    }
}

#else

ggml_py_gemm_tile_fn ggml_py_gemm_tile_avx2(int type, int64_t m) {
    (void) type;
    (void) m;
    return NULL;
}

#endif /* GGML_PY_HAVE_AVX2 */
