/* gemm_avx2.c - blocked AVX2 tiles for MUL_MAT: 4 weight rows x 2 activation
 * rows per pass (x 1 for a single activation row, as in decoding), so each
 * loaded weight block meets two activation blocks and each activation block
 * four weight blocks, in independent chains of fmas; Q4_0's and Q8_0's wide
 * tiles (8 x 4, below M = 8) and the panels (eight rows interleaved, below).
 * Every output runs the very accumulation of its vec_dot (same steps, same
 * order), so tiles, panels and vec_dot agree bit for bit (F16 excepted: see
 * gemm_f16_body). */
#include "quants_impl.h"
#include "simd.h"
#include "mul_mat.h"

#if defined(GGML_PY_HAVE_AVX2)
#include "quants_avx2.h"
#include "gemm_panels.h"

#define R0 GGML_PY_GEMM_R0
#define R1 GGML_PY_GEMM_R1

/* The tile bodies are inlined into full-size and one-column specializations
 * (FULL_SIZES below), where the compiler keeps every accumulator in a register. */
#define INLINE static inline __attribute__((always_inline))

/* Whether a byte dot product is one VNNI instruction (into int32 lanes), or maddubs +
 * madd, whose int16 step can sum several products before the widening madd. */
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(GGML_PY_HAVE_VNNI)
#define BYTE_DOT_IS_ONE_INSTRUCTION 1
#else
#define BYTE_DOT_IS_ONE_INSTRUCTION 0
#endif

_Static_assert(R0 == 4, "ggml_py_hsum4_i32_8 reduces four rows");

/* A block of a legacy type with one fp16 scale first: Q4_0 (q8 = 0) or Q8_0 (q8 = 1). */
#define LEGACY_BLOCK(q8) ((q8) ? sizeof(ggml_py_block_q8_0) : sizeof(ggml_py_block_q4_0))
static inline uint16_t legacy_d(const char *block) { uint16_t d; memcpy(&d, block, 2); return d; }

/* Its 32 values against qy's: Q8_0's signed bytes; Q4_0's nibbles (q - 8) as
 * q . y - 8 * (sum of y), lane by lane (minus_ysum). The same exact integers. */
INLINE __m256i legacy_dot(int q8, __m256i qx, __m256i qy, __m256i minus_ysum) {
    return q8 ? ggml_py_dot_s8s8(qx, qy) : ggml_py_dot_u8s8_acc(minus_ysum, qx, qy);
}
INLINE __m256i legacy_values(int q8, const char *block) {
    return q8 ? _mm256_loadu_si256((const __m256i *) (block + 2)) : ggml_py_nibbles32((const uint8_t *) block + 2);
}
INLINE __m256i legacy_minus_ysum(int q8, __m256i qy) {
    return q8 ? _mm256_setzero_si256()
              : _mm256_sub_epi32(_mm256_setzero_si256(), ggml_py_dot_u8s8(_mm256_set1_epi8(8), qy));
}

/* Q4_0 or Q8_0 x Q8_0, vec_dot's order: each block summed exactly, then
 * acc = fma(dx * dy, sum, acc); the four rows' sums of a column share one fma. */
INLINE void legacy_tile_body(int q8, int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                             size_t by, float *d, int64_t ldd, int64_t dd) {
    const int64_t nb = n / GGML_PY_QK4_0;
    const size_t bs = LEGACY_BLOCK(q8);
    __m128 acc[R1];   /* lane i: row i against activation row j */
    for (int j = 0; j < R1; j++) acc[j] = _mm_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) {
        __m256i qy[R1], minus_ysum[R1], s[R1][R0];
        float dy[R1];
        for (int j = 0; j < nr1; j++) {
            const ggml_py_block_q8_0 *yb = (const ggml_py_block_q8_0 *) (y + j * by) + ib;
            qy[j] = _mm256_loadu_si256((const __m256i *) yb->qs);
            minus_ysum[j] = legacy_minus_ysum(q8, qy[j]);
            dy[j] = FP16_TO_FP32(yb->d);
        }
        uint64_t dxh = 0;   /* the rows' fp16 scales, row i in bits 16i..; missing rows: 0, sums 0 */
        for (int i = 0; i < R0; i++) {
            if (i >= nr0) {
                for (int j = 0; j < nr1; j++) s[j][i] = _mm256_setzero_si256();
                continue;
            }
            const char *xb = x + i * bx + ib * bs;
            const __m256i qx = legacy_values(q8, xb);
            dxh |= (uint64_t) legacy_d(xb) << (16 * i);
            for (int j = 0; j < nr1; j++) s[j][i] = legacy_dot(q8, qx, qy[j], minus_ysum[j]);
        }
        const __m128 dx = _mm_cvtph_ps(_mm_cvtsi64_si128((long long) dxh));
        for (int j = 0; j < nr1; j++) {
            const __m128 dxy = _mm_mul_ps(dx, _mm_set1_ps(dy[j]));
            acc[j] = _mm_fmadd_ps(dxy, _mm_cvtepi32_ps(ggml_py_hsum4_i32_8(s[j])), acc[j]);
        }
    }
    for (int j = 0; j < nr1; j++) {
        float out[R0];
        _mm_storeu_ps(out, acc[j]);
        for (int i = 0; i < nr0; i++) d[j * ldd + i * dd] = out[i];
    }
}

INLINE void gemm_q4_0_body(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                           size_t by, float *d, int64_t ldd, int64_t dd) {
    legacy_tile_body(0, n, nr0, nr1, x, bx, y, by, d, ldd, dd);
}

INLINE void gemm_q8_0_body(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                           size_t by, float *d, int64_t ldd, int64_t dd) {
    legacy_tile_body(1, n, nr0, nr1, x, bx, y, by, d, ldd, dd);
}

/* The K-quants' float step for four rows against activation block yb at once:
 * acc += dx * dy * isum (- dmin * dy * summs where the type has mins), row by
 * row (the scalar steps of vec_dot in four lanes: same operations, same bits);
 * dh, mh: the rows' fp16 d and dmin, row i in bits 16i.. (missing rows: 0). */
INLINE __m128 k_finish4(__m128 acc, const ggml_py_block_q8_K *yb, uint64_t dh, __m128i isum,
                        int has_mins, uint64_t mh, __m128i summs) {
    const __m128 dy = _mm_set1_ps(yb->d);
    const __m128 d = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi64_si128((long long) dh)), dy);
    __m128 t = _mm_mul_ps(d, _mm_cvtepi32_ps(isum));
    if (has_mins) {
        const __m128 dmin = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi64_si128((long long) mh)), dy);
        t = _mm_sub_ps(t, _mm_mul_ps(dmin, _mm_cvtepi32_ps(summs)));
    }
    return _mm_add_ps(acc, t);
}

static inline void store4(const __m128 acc[R1], int nr0, int nr1, float *d, int64_t ldd, int64_t dd) {
    for (int j = 0; j < nr1; j++) {
        float out[R0];
        _mm_storeu_ps(out, acc[j]);
        for (int i = 0; i < nr0; i++) d[j * ldd + i * dd] = out[i];
    }
}

/* Q4_K or (five_bits) Q5_K x Q8_K: per super-block, each weight row's scales and
 * values are unpacked once for its activation rows; each output then takes
 * vec_dot_q4_K's / vec_dot_q5_K's integer sums, and their float step runs for the
 * four rows at once. The two blocks differ only by Q5_K's qh. */
INLINE void gemm_k4_body(int five_bits, int64_t n, int nr0, int nr1, const char *x, size_t bx,
                         const char *y, size_t by, float *d, int64_t ldd, int64_t dd) {
    const int64_t nb = n / GGML_PY_QK_K;
    const size_t block = five_bits ? sizeof(ggml_py_block_q5_K) : sizeof(ggml_py_block_q4_K);
    __m128 acc[R1];   /* lane i: row i against activation row j */
    for (int j = 0; j < R1; j++) acc[j] = _mm_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) {
        __m256i isum[R1][R0];
        __m128i summs[R1][R0];
        uint64_t dh = 0, mh = 0;
        for (int i = 0; i < R0; i++) {
            if (i >= nr0) {
                for (int j = 0; j < nr1; j++) {
                    isum[j][i] = _mm256_setzero_si256();
                    summs[j][i] = _mm_setzero_si128();
                }
                continue;
            }
            const ggml_py_block_q4_K *b4 = (const ggml_py_block_q4_K *) (x + i * bx + ib * block);
            const ggml_py_block_q5_K *b5 = (const ggml_py_block_q5_K *) b4;
            const uint8_t *qs = five_bits ? b5->qs : b4->qs, *qh = five_bits ? b5->qh : NULL;
            const __m256i sm = ggml_py_k4_scales_mins(b4->scales);
            const __m256i scales = _mm256_permute2x128_si256(sm, sm, 0x00);
            dh |= (uint64_t) b4->d << (16 * i);
            mh |= (uint64_t) b4->dmin << (16 * i);
            for (int j = 0; j < nr1; j++) {
                const ggml_py_block_q8_K *yb = (const ggml_py_block_q8_K *) (y + j * by) + ib;
                summs[j][i] = ggml_py_k4_mins_dot(sm, yb->bsums);
                isum[j][i] = _mm256_setzero_si256();
            }
            for (int c = 0; c < 4; c++) {
                __m256i lo, hi;
                ggml_py_k4_chunk_values(qs, qh, c, &lo, &hi);
                for (int j = 0; j < nr1; j++) {
                    const ggml_py_block_q8_K *yb = (const ggml_py_block_q8_K *) (y + j * by) + ib;
                    isum[j][i] = _mm256_add_epi32(isum[j][i], ggml_py_k4_chunk_dot(lo, hi, yb->qs + 64 * c, scales, c));
                }
            }
        }
        for (int j = 0; j < nr1; j++) {
            const ggml_py_block_q8_K *yb = (const ggml_py_block_q8_K *) (y + j * by) + ib;
            acc[j] = k_finish4(acc[j], yb, dh, ggml_py_hsum4_i32_8(isum[j]), 1, mh, ggml_py_hsum4_i32_4(summs[j]));
        }
    }
    store4(acc, nr0, nr1, d, ldd, dd);
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
 * for its activation rows; each output then takes vec_dot_q6_K's integer sum,
 * and the float step runs for the four rows at once. */
INLINE void gemm_q6_K_body(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                           size_t by, float *d, int64_t ldd, int64_t dd) {
    const int64_t nb = n / GGML_PY_QK_K;
    __m128 acc[R1];
    for (int j = 0; j < R1; j++) acc[j] = _mm_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) {
        __m256i isum[R1][R0];
        uint64_t dh = 0;
        for (int i = 0; i < R0; i++) {
            if (i >= nr0) {
                for (int j = 0; j < nr1; j++) isum[j][i] = _mm256_setzero_si256();
                continue;
            }
            const ggml_py_block_q6_K *xb = (const ggml_py_block_q6_K *) (x + i * bx) + ib;
            dh |= (uint64_t) xb->d << (16 * i);
            for (int j = 0; j < nr1; j++) {
                const ggml_py_block_q8_K *yb = (const ggml_py_block_q8_K *) (y + j * by) + ib;
                isum[j][i] = _mm256_sub_epi32(_mm256_setzero_si256(), ggml_py_k_offset(_mm_loadu_si128((const __m128i *) xb->scales), yb->bsums, 5));
            }
            for (int c = 0; c < 2; c++) {
                const __m256i sc = ggml_py_scales8_i16(_mm_loadl_epi64((const __m128i *) (xb->scales + 8 * c)));
                __m256i q[4];
                ggml_py_q6_K_half(xb->ql + 64 * c, xb->qh + 32 * c, q);
                for (int g = 0; g < 4; g++) {
                    const __m256i s = ggml_py_spread_i16(sc, 2 * g, 2 * g + 1);
                    for (int j = 0; j < nr1; j++) {
                        const int8_t *q8 = ((const ggml_py_block_q8_K *) (y + j * by) + ib)->qs + 128 * c;
                        isum[j][i] = _mm256_add_epi32(isum[j][i], ggml_py_q6_K_dot32(q[g], q8 + 32 * g, s));
                    }
                }
            }
        }
        for (int j = 0; j < nr1; j++) {
            const ggml_py_block_q8_K *yb = (const ggml_py_block_q8_K *) (y + j * by) + ib;
            acc[j] = k_finish4(acc[j], yb, dh, ggml_py_hsum4_i32_8(isum[j]), 0, 0, _mm_setzero_si128());
        }
    }
    store4(acc, nr0, nr1, d, ldd, dd);
}

/* Q2_K or (three_bits) Q3_K x Q8_K: per super-block, each weight row's scales
 * (and Q2_K's mins, Q3_K's offset of 4) are unpacked once and each group of 32
 * values once for its activation rows; each output then takes vec_dot_q2_K's /
 * vec_dot_q3_K's integer sum, and the float step runs for the four rows at once. */
INLINE void gemm_k23_body(int three_bits, int64_t n, int nr0, int nr1, const char *x, size_t bx,
                          const char *y, size_t by, float *d, int64_t ldd, int64_t dd) {
    const int64_t nb = n / GGML_PY_QK_K;
    const size_t block = three_bits ? sizeof(ggml_py_block_q3_K) : sizeof(ggml_py_block_q2_K);
    __m128 acc[R1];
    for (int j = 0; j < R1; j++) acc[j] = _mm_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) {
        __m256i isum[R1][R0], summs[R1][R0];
        uint64_t dh = 0, mh = 0;
        for (int i = 0; i < R0; i++) {
            for (int j = 0; j < nr1; j++) isum[j][i] = summs[j][i] = _mm256_setzero_si256();
            if (i >= nr0) continue;
            const ggml_py_block_q2_K *b2 = (const ggml_py_block_q2_K *) (x + i * bx + ib * block);
            const ggml_py_block_q3_K *b3 = (const ggml_py_block_q3_K *) b2;
            __m128i sc3 = _mm_setzero_si128();
            __m256i hmask = _mm256_setzero_si256();
            if (three_bits) {
                sc3 = ggml_py_q3_K_scales_v(b3->scales);
                hmask = _mm256_loadu_si256((const __m256i *) b3->hmask);
                dh |= (uint64_t) b3->d << (16 * i);
            } else {
                dh |= (uint64_t) b2->d << (16 * i);
                mh |= (uint64_t) b2->dmin << (16 * i);
            }
            for (int j = 0; j < nr1; j++) {
                const ggml_py_block_q8_K *yb = (const ggml_py_block_q8_K *) (y + j * by) + ib;
                if (three_bits) isum[j][i] = _mm256_sub_epi32(isum[j][i], ggml_py_k_offset(sc3, yb->bsums, 2));
                else summs[j][i] = ggml_py_q2_K_mins_dot(b2->scales, yb->bsums);
            }
            for (int c = 0; c < 2; c++) {
                const __m256i sc = three_bits ? ggml_py_scales8_i16(c ? _mm_unpackhi_epi64(sc3, sc3) : sc3)
                                              : ggml_py_q2_K_half_scales(b2->scales + 8 * c);
                const __m256i q2 = _mm256_loadu_si256((const __m256i *) ((three_bits ? b3->qs : b2->qs) + 32 * c));
                for (int k = 0; k < 4; k++) {
                    const __m256i v = ggml_py_k23_values(q2, three_bits ? &hmask : NULL, c, k);
                    const __m256i s = ggml_py_spread_i16(sc, 2 * k, 2 * k + 1);
                    for (int j = 0; j < nr1; j++) {
                        const int8_t *q8 = ((const ggml_py_block_q8_K *) (y + j * by) + ib)->qs + 128 * c + 32 * k;
                        const __m256i p = _mm256_maddubs_epi16(v, _mm256_loadu_si256((const __m256i *) q8));
                        isum[j][i] = _mm256_add_epi32(isum[j][i], _mm256_madd_epi16(p, s));
                    }
                }
            }
        }
        for (int j = 0; j < nr1; j++) {
            const ggml_py_block_q8_K *yb = (const ggml_py_block_q8_K *) (y + j * by) + ib;
            acc[j] = k_finish4(acc[j], yb, dh, ggml_py_hsum4_i32_8(isum[j]), !three_bits, mh,
                               ggml_py_hsum4_i32_8(summs[j]));
        }
    }
    store4(acc, nr0, nr1, d, ldd, dd);
}

INLINE void gemm_q2_K_body(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                           size_t by, float *d, int64_t ldd, int64_t dd) {
    gemm_k23_body(0, n, nr0, nr1, x, bx, y, by, d, ldd, dd);
}

INLINE void gemm_q3_K_body(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                           size_t by, float *d, int64_t ldd, int64_t dd) {
    gemm_k23_body(1, n, nr0, nr1, x, bx, y, by, d, ldd, dd);
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
FULL_SIZES(gemm_q2_K)
FULL_SIZES(gemm_q3_K)

/* ---- one activation row (decoding): eight weight rows at once ----------------
 *
 * Lane i of the result: the sum of s[i]'s lanes, for eight vectors. */
static inline __m256i hsum8_i32_8(const __m256i s[8]) {
    __m256i u[2];
    for (int h = 0; h < 2; h++) {
        const __m256i *q = s + 4 * h;
        const __m256i t0 = _mm256_add_epi32(_mm256_unpacklo_epi32(q[0], q[1]), _mm256_unpackhi_epi32(q[0], q[1]));
        const __m256i t1 = _mm256_add_epi32(_mm256_unpacklo_epi32(q[2], q[3]), _mm256_unpackhi_epi32(q[2], q[3]));
        u[h] = _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
    }
    /* u[h]'s 128-bit halves hold rows 4h .. 4h + 3's sums of the low and high lanes */
    return _mm256_add_epi32(_mm256_permute2x128_si256(u[0], u[1], 0x20),
                            _mm256_permute2x128_si256(u[0], u[1], 0x31));
}

/* d[c * ldd + i * dd] = lane i of acc[c], for the nr0 rows and nr1 activation rows of
 * an eight-row wide tile or panel. */
static inline void store_rows8(const __m256 *acc, int nr0, int nr1, float *d, int64_t ldd, int64_t dd) {
    for (int c = 0; c < nr1; c++) {
        float out[8];
        _mm256_storeu_ps(out, acc[c]);
        for (int i = 0; i < nr0; i++) d[c * ldd + i * dd] = out[i];
    }
}

/* Q4_0 or Q8_0 x up to four Q8_0 rows, eight weight rows at once (decoding one to
 * a few sequences): each block's eight exact sums against an activation row land
 * in one vector's lanes, so one fma a block serves eight rows' chains, in
 * vec_dot's order (the 4 x 2 tile spent as much on gathering four scales and
 * reducing four sums as on the products); each row's values are unpacked once
 * for the activation rows. */
INLINE void legacy_wide_body(int q8, int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                             size_t by, float *d, int64_t ldd, int64_t dd) {
    const int64_t nb = n / GGML_PY_QK4_0;
    const size_t bs = LEGACY_BLOCK(q8);
    const char *xr[GGML_PY_WIDE_R0];   /* missing rows read row 0, not stored */
    for (int i = 0; i < GGML_PY_WIDE_R0; i++) xr[i] = x + (i < nr0 ? i : 0) * bx;
    __m256 acc[GGML_PY_WIDE_R1];   /* lane i: row i against activation row c */
    for (int c = 0; c < nr1; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) {
        __m256i qx[GGML_PY_WIDE_R0];
        for (int i = 0; i < GGML_PY_WIDE_R0; i++) qx[i] = legacy_values(q8, xr[i] + ib * bs);
        const __m128i dh = _mm_setr_epi16((short) legacy_d(xr[0] + ib * bs), (short) legacy_d(xr[1] + ib * bs),
                                          (short) legacy_d(xr[2] + ib * bs), (short) legacy_d(xr[3] + ib * bs),
                                          (short) legacy_d(xr[4] + ib * bs), (short) legacy_d(xr[5] + ib * bs),
                                          (short) legacy_d(xr[6] + ib * bs), (short) legacy_d(xr[7] + ib * bs));
        const __m256 dx = _mm256_cvtph_ps(dh);
        for (int c = 0; c < nr1; c++) {
            const ggml_py_block_q8_0 *yb = (const ggml_py_block_q8_0 *) (y + c * by) + ib;
            const __m256i qy = _mm256_loadu_si256((const __m256i *) yb->qs);
            const __m256i minus_ysum = legacy_minus_ysum(q8, qy);
            __m256i s8[GGML_PY_WIDE_R0];
            for (int i = 0; i < GGML_PY_WIDE_R0; i++) s8[i] = legacy_dot(q8, qx[i], qy, minus_ysum);
            const __m256 dxy = _mm256_mul_ps(dx, _mm256_set1_ps(FP16_TO_FP32(yb->d)));
            acc[c] = _mm256_fmadd_ps(dxy, _mm256_cvtepi32_ps(hsum8_i32_8(s8)), acc[c]);
        }
    }
    store_rows8(acc, nr0, nr1, d, ldd, dd);
}

/* one specialization per activation row count: the compiler keeps the accumulators in registers */
#define WIDE_SIZES(name, q8)                                                                       \
    static void name(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y, size_t by, \
                     float *d, int64_t ldd, int64_t dd) {                                          \
        switch (nr1) {                                                                             \
            case 1:  legacy_wide_body(q8, n, nr0, 1, x, bx, y, by, d, ldd, dd); return;            \
            case 2:  legacy_wide_body(q8, n, nr0, 2, x, bx, y, by, d, ldd, dd); return;            \
            case 3:  legacy_wide_body(q8, n, nr0, 3, x, bx, y, by, d, ldd, dd); return;            \
            default: legacy_wide_body(q8, n, nr0, 4, x, bx, y, by, d, ldd, dd); return;            \
        }                                                                                          \
    }
_Static_assert(GGML_PY_WIDE_R1 == 4, "WIDE_SIZES has one case per activation row count");
WIDE_SIZES(gemm_q4_0_wide, 0)
WIDE_SIZES(gemm_q8_0_wide, 1)

/* ---- Q4_0 and Q8_0 panels: eight weight rows interleaved, against many activation rows ----
 *
 * The rows are unpacked to bytes a chunk of blocks at a time and interleaved so
 * that one 32-byte vector holds values 4g .. 4g + 3 of a block for all eight rows:
 * one byte dot product with four activation bytes broadcast then adds into the
 * eight rows' block sums at once, and one fma per block and activation row adds
 * the eight sums in, in vec_dot's order (so a panel's outputs equal it bit for
 * bit). */
#define PANEL_CHUNK 64   /* blocks interleaved at a time: 16 KiB of values, in L1 */
#define PANEL_COLS GGML_PY_PANEL_PASS   /* activation rows run together */
#define ROWS8_BLOCK (8 * sizeof(ggml_py_block_q4_0))   /* a block of eight interleaved rows */
_Static_assert(GGML_PY_PANEL_ROWS == 8, "a panel's rows are the eight int32 lanes of a vector");

/* The eight words of each group of eight vectors transposed in place (q[8 i + r]
 * word g -> q[8 i + g] word r), for n groups. */
static inline void transpose8x8_i32(__m256i *q, int n) {
    for (int i = 0; i < n; i++, q += 8) {
        __m256i t[8], u[8];
        for (int r = 0; r < 8; r += 2) {
            t[r] = _mm256_unpacklo_epi32(q[r], q[r + 1]);
            t[r + 1] = _mm256_unpackhi_epi32(q[r], q[r + 1]);
        }
        for (int r = 0; r < 8; r += 4) {
            u[r] = _mm256_unpacklo_epi64(t[r], t[r + 2]);
            u[r + 1] = _mm256_unpackhi_epi64(t[r], t[r + 2]);
            u[r + 2] = _mm256_unpacklo_epi64(t[r + 1], t[r + 3]);
            u[r + 3] = _mm256_unpackhi_epi64(t[r + 1], t[r + 3]);
        }
        for (int g = 0; g < 4; g++) {
            q[g] = _mm256_permute2x128_si256(u[g], u[g + 4], 0x20);
            q[g + 4] = _mm256_permute2x128_si256(u[g], u[g + 4], 0x31);
        }
    }
}

/* Blocks [b0, b0 + nbc) of nr0 <= 8 rows of Q4_0 or (q8) Q8_0, bx apart: w[8 b + g]
 * lane r = row r's values 4g .. 4g + 3 of block b0 + b (Q4_0's 0 .. 15), dx[8 b + r]
 * its scale; rows past nr0 are zeros. */
INLINE void legacy_interleave(int q8, int nr0, const char *x, size_t bx, int64_t b0, int nbc, __m256i *w,
                              float *dx) {
    const size_t bs = LEGACY_BLOCK(q8);
    /* first each row's values in turn, read front to back (eight rows read block
     * by block side by side ran at x0.76 where the weights did not fit in L3) */
    for (int r = 0; r < GGML_PY_PANEL_ROWS; r++) {
        const char *xb = x + r * bx + b0 * bs;
        for (int b = 0; b < nbc; b++) {
            w[8 * b + r] = r < nr0 ? legacy_values(q8, xb + b * bs) : _mm256_setzero_si256();
            dx[8 * b + r] = r < nr0 ? ggml_py_fp16_to_fp32(legacy_d(xb + b * bs)) : 0.0f;
        }
    }
    transpose8x8_i32(w, nbc);   /* then each block's 8 x 8 words */
}

/* acc[c] += the interleaved blocks [0, nbc) against activation rows c < nc
 * (y: their block b0, by apart; yt: their block terms, nb apart).
 * Q8_0's signed values meet the activation bytes with their signs moved over. */
INLINE void legacy_panel_chunk(int q8, int nc, int nbc, const __m256i *w, const float *dx, const char *y,
                               size_t by, const struct ggml_py_q8_0_terms *yt, int64_t nb, __m256 *acc) {
    __m256 a[PANEL_COLS];
    for (int c = 0; c < nc; c++) a[c] = acc[c];
    for (int b = 0; b < nbc; b++) {
        __m256i even[PANEL_COLS], odd[PANEL_COLS];   /* two chains per row */
        for (int c = 0; c < nc; c++) {
            even[c] = q8 ? _mm256_setzero_si256() : _mm256_set1_epi32(yt[c * nb + b].minus8_sum);   /* (q - 8) . y */
            odd[c] = _mm256_setzero_si256();
        }
        if (!q8 && !BYTE_DOT_IS_ONE_INSTRUCTION) {
            /* Q4_0's products (values < 16) summed in int16 over the whole block, eight
             * groups (|sum| <= 8 * 2 * 15 * 127 < 2^15), then one madd: half the
             * multiplier work of a maddubs + madd per group; the same exact integers */
            __m256i s16[PANEL_COLS];
            for (int c = 0; c < nc; c++) s16[c] = _mm256_setzero_si256();
            for (int g = 0; g < 8; g++) {
                const __m256i w0 = _mm256_load_si256(w + 8 * b + g);
                for (int c = 0; c < nc; c++) {
                    int32_t y4;
                    memcpy(&y4, ((const ggml_py_block_q8_0 *) (y + c * by) + b)->qs + 4 * g, 4);
                    s16[c] = _mm256_add_epi16(s16[c], _mm256_maddubs_epi16(w0, _mm256_set1_epi32(y4)));
                    GGML_PY_KEEP_IN_REGISTER(s16[c]);
                }
            }
            for (int c = 0; c < nc; c++) even[c] = _mm256_add_epi32(even[c], _mm256_madd_epi16(s16[c], _mm256_set1_epi16(1)));
        } else {
            for (int g = 0; g < 8; g += 2) {
                const __m256i w0 = _mm256_load_si256(w + 8 * b + g), w1 = _mm256_load_si256(w + 8 * b + g + 1);
                const __m256i u0 = q8 ? _mm256_sign_epi8(w0, w0) : w0, u1 = q8 ? _mm256_sign_epi8(w1, w1) : w1;
                for (int c = 0; c < nc; c++) {
                    const int8_t *qs = ((const ggml_py_block_q8_0 *) (y + c * by) + b)->qs;
                    int32_t y0, y1;
                    memcpy(&y0, qs + 4 * g, 4);
                    memcpy(&y1, qs + 4 * g + 4, 4);
                    __m256i v0 = _mm256_set1_epi32(y0), v1 = _mm256_set1_epi32(y1);
                    if (q8) v0 = _mm256_sign_epi8(v0, w0), v1 = _mm256_sign_epi8(v1, w1);
                    even[c] = ggml_py_dot_u8s8_acc(even[c], u0, v0);
                    odd[c] = ggml_py_dot_u8s8_acc(odd[c], u1, v1);
                }
            }
        }
        const __m256 dxv = _mm256_load_ps(dx + 8 * b);
        for (int c = 0; c < nc; c++) {
            const __m256 sums = _mm256_cvtepi32_ps(_mm256_add_epi32(even[c], odd[c]));
            a[c] = _mm256_fmadd_ps(_mm256_mul_ps(dxv, _mm256_set1_ps(yt[c * nb + b].d)), sums, a[c]);
        }
    }
    for (int c = 0; c < nc; c++) acc[c] = a[c];
}

/* Blocks [b0, b0 + nbc) of eight Q4_0 rows interleaved by ggml_py_q4_0_interleave_rows8
 * (x: the group's first byte), into legacy_interleave's layout: only the nibbles to
 * unpack. */
INLINE void rows8_interleave(const char *x, int64_t b0, int nbc, __m256i *w, float *dx) {
    const __m256i low = _mm256_set1_epi8(0xF);
    for (int b = 0; b < nbc; b++) {
        const char *xb = x + (b0 + b) * ROWS8_BLOCK;
        _mm256_store_ps(dx + 8 * b, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) xb)));
        for (int j = 0; j < 4; j++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *) (xb + 16 + 32 * j));
            w[8 * b + j] = _mm256_and_si256(v, low);
            w[8 * b + 4 + j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        }
    }
}

/* A panel of nr0 rows bx apart (rows8: eight rows interleaved by
 * ggml_py_q4_0_interleave_rows8 at x) against nr1 activation rows. */
INLINE void legacy_panel(int q8, int rows8, int64_t n, int nr0, int nr1, const char *x, size_t bx,
                         const char *y, size_t by, const struct ggml_py_q8_0_terms *yt, float *d, int64_t ldd) {
    const int64_t nb = n / GGML_PY_QK4_0;
    _Alignas(32) __m256i w[8 * PANEL_CHUNK];
    _Alignas(32) float dx[8 * PANEL_CHUNK];
    __m256 acc[GGML_PY_PANEL_COLS];   /* lane r: row r against activation row c */
    for (int c = 0; c < nr1; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += PANEL_CHUNK) {
        const int nbc = (int) GGML_PY_MIN(PANEL_CHUNK, nb - b0);
        if (rows8) rows8_interleave(x, b0, nbc, w, dx);
        else legacy_interleave(q8, nr0, x, bx, b0, nbc, w, dx);
        for (int c = 0; c < nr1; c += PANEL_COLS) {
#define PASS(nc) legacy_panel_chunk(q8, nc, nbc, w, dx, y + c * by + b0 * sizeof(ggml_py_block_q8_0), by, \
                                    yt + c * nb + b0, nb, acc + c)
            GGML_PY_PANEL_PASSES(nr1 - c, PASS)
#undef PASS
        }
    }
    store_rows8(acc, nr0, nr1, d, ldd, 1);
}

static void gemm_q4_0_panel(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                            size_t by, const struct ggml_py_q8_0_terms *yt, float *d, int64_t ldd) {
    legacy_panel(0, 0, n, nr0, nr1, x, bx, y, by, yt, d, ldd);
}

static void gemm_q8_0_panel(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                            size_t by, const struct ggml_py_q8_0_terms *yt, float *d, int64_t ldd) {
    legacy_panel(1, 0, n, nr0, nr1, x, bx, y, by, yt, d, ldd);
}

/* The rows8 kernels below M = 8 ask for their stream ROWS8_PREFETCH bytes ahead, part
 * `i` of `n` of each block (xb, `block` bytes) as they go: the hardware prefetchers alone
 * kept too few reads in flight (docs/benchmarks.md, "Interleaved rows"). */
#define ROWS8_PREFETCH 2048

INLINE void rows8_prefetch(const char *xb, size_t block, int i, int n) {
    for (size_t l = block * i / n; l < block * (i + 1) / n; l += 64) _mm_prefetch(xb + ROWS8_PREFETCH + l, _MM_HINT_T0);
}

/* ---- Q4_0 rows interleaved by eight (a tensor's rows8) ----
 *
 * Eight neighbouring rows as a panel takes them, read from one sequential stream
 * laid out for this (ggml_py_q4_0_interleave_rows8): a block's eight scales are one
 * load, and each 32-byte load holds four values of every row in its lane, so the
 * products land in the rows' own lanes (no reduction across lanes, no gather of
 * scales), and the memory is read front to back (the wide tile's eight far-apart
 * rows were eight streams). Outputs equal vec_dot's bit for bit: each block's
 * exact integer sum, then one fma a block in vec_dot's order. */

/* Below GGML_PY_PANEL_MIN_M activation rows: up to ROWS8_FEW (nc) at a time, the values
 * unpacked in registers once per block for them; ng (1 or 2) groups of eight rows side
 * by side, x[t] into d[t]: two streams of memory in flight where one stream read the
 * weights slower than the products could take them (a C loop over 311 MB, one thread:
 * 11.5 - 12.2 GB/s with one group, 16.8 - 17.7 with two). */
#define ROWS8_FEW 4
INLINE void rows8_few_body(int ng, int nc, int64_t nb, const char *const x[2], const char *y, size_t by,
                           const struct ggml_py_q8_0_terms *yt, float *const d[2], int64_t ldd) {
    const __m256i low = _mm256_set1_epi8(0xF);
    __m256 acc[2][ROWS8_FEW];   /* lane r: row r of group t against activation row c */
    for (int t = 0; t < ng; t++)
        for (int c = 0; c < nc; c++) acc[t][c] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) {
        for (int t = 0; t < ng; t++) {
            const char *xb = x[t] + ib * ROWS8_BLOCK;
            rows8_prefetch(xb, ROWS8_BLOCK, 0, 1);
            const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) xb));
            __m256i v[8];   /* v[g] lane r: row r's values 4g .. 4g + 3 */
            for (int j = 0; j < 4; j++) {
                const __m256i packed = _mm256_loadu_si256((const __m256i *) (xb + 16 + 32 * j));
                v[j] = _mm256_and_si256(packed, low);
                v[4 + j] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
            }
            for (int c = 0; c < nc; c++) {
                const ggml_py_block_q8_0 *yb = (const ggml_py_block_q8_0 *) (y + c * by) + ib;
                int32_t y4[8];
                memcpy(y4, yb->qs, sizeof(y4));
                __m256i sum = _mm256_set1_epi32(yt[c * nb + ib].minus8_sum);   /* (q - 8) . y */
                if (!BYTE_DOT_IS_ONE_INSTRUCTION) {
                    /* summed in int16 (values < 16: |sum| <= 8 * 2 * 15 * 127 < 2^15), one madd */
                    __m256i s16 = _mm256_maddubs_epi16(v[0], _mm256_set1_epi32(y4[0]));
                    for (int g = 1; g < 8; g++) {
                        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(v[g], _mm256_set1_epi32(y4[g])));
                        GGML_PY_KEEP_IN_REGISTER(s16);
                    }
                    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(s16, _mm256_set1_epi16(1)));
                } else {
                    for (int g = 0; g < 8; g++) sum = ggml_py_dot_u8s8_acc(sum, v[g], _mm256_set1_epi32(y4[g]));
                }
                const __m256 dxy = _mm256_mul_ps(dx, _mm256_set1_ps(yt[c * nb + ib].d));
                acc[t][c] = _mm256_fmadd_ps(dxy, _mm256_cvtepi32_ps(sum), acc[t][c]);
            }
        }
    }
    for (int t = 0; t < ng; t++) store_rows8(acc[t], GGML_PY_PANEL_ROWS, nc, d[t], ldd, 1);
}

/* The 512-bit Q4_0 panel takes an item's two groups from this many activation rows (the
 * 256-bit panels and the K-quants' 512-bit ones from GGML_PY_PANEL_MIN_M: below it their
 * unpacking costs more than the few-row kernels' registers) */
#define Q4_0_PANEL16_MIN_M 4

/* The rows8 contract (mul_mat.h): x, x2 eight interleaved rows each (x2 may be NULL). */
static void gemm_q4_0_rows8(int64_t n, int nr1, const char *x, const char *x2, const char *y, size_t by,
                            const struct ggml_py_q8_0_terms *yt, float *d, float *d2, int64_t ldd) {
    const int64_t nb = n / GGML_PY_QK4_0;
#if defined(GGML_PY_HAVE_PANEL16)
    if (x2 && nr1 >= Q4_0_PANEL16_MIN_M) {   /* both groups in one 512-bit register */
        ggml_py_gemm_q4_0_rows16_avx512(n, nr1, x, x2, y, by, yt, d, d2, ldd);
        return;
    }
#endif
    if (nr1 >= GGML_PY_PANEL_MIN_M) {
        legacy_panel(0, 1, n, GGML_PY_PANEL_ROWS, nr1, x, 0, y, by, yt, d, ldd);
        if (x2) legacy_panel(0, 1, n, GGML_PY_PANEL_ROWS, nr1, x2, 0, y, by, yt, d2, ldd);
        return;
    }
    for (int c = 0; c < nr1; c += ROWS8_FEW) {   /* one specialization per count */
        const char *yc = y + c * by;
        const struct ggml_py_q8_0_terms *tc = yt + c * nb;
        const char *const both[2] = { x, x2 }, *const first[2] = { x, NULL }, *const second[2] = { x2, NULL };
        float *const d_both[2] = { d + c * ldd, d2 ? d2 + c * ldd : NULL };
        float *const d_first[2] = { d + c * ldd, NULL }, *const d_second[2] = { d_both[1], NULL };
        switch (GGML_PY_MIN(ROWS8_FEW, nr1 - c) + (x2 ? 10 : 0)) {   /* two groups: up to two rows (three with 32 registers and VNNI) */
            case 11: rows8_few_body(2, 1, nb, both, yc, by, tc, d_both, ldd); break;
            case 12: rows8_few_body(2, 2, nb, both, yc, by, tc, d_both, ldd); break;
            case 1:  rows8_few_body(1, 1, nb, first, yc, by, tc, d_first, ldd); break;
            case 2:  rows8_few_body(1, 2, nb, first, yc, by, tc, d_first, ldd); break;
            case 3:  rows8_few_body(1, 3, nb, first, yc, by, tc, d_first, ldd); break;
            case 4:  rows8_few_body(1, 4, nb, first, yc, by, tc, d_first, ldd); break;
#if defined(__AVX512VL__) && defined(__AVX512VNNI__)
            /* 32 vector registers and one instruction a byte dot: both groups' sums for
             * three rows, two streams of memory (without VNNI that measured slower) */
            case 13: rows8_few_body(2, 3, nb, both, yc, by, tc, d_both, ldd); break;
#else
            case 13:
                rows8_few_body(1, 3, nb, first, yc, by, tc, d_first, ldd);
                rows8_few_body(1, 3, nb, second, yc, by, tc, d_second, ldd);
                break;
#endif
            default:
                rows8_few_body(1, 4, nb, first, yc, by, tc, d_first, ldd);
                rows8_few_body(1, 4, nb, second, yc, by, tc, d_second, ldd);
                break;
        }
    }
}

/* ---- Q4_K / Q5_K panels: the same, per super-block ----
 *
 * A super-block's eight sub-blocks of 32 values are interleaved as Q4_0's blocks
 * are (values 4g .. 4g + 3 of sub-block s for eight rows in one vector). Per
 * sub-block and activation row the byte products are summed in int16 lanes and
 * one madd with the rows' scales of that sub-block turns them into int32 sums;
 * the mins' term is one madd per two sub-blocks. Both integer sums equal
 * vec_dot_q4_K's / vec_dot_q5_K's (exact, in any order), and their float step
 * then runs for the eight rows in vec_dot's order: acc += d dy isum - dmin dy summs.
 * The unpacked layout (struct k_panel) is in gemm_panels.h, which the 512-bit panels share. */

/* Super-blocks [b0, b0 + nbc) of nr0 <= 8 rows, bx apart, into p. */
static void k4_interleave(int five_bits, int nr0, const char *x, size_t bx, int64_t b0, int nbc,
                          struct k_panel *p) {
    const size_t block = five_bits ? sizeof(ggml_py_block_q5_K) : sizeof(ggml_py_block_q4_K);
    int16_t *sc = (int16_t *) p->sc, *mn = (int16_t *) p->mn;
    for (int r = 0; r < GGML_PY_PANEL_ROWS; r++) {
        for (int b = 0; b < nbc; b++) {
            __m256i *w = p->w + 64 * b + r;   /* sub-block s at w[8 s] */
            if (r >= nr0) {
                for (int s = 0; s < 8; s++) {
                    w[8 * s] = _mm256_setzero_si256();
                    sc[16 * (8 * b + s) + 2 * r] = sc[16 * (8 * b + s) + 2 * r + 1] = 0;
                    mn[16 * (4 * b + s / 2) + 2 * r + s % 2] = 0;
                }
                p->dx[8 * b + r] = p->dm[8 * b + r] = 0.0f;
                continue;
            }
            const ggml_py_block_q4_K *b4 = (const ggml_py_block_q4_K *) (x + r * bx + (b0 + b) * block);
            const ggml_py_block_q5_K *b5 = (const ggml_py_block_q5_K *) b4;
            for (int c = 0; c < 4; c++) {
                ggml_py_k4_chunk_values(five_bits ? b5->qs : b4->qs, five_bits ? b5->qh : NULL, c,
                                        &w[8 * 2 * c], &w[8 * (2 * c + 1)]);
            }
            _Alignas(32) int16_t sm[16];   /* scales, then mins */
            _mm256_store_si256((__m256i *) sm, ggml_py_k4_scales_mins(b4->scales));
            for (int s = 0; s < 8; s++) {
                sc[16 * (8 * b + s) + 2 * r] = sc[16 * (8 * b + s) + 2 * r + 1] = sm[s];
                mn[16 * (4 * b + s / 2) + 2 * r + s % 2] = sm[8 + s];
            }
            p->dx[8 * b + r] = FP16_TO_FP32(b4->d);
            p->dm[8 * b + r] = FP16_TO_FP32(b4->dmin);
        }
    }
    transpose8x8_i32(p->w, 8 * nbc);
}

/* acc[c] += the interleaved super-blocks [0, nbc) against activation rows c < nc
 * (y: their super-block b0, by apart). Q4_K's products (values < 16) are summed
 * in int16 over a whole sub-block (16 per lane: under 2^15), Q5_K's (< 32) over
 * half of one. */
INLINE void k4_panel_chunk(int five_bits, int nc, int nbc, const struct k_panel *p, const char *y,
                           size_t by, __m256 *acc) {
    const int g_run = five_bits ? 4 : 8;   /* groups summed in int16 */
    __m256 a[PANEL_COLS];
    for (int c = 0; c < nc; c++) a[c] = acc[c];
    for (int b = 0; b < nbc; b++) {
        __m256i isum[PANEL_COLS];
        for (int c = 0; c < nc; c++) isum[c] = _mm256_setzero_si256();
        for (int s = 0; s < 8; s++) {
            const __m256i sc = _mm256_load_si256(p->sc + 8 * b + s);
            for (int g0 = 0; g0 < 8; g0 += g_run) {
                __m256i s16[PANEL_COLS];
                for (int c = 0; c < nc; c++) s16[c] = _mm256_setzero_si256();
                for (int g = g0; g < g0 + g_run; g++) {
                    const __m256i w = _mm256_load_si256(p->w + 64 * b + 8 * s + g);
                    for (int c = 0; c < nc; c++) {
                        const int8_t *qs = ((const ggml_py_block_q8_K *) (y + c * by) + b)->qs + 32 * s + 4 * g;
                        int32_t y4;
                        memcpy(&y4, qs, 4);
                        s16[c] = _mm256_add_epi16(s16[c], _mm256_maddubs_epi16(w, _mm256_set1_epi32(y4)));
                        GGML_PY_KEEP_IN_REGISTER(s16[c]);
                    }
                }
                for (int c = 0; c < nc; c++) isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(s16[c], sc));
            }
        }
        const __m256 dxv = _mm256_load_ps(p->dx + 8 * b), dmv = _mm256_load_ps(p->dm + 8 * b);
        for (int c = 0; c < nc; c++) {
            const ggml_py_block_q8_K *yb = (const ggml_py_block_q8_K *) (y + c * by) + b;
            /* int16 pairs bsums[2j] + bsums[2j + 1], as ggml_py_k4_mins_dot takes them */
            const __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *) yb->bsums),
                                                 _mm_loadu_si128((const __m128i *) (yb->bsums + 8)));
            const __m256i pp = _mm256_broadcastsi128_si256(pairs);
            __m256i msum = _mm256_madd_epi16(_mm256_load_si256(p->mn + 4 * b), _mm256_shuffle_epi32(pp, 0x00));
            msum = _mm256_add_epi32(msum, _mm256_madd_epi16(_mm256_load_si256(p->mn + 4 * b + 1), _mm256_shuffle_epi32(pp, 0x55)));
            msum = _mm256_add_epi32(msum, _mm256_madd_epi16(_mm256_load_si256(p->mn + 4 * b + 2), _mm256_shuffle_epi32(pp, 0xAA)));
            msum = _mm256_add_epi32(msum, _mm256_madd_epi16(_mm256_load_si256(p->mn + 4 * b + 3), _mm256_shuffle_epi32(pp, 0xFF)));
            /* ggml_py_k4_finish's steps, eight rows at once */
            const __m256 dy = _mm256_set1_ps(yb->d);
            const __m256 d = _mm256_mul_ps(dxv, dy), dmin = _mm256_mul_ps(dmv, dy);
            const __m256 t = _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(isum[c])),
                                           _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(msum)));
            a[c] = _mm256_add_ps(a[c], t);
        }
    }
    for (int c = 0; c < nc; c++) acc[c] = a[c];
}

/* ---- Q4_K and Q5_K rows interleaved by eight (a tensor's rows8) ----
 *
 * As Q4_0's: eight neighbouring rows read from one stream laid out for them
 * (ggml_py_q4_K_interleave_rows8, ggml_py_q5_K_interleave_rows8). The packed scales and
 * mins of the eight rows are unpacked together (ggml_py_k4_scales_mins's steps in each
 * row's lane), a sub-block's scale reaches its row's lanes by one byte shuffle, and the
 * products land in the rows' own lanes; the integer sums and the float step are
 * vec_dot_q4_K's (vec_dot_q5_K's). Q5_K's fifth bits come from the qh word that lies in
 * the same lanes as the values. */
#define K5_ROWS8_QH 128                                    /* Q5_K's qh words */
#define K_ROWS8_QS(five_bits) ((five_bits) ? 384 : 128)   /* the qs words */

/* Bit `bit` of each byte of h, at bit 4 of that byte (the fifth bit of a Q5_K value). */
INLINE __m256i k5_bit_at_4(__m256i h, int bit) {
    const __m256i at4 = bit <= 4 ? _mm256_slli_epi16(h, 4 - bit) : _mm256_srli_epi16(h, bit - 4);
    return _mm256_and_si256(at4, _mm256_set1_epi8(0x10));
}

/* sc[h] lane r: row r's 6-bit scales 4h .. 4h + 3 (a byte each), mn[h] its mins. */
INLINE void k4_rows8_scales(const char *xb, __m256i sc[2], __m256i mn[2]) {
    const __m256i u0 = _mm256_loadu_si256((const __m256i *) (xb + 32));
    const __m256i u1 = _mm256_loadu_si256((const __m256i *) (xb + 64));
    const __m256i u2 = _mm256_loadu_si256((const __m256i *) (xb + 96));
    const __m256i m6 = _mm256_set1_epi8(0x3f), m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03);
    sc[0] = _mm256_and_si256(u0, m6);
    mn[0] = _mm256_and_si256(u1, m6);
    sc[1] = _mm256_or_si256(_mm256_and_si256(u2, m4),
                            _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), m2), 4));
    mn[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), m4),
                            _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), m2), 4));
}

/* Bytes a and b of each 32-bit lane of v, zero-extended into its two int16 halves: a
 * byte shuffle whose control comes from a table (built in registers from a and b it cost
 * more than the products when the loop over sub-blocks was not unrolled). */
#define K4_BYTES_LANES(a, b) a, -128, b, -128, 4 + a, -128, 4 + b, -128, 8 + a, -128, 8 + b, -128, \
    12 + a, -128, 12 + b, -128
#define K4_BYTES_MASK(a, b) { K4_BYTES_LANES(a, b), K4_BYTES_LANES(a, b) }
static const int8_t k4_bytes_masks[6][32] = {
    K4_BYTES_MASK(0, 0), K4_BYTES_MASK(1, 1), K4_BYTES_MASK(2, 2), K4_BYTES_MASK(3, 3),   /* scales */
    K4_BYTES_MASK(0, 1), K4_BYTES_MASK(2, 3),                                           /* min pairs */
};
INLINE __m256i k4_bytes16(__m256i v, int mask) {
    return _mm256_shuffle_epi8(v, _mm256_loadu_si256((const __m256i *) k4_bytes_masks[mask]));
}

/* Row r's scale of sub-block s in int16 lanes 2r, 2r + 1 (the panel's sc). */
INLINE __m256i k4_rows8_scale(const __m256i sc[2], int s) {
    return k4_bytes16(sc[s / 4], s % 4);
}

/* Row r's mins of sub-blocks 2k, 2k + 1 in int16 lanes 2r, 2r + 1 (the panel's mn). */
INLINE __m256i k4_rows8_mins(const __m256i mn[2], int k) {
    return k4_bytes16(mn[k / 2], 4 + k % 2);
}

/* Super-blocks [b0, b0 + nbc) of eight rows8 rows (x: the group's first byte) into
 * k4_interleave's layout, vectors `step` apart (gemm_panels.h). */
INLINE void k4_rows8_interleave(int five_bits, const char *x, int64_t b0, int nbc, struct k_panel_view v, int step) {
    const __m256i low = _mm256_set1_epi8(0xF);
    const size_t block = five_bits ? K5_ROWS8_BLOCK : K4_ROWS8_BLOCK;
    for (int b = 0; b < nbc; b++) {
        const char *xb = x + (b0 + b) * block;
        __m256i sc[2], mn[2];
        k4_rows8_scales(xb, sc, mn);
        for (int s = 0; s < 8; s++) v.sc[step * (8 * b + s)] = k4_rows8_scale(sc, s);
        for (int k = 0; k < 4; k++) v.mn[step * (4 * b + k)] = k4_rows8_mins(mn, k);
        _mm256_store_ps(v.dx + 8 * step * b, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) xb)));
        _mm256_store_ps(v.dm + 8 * step * b, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (xb + 16))));
        for (int j = 0; j < 32; j++) {   /* sub-blocks 2 (j / 8) and 2 (j / 8) + 1, group j % 8 */
            const __m256i q = _mm256_loadu_si256((const __m256i *) (xb + K_ROWS8_QS(five_bits) + 32 * j));
            __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
            if (five_bits) {
                const __m256i h = _mm256_loadu_si256((const __m256i *) (xb + K5_ROWS8_QH + 32 * (j % 8)));
                lo = _mm256_or_si256(lo, k5_bit_at_4(h, 2 * (j / 8)));
                hi = _mm256_or_si256(hi, k5_bit_at_4(h, 2 * (j / 8) + 1));
            }
            v.w[step * (64 * b + 8 * (2 * (j / 8)) + j % 8)] = lo;
            v.w[step * (64 * b + 8 * (2 * (j / 8) + 1) + j % 8)] = hi;
        }
    }
}

void ggml_py_k4_rows8_unpack_half(int five_bits, const char *x, int64_t b0, int nbc, struct k_panel_view v) {
    k4_rows8_interleave(five_bits, x, b0, nbc, v, 2);
}

/* A panel of nr0 rows bx apart (rows8: eight Q4_K or Q5_K rows interleaved at x) against
 * nr1 activation rows. */
INLINE void gemm_k4_panel(int five_bits, int rows8, int64_t n, int nr0, int nr1, const char *x, size_t bx,
                          const char *y, size_t by, float *d, int64_t ldd) {
    const int64_t nb = n / GGML_PY_QK_K;
    _Alignas(32) struct k_panel p;
    __m256 acc[GGML_PY_PANEL_COLS];   /* lane r: row r against activation row c */
    for (int c = 0; c < nr1; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += K_PANEL_CHUNK) {
        const int nbc = (int) GGML_PY_MIN(K_PANEL_CHUNK, nb - b0);
        if (rows8) k4_rows8_interleave(five_bits, x, b0, nbc, (struct k_panel_view) { p.w, p.sc, p.mn, p.dx, p.dm }, 1);
        else k4_interleave(five_bits, nr0, x, bx, b0, nbc, &p);
        const char *yc = y + b0 * sizeof(ggml_py_block_q8_K);
        for (int c = 0; c < nr1; c += PANEL_COLS) {
#define PASS(nc) k4_panel_chunk(five_bits, nc, nbc, &p, yc + c * by, by, acc + c)
            GGML_PY_PANEL_PASSES(nr1 - c, PASS)
#undef PASS
        }
    }
    store_rows8(acc, nr0, nr1, d, ldd, 1);
}

static void gemm_q4_K_panel(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                            size_t by, const struct ggml_py_q8_0_terms *yt, float *d, int64_t ldd) {
    (void) yt;   /* the blocks' bsums */
    gemm_k4_panel(0, 0, n, nr0, nr1, x, bx, y, by, d, ldd);
}

/* Below GGML_PY_PANEL_MIN_M activation rows: up to two (nc) at a time, the values
 * unpacked in registers once per super-block for them; ng (1 or 2) groups side by side,
 * x[t] into d[t], as Q4_0's. Products are summed in int16 over a sub-block's eight
 * groups (Q4_K: 16 products an int16 lane, |sum| <= 16 * 15 * 128 = 30720 < 2^15) or four
 * (Q5_K's values < 32: 8 * 31 * 128 = 31744), as the panel. */
INLINE void k4_rows8_few_body(int five_bits, int ng, int nc, int64_t nb, const char *const x[2], const char *y,
                              size_t by, float *const d[2], int64_t ldd) {
    const __m256i low = _mm256_set1_epi8(0xF);
    const size_t block = five_bits ? K5_ROWS8_BLOCK : K4_ROWS8_BLOCK;
    const int g_run = five_bits ? 4 : 8;
    __m256 acc[2][2];   /* lane r: row r of group t against activation row c */
    for (int t = 0; t < ng; t++)
        for (int c = 0; c < nc; c++) acc[t][c] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) {
        for (int t = 0; t < ng; t++) {
            const char *xb = x[t] + ib * block;
            __m256i sc[2], mn[2], isum[2];
            k4_rows8_scales(xb, sc, mn);
            for (int c = 0; c < nc; c++) isum[c] = _mm256_setzero_si256();
            for (int q = 0; q < 4; q++) {   /* sub-blocks 2q (low nibbles) and 2q + 1 (high) */
                rows8_prefetch(xb, block, q, 4);
                const __m256i s_lo = k4_rows8_scale(sc, 2 * q), s_hi = k4_rows8_scale(sc, 2 * q + 1);
                for (int j0 = 0; j0 < 8; j0 += g_run) {
                    __m256i lo16[2], hi16[2];
                    for (int c = 0; c < nc; c++) lo16[c] = hi16[c] = _mm256_setzero_si256();
                    for (int j = j0; j < j0 + g_run; j++) {
                        const __m256i v = _mm256_loadu_si256((const __m256i *) (xb + K_ROWS8_QS(five_bits) + 32 * (8 * q + j)));
                        __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                        if (five_bits) {
                            const __m256i h = _mm256_loadu_si256((const __m256i *) (xb + K5_ROWS8_QH + 32 * j));
                            lo = _mm256_or_si256(lo, k5_bit_at_4(h, 2 * q));
                            hi = _mm256_or_si256(hi, k5_bit_at_4(h, 2 * q + 1));
                        }
                        for (int c = 0; c < nc; c++) {
                            const int8_t *q8 = ((const ggml_py_block_q8_K *) (y + c * by) + ib)->qs + 64 * q + 4 * j;
                            int32_t ylo, yhi;
                            memcpy(&ylo, q8, 4);
                            memcpy(&yhi, q8 + 32, 4);
                            lo16[c] = _mm256_add_epi16(lo16[c], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(ylo)));
                            hi16[c] = _mm256_add_epi16(hi16[c], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(yhi)));
                            GGML_PY_KEEP_IN_REGISTER(lo16[c]);
                            GGML_PY_KEEP_IN_REGISTER(hi16[c]);
                        }
                    }
                    for (int c = 0; c < nc; c++) {
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_add_epi32(_mm256_madd_epi16(lo16[c], s_lo),
                                                                             _mm256_madd_epi16(hi16[c], s_hi)));
                    }
                }
            }
            const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) xb));
            const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (xb + 16)));
            for (int c = 0; c < nc; c++) {
                const ggml_py_block_q8_K *yb = (const ggml_py_block_q8_K *) (y + c * by) + ib;
                /* int16 pairs bsums[2j] + bsums[2j + 1]: sub-block j's sum, as k4_panel_chunk */
                const __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *) yb->bsums),
                                                     _mm_loadu_si128((const __m128i *) (yb->bsums + 8)));
                const __m256i pp = _mm256_broadcastsi128_si256(pairs);
                __m256i msum = _mm256_madd_epi16(k4_rows8_mins(mn, 0), _mm256_shuffle_epi32(pp, 0x00));
                msum = _mm256_add_epi32(msum, _mm256_madd_epi16(k4_rows8_mins(mn, 1), _mm256_shuffle_epi32(pp, 0x55)));
                msum = _mm256_add_epi32(msum, _mm256_madd_epi16(k4_rows8_mins(mn, 2), _mm256_shuffle_epi32(pp, 0xAA)));
                msum = _mm256_add_epi32(msum, _mm256_madd_epi16(k4_rows8_mins(mn, 3), _mm256_shuffle_epi32(pp, 0xFF)));
                /* ggml_py_k4_finish's steps, eight rows at once */
                const __m256 dy = _mm256_set1_ps(yb->d);
                const __m256 dd = _mm256_mul_ps(dx, dy), dmin = _mm256_mul_ps(dm, dy);
                const __m256 tt = _mm256_sub_ps(_mm256_mul_ps(dd, _mm256_cvtepi32_ps(isum[c])),
                                                _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(msum)));
                acc[t][c] = _mm256_add_ps(acc[t][c], tt);
            }
        }
    }
    for (int t = 0; t < ng; t++) store_rows8(acc[t], GGML_PY_PANEL_ROWS, nc, d[t], ldd, 1);
}

static void gemm_q5_K_panel(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                            size_t by, const struct ggml_py_q8_0_terms *yt, float *d, int64_t ldd) {
    (void) yt;
    gemm_k4_panel(1, 0, n, nr0, nr1, x, bx, y, by, d, ldd);
}

/* ---- Q6_K panels ----
 *
 * As Q4_K's, with sixteen sub-blocks of 16 values and int8 scales: values < 64
 * leave room in int16 for two groups' products only, so each half sub-block takes
 * its own madd with the scales; the values' offset of 32 is taken off per
 * super-block through the activations' bsums, as vec_dot_q6_K does. The unpacked
 * layout (struct q6_panel) is in gemm_panels.h. */

static void q6_K_interleave(int nr0, const char *x, size_t bx, int64_t b0, int nbc, struct q6_panel *p) {
    int16_t *sc = (int16_t *) p->sc, *sp = (int16_t *) p->sp;
    for (int r = 0; r < GGML_PY_PANEL_ROWS; r++) {
        for (int b = 0; b < nbc; b++) {
            __m256i *w = p->w + 64 * b + r;   /* values 32v .. 32v + 31 at w[8 v] */
            const ggml_py_block_q6_K *xb = (const ggml_py_block_q6_K *) (x + r * bx) + b0 + b;
            if (r < nr0) {
                for (int c = 0; c < 2; c++) {
                    __m256i q[4];
                    ggml_py_q6_K_half(xb->ql + 64 * c, xb->qh + 32 * c, q);
                    for (int g = 0; g < 4; g++) w[8 * (4 * c + g)] = q[g];
                }
            } else {
                for (int v = 0; v < 8; v++) w[8 * v] = _mm256_setzero_si256();
            }
            for (int s = 0; s < 16; s++) {
                const int16_t scale = r < nr0 ? xb->scales[s] : 0;
                sc[16 * (16 * b + s) + 2 * r] = sc[16 * (16 * b + s) + 2 * r + 1] = scale;
                sp[16 * (8 * b + s / 2) + 2 * r + s % 2] = scale;
            }
            p->dx[8 * b + r] = r < nr0 ? FP16_TO_FP32(xb->d) : 0.0f;
        }
    }
    transpose8x8_i32(p->w, 8 * nbc);
}

/* isum + two groups' products (values < 64 in w0, w1 against the activation's four bytes
 * at q8 and at q8 + 4), summed in int16, times their sub-block's scale sc */
INLINE __m256i q6_two_groups(__m256i isum, __m256i w0, __m256i w1, const int8_t *q8, __m256i sc) {
    int32_t y0, y1;
    memcpy(&y0, q8, 4);
    memcpy(&y1, q8 + 4, 4);
    const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(w0, _mm256_set1_epi32(y0)),
                                         _mm256_maddubs_epi16(w1, _mm256_set1_epi32(y1)));
    return _mm256_add_epi32(isum, _mm256_madd_epi16(s16, sc));
}

/* vec_dot_q6_K's float step, eight rows at once: acc + dx * d * (isum - 32 * off), off the
 * sum of each scale pair times its bsums pair (the values' -32, taken out once) */
INLINE __m256 q6_float_step(__m256 acc, __m256i isum, __m256i off, __m256 dx, float d) {
    const __m256i is = _mm256_sub_epi32(isum, _mm256_slli_epi32(off, 5));
    return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(dx, _mm256_set1_ps(d)), _mm256_cvtepi32_ps(is)));
}

INLINE void q6_K_panel_chunk(int nc, int nbc, const struct q6_panel *p, const char *y, size_t by, __m256 *acc) {
    __m256 a[PANEL_COLS];
    for (int c = 0; c < nc; c++) a[c] = acc[c];
    for (int b = 0; b < nbc; b++) {
        __m256i isum[PANEL_COLS];
        for (int c = 0; c < nc; c++) isum[c] = _mm256_setzero_si256();
        for (int h = 0; h < 32; h++) {   /* half sub-blocks of 8 values: two groups */
            const __m256i sc = _mm256_load_si256(p->sc + 16 * b + h / 2);
            const __m256i w0 = _mm256_load_si256(p->w + 64 * b + 2 * h);
            const __m256i w1 = _mm256_load_si256(p->w + 64 * b + 2 * h + 1);
            for (int c = 0; c < nc; c++)
                isum[c] = q6_two_groups(isum[c], w0, w1, ((const ggml_py_block_q8_K *) (y + c * by) + b)->qs + 8 * h, sc);
        }
        const __m256 dxv = _mm256_load_ps(p->dx + 8 * b);
        for (int c = 0; c < nc; c++) {
            const ggml_py_block_q8_K *yb = (const ggml_py_block_q8_K *) (y + c * by) + b;
            /* 32 * sum of scale j * bsums[j]: the offset, as ggml_py_k_offset */
            __m256i off = _mm256_setzero_si256();
            for (int k = 0; k < 8; k++) {
                int32_t pair;
                memcpy(&pair, yb->bsums + 2 * k, 4);
                off = _mm256_add_epi32(off, _mm256_madd_epi16(_mm256_load_si256(p->sp + 8 * b + k), _mm256_set1_epi32(pair)));
            }
            a[c] = q6_float_step(a[c], isum[c], off, dxv, yb->d);
        }
    }
    for (int c = 0; c < nc; c++) acc[c] = a[c];
}

/* ---- Q6_K rows interleaved by eight (a tensor's rows8) ----
 *
 * The eight rows' super-blocks side by side in the order the kernels read them
 * (ggml_py_q6_K_interleave_rows8): the two ql words and the qh word that hold four
 * values of each kind lie in the same lanes, so the values ggml_py_q6_K_half makes of
 * them come out in each row's lane, and a sub-block's int8 scale reaches its row's
 * lanes by one byte shuffle (into the high byte of an int16, then an arithmetic shift:
 * sign-extended). The integer sums and the float step are the panel's (vec_dot_q6_K's). */
#define Q6_ROWS8_D 128                                     /* the eight d */
#define Q6_ROWS8_VALUES 144                                /* the value words, 96 bytes a group */

/* Bytes a and b of each 32-bit lane of v, into the high bytes of its two int16 halves (the low
 * bytes zeroed), for an arithmetic shift right by 8 to sign-extend them. */
#define Q6_BYTES_LANES(a, b) -128, a, -128, b, -128, 4 + a, -128, 4 + b, -128, 8 + a, -128, 8 + b, \
    -128, 12 + a, -128, 12 + b
#define Q6_BYTES_MASK(a, b) { Q6_BYTES_LANES(a, b), Q6_BYTES_LANES(a, b) }
static const int8_t q6_bytes_masks[6][32] = {
    Q6_BYTES_MASK(0, 0), Q6_BYTES_MASK(1, 1), Q6_BYTES_MASK(2, 2), Q6_BYTES_MASK(3, 3),   /* one scale */
    Q6_BYTES_MASK(0, 1), Q6_BYTES_MASK(2, 3),                                           /* pairs */
};
INLINE __m256i q6_bytes16(__m256i v, int mask) {
    return _mm256_srai_epi16(_mm256_shuffle_epi8(v, _mm256_loadu_si256((const __m256i *) q6_bytes_masks[mask])), 8);
}

/* Row r's scale of sub-block s in int16 lanes 2r, 2r + 1 (the panel's sc), from the
 * super-block xb's scale words. */
INLINE __m256i q6_rows8_scale(const char *xb, int s) {
    return q6_bytes16(_mm256_loadu_si256((const __m256i *) (xb + 32 * (s / 4))), s % 4);
}

/* Row r's scales 2k and 2k + 1 in int16 lanes 2r, 2r + 1 (the panel's sp). */
INLINE __m256i q6_rows8_pair(const char *xb, int k) {
    return q6_bytes16(_mm256_loadu_si256((const __m256i *) (xb + 32 * (k / 2))), 4 + k % 2);
}

/* Values 128h + 32m + 4j .. + 3 (m = 0 .. 3: unsigned, 0 .. 63) in each row's lane, from
 * group 8h + j's words (w: its 96 bytes). */
INLINE __m256i q6_rows8_values(const char *w, int m) {
    const __m256i low = _mm256_set1_epi8(0xF), high = _mm256_set1_epi8(0x30);
    const __m256i l = _mm256_loadu_si256((const __m256i *) (w + 32 * (m % 2)));
    const __m256i q = _mm256_loadu_si256((const __m256i *) (w + 64));
    const __m256i lo = m < 2 ? _mm256_and_si256(l, low) : _mm256_and_si256(_mm256_srli_epi16(l, 4), low);
    const __m256i hi = m == 0 ? _mm256_slli_epi16(q, 4) : m == 1 ? _mm256_slli_epi16(q, 2)
                     : m == 2 ? q : _mm256_srli_epi16(q, 2);
    return _mm256_or_si256(lo, _mm256_and_si256(hi, high));
}

/* Super-blocks [b0, b0 + nbc) of eight rows8 rows (x: the group's first byte) into
 * q6_K_interleave's layout, vectors `step` apart (gemm_panels.h). */
INLINE void q6_rows8_interleave(const char *x, int64_t b0, int nbc, struct q6_panel_view v, int step) {
    for (int b = 0; b < nbc; b++) {
        const char *xb = x + (b0 + b) * Q6_ROWS8_BLOCK;
        for (int s = 0; s < 16; s++) v.sc[step * (16 * b + s)] = q6_rows8_scale(xb, s);
        for (int k = 0; k < 8; k++) v.sp[step * (8 * b + k)] = q6_rows8_pair(xb, k);
        _mm256_store_ps(v.dx + 8 * step * b, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (xb + Q6_ROWS8_D))));
        for (int h = 0; h < 2; h++) {
            for (int j = 0; j < 8; j++) {
                const char *w = xb + Q6_ROWS8_VALUES + 96 * (8 * h + j);
                for (int m = 0; m < 4; m++) v.w[step * (64 * b + 8 * (4 * h + m) + j)] = q6_rows8_values(w, m);
            }
        }
    }
}

void ggml_py_q6_rows8_unpack_half(const char *x, int64_t b0, int nbc, struct q6_panel_view v) {
    q6_rows8_interleave(x, b0, nbc, v, 2);
}

/* A panel of nr0 rows bx apart (rows8: eight rows interleaved at x) against nr1
 * activation rows. */
INLINE void gemm_q6_panel(int rows8, int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                          size_t by, float *d, int64_t ldd) {
    const int64_t nb = n / GGML_PY_QK_K;
    _Alignas(32) struct q6_panel p;
    __m256 acc[GGML_PY_PANEL_COLS];
    for (int c = 0; c < nr1; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += K_PANEL_CHUNK) {
        const int nbc = (int) GGML_PY_MIN(K_PANEL_CHUNK, nb - b0);
        if (rows8) q6_rows8_interleave(x, b0, nbc, (struct q6_panel_view) { p.w, p.sc, p.sp, p.dx }, 1);
        else q6_K_interleave(nr0, x, bx, b0, nbc, &p);
        const char *yc = y + b0 * sizeof(ggml_py_block_q8_K);
        for (int c = 0; c < nr1; c += PANEL_COLS) {
#define PASS(nc) q6_K_panel_chunk(nc, nbc, &p, yc + c * by, by, acc + c)
            GGML_PY_PANEL_PASSES(nr1 - c, PASS)
#undef PASS
        }
    }
    store_rows8(acc, nr0, nr1, d, ldd, 1);
}

static void gemm_q6_K_panel(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                            size_t by, const struct ggml_py_q8_0_terms *yt, float *d, int64_t ldd) {
    (void) yt;   /* the blocks' bsums */
    gemm_q6_panel(0, n, nr0, nr1, x, bx, y, by, d, ldd);
}

/* Below GGML_PY_PANEL_MIN_M activation rows: up to two (nc) at a time, the values
 * unpacked in registers once per super-block for them; ng (1 or 2) groups side by side,
 * x[t] into d[t], as Q4_K's. Products (values < 64) are summed in int16 over two groups
 * (|sum| <= 4 * 63 * 128 = 32256 < 2^15), then times their sub-block's scale, as the panel. */
INLINE void q6_rows8_few_body(int ng, int nc, int64_t nb, const char *const x[2], const char *y, size_t by,
                              float *const d[2], int64_t ldd) {
    __m256 acc[2][2];   /* lane r: row r of group t against activation row c */
    for (int t = 0; t < ng; t++)
        for (int c = 0; c < nc; c++) acc[t][c] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) {
        for (int t = 0; t < ng; t++) {
            const char *xb = x[t] + ib * Q6_ROWS8_BLOCK;
            __m256i isum[2];
            for (int c = 0; c < nc; c++) isum[c] = _mm256_setzero_si256();
            for (int h = 0; h < 2; h++) {
                for (int half = 0; half < 2; half++) {
                    /* the scales of sub-blocks 8h + 2m + half, each shared by two pairs of groups */
                    __m256i scale[4];
                    for (int m = 0; m < 4; m++) scale[m] = q6_rows8_scale(xb, 8 * h + 2 * m + half);
                    for (int j0 = 4 * half; j0 < 4 * half + 4; j0 += 2) {   /* groups j0, j0 + 1: half a sub-block of each kind */
                        const char *w = xb + Q6_ROWS8_VALUES + 96 * (8 * h + j0);
                        rows8_prefetch(xb, Q6_ROWS8_BLOCK, 4 * h + j0 / 2, 8);
                        for (int m = 0; m < 4; m++) {      /* sub-block 8h + 2m + half */
                            const __m256i v0 = q6_rows8_values(w, m), v1 = q6_rows8_values(w + 96, m);
                            for (int c = 0; c < nc; c++) {
                                const int8_t *q8 = ((const ggml_py_block_q8_K *) (y + c * by) + ib)->qs + 128 * h + 32 * m + 4 * j0;
                                isum[c] = q6_two_groups(isum[c], v0, v1, q8, scale[m]);
                            }
                        }
                    }
                }
            }
            const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (xb + Q6_ROWS8_D)));
            for (int c = 0; c < nc; c++) {
                const ggml_py_block_q8_K *yb = (const ggml_py_block_q8_K *) (y + c * by) + ib;
                /* 32 * sum of scale j * bsums[j]: the offset, as q6_K_panel_chunk */
                __m256i off = _mm256_setzero_si256();
                for (int k = 0; k < 8; k++) {
                    int32_t pair;
                    memcpy(&pair, yb->bsums + 2 * k, 4);
                    off = _mm256_add_epi32(off, _mm256_madd_epi16(q6_rows8_pair(xb, k), _mm256_set1_epi32(pair)));
                }
                acc[t][c] = q6_float_step(acc[t][c], isum[c], off, dx, yb->d);
            }
        }
    }
    for (int t = 0; t < ng; t++) store_rows8(acc[t], GGML_PY_PANEL_ROWS, nc, d[t], ldd, 1);
}

/* ---- the K-quants' rows8 kernels ---- */

#define K_ROWS8_Q6 2   /* kind: 0 Q4_K, 1 Q5_K (k4's five_bits), K_ROWS8_Q6 */

INLINE void k_rows8_panel(int kind, int64_t n, int nr1, const char *x, const char *y, size_t by, float *d,
                          int64_t ldd) {
    if (kind == K_ROWS8_Q6) gemm_q6_panel(1, n, GGML_PY_PANEL_ROWS, nr1, x, 0, y, by, d, ldd);
    else gemm_k4_panel(kind, 1, n, GGML_PY_PANEL_ROWS, nr1, x, 0, y, by, d, ldd);
}

INLINE void k_rows8_few_body(int kind, int ng, int nc, int64_t nb, const char *const x[2], const char *y,
                             size_t by, float *const d[2], int64_t ldd) {
    if (kind == K_ROWS8_Q6) q6_rows8_few_body(ng, nc, nb, x, y, by, d, ldd);
    else k4_rows8_few_body(kind, ng, nc, nb, x, y, by, d, ldd);
}

/* The rows8 contract (mul_mat.h) for the K-quants: x, x2 eight interleaved rows each (x2
 * may be NULL); the panels from M = 8, below it up to two activation rows a pass. */
INLINE void gemm_k_rows8(int kind, int64_t n, int nr1, const char *x, const char *x2, const char *y,
                         size_t by, float *d, float *d2, int64_t ldd) {
    const int64_t nb = n / GGML_PY_QK_K;
    if (nr1 >= GGML_PY_PANEL_MIN_M) {
#if defined(GGML_PY_HAVE_PANEL16)
        if (x2) {   /* both groups in one 512-bit register */
            if (kind == K_ROWS8_Q6) ggml_py_gemm_q6_K_rows16_avx512(n, nr1, x, x2, y, by, d, d2, ldd);
            else ggml_py_gemm_k4_rows16_avx512(kind, n, nr1, x, x2, y, by, d, d2, ldd);
            return;
        }
#endif
        k_rows8_panel(kind, n, nr1, x, y, by, d, ldd);
        if (x2) k_rows8_panel(kind, n, nr1, x2, y, by, d2, ldd);
        return;
    }
    const int ng = x2 ? 2 : 1;
    const char *const groups[2] = { x, x2 };
    for (int c = 0; c < nr1; c += 2) {   /* one specialization per count */
        float *const dc[2] = { d + c * ldd, d2 ? d2 + c * ldd : NULL };
        if (nr1 - c >= 2) {
            if (ng == 2) k_rows8_few_body(kind, 2, 2, nb, groups, y + c * by, by, dc, ldd);
            else k_rows8_few_body(kind, 1, 2, nb, groups, y + c * by, by, dc, ldd);
        } else {
            if (ng == 2) k_rows8_few_body(kind, 2, 1, nb, groups, y + c * by, by, dc, ldd);
            else k_rows8_few_body(kind, 1, 1, nb, groups, y + c * by, by, dc, ldd);
        }
    }
}

/* yt: unused, the Q8_K blocks carry their bsums and scale */
static void gemm_q4_K_rows8(int64_t n, int nr1, const char *x, const char *x2, const char *y, size_t by,
                            const struct ggml_py_q8_0_terms *yt, float *d, float *d2, int64_t ldd) {
    (void) yt;
    gemm_k_rows8(0, n, nr1, x, x2, y, by, d, d2, ldd);
}

static void gemm_q5_K_rows8(int64_t n, int nr1, const char *x, const char *x2, const char *y, size_t by,
                            const struct ggml_py_q8_0_terms *yt, float *d, float *d2, int64_t ldd) {
    (void) yt;
    gemm_k_rows8(1, n, nr1, x, x2, y, by, d, d2, ldd);
}

static void gemm_q6_K_rows8(int64_t n, int nr1, const char *x, const char *x2, const char *y, size_t by,
                            const struct ggml_py_q8_0_terms *yt, float *d, float *d2, int64_t ldd) {
    (void) yt;
    gemm_k_rows8(K_ROWS8_Q6, n, nr1, x, x2, y, by, d, d2, ldd);
}

ggml_py_gemm_panel_fn ggml_py_gemm_panel_avx2(int type, int64_t m) {
    if (m < GGML_PY_PANEL_MIN_M) return NULL;
    switch (type) {
        case GGML_PY_TYPE_Q4_0: return gemm_q4_0_panel;
        case GGML_PY_TYPE_Q8_0: return gemm_q8_0_panel;
        case GGML_PY_TYPE_Q4_K: return gemm_q4_K_panel;
        case GGML_PY_TYPE_Q5_K: return gemm_q5_K_panel;
        case GGML_PY_TYPE_Q6_K: return gemm_q6_K_panel;
        default:                return NULL;
    }
}

void ggml_py_q8_0_block_terms(const void *row, int64_t n, struct ggml_py_q8_0_terms *terms) {
    const ggml_py_block_q8_0 *yb = row;
    const __m256i ones = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < n / GGML_PY_QK8_0; b++) {
        const int32_t sum = ggml_py_hsum_i32_8(ggml_py_dot_u8s8(ones, _mm256_loadu_si256((const __m256i *) yb[b].qs)));
        terms[b].minus8_sum = -8 * sum;
        terms[b].d = FP16_TO_FP32(yb[b].d);
    }
}

ggml_py_gemm_rows8_fn ggml_py_gemm_rows8_avx2(int type) {
    switch (type) {
        case GGML_PY_TYPE_Q4_0: return gemm_q4_0_rows8;
        case GGML_PY_TYPE_Q4_K: return gemm_q4_K_rows8;
        case GGML_PY_TYPE_Q5_K: return gemm_q5_K_rows8;
        case GGML_PY_TYPE_Q6_K: return gemm_q6_K_rows8;
        default:                return NULL;
    }
}

ggml_py_gemm_tile_fn ggml_py_gemm_wide_avx2(int type, int64_t m) {
    if (m >= GGML_PY_PANEL_MIN_M) return NULL;
    switch (type) {
        case GGML_PY_TYPE_Q4_0: return gemm_q4_0_wide;
        case GGML_PY_TYPE_Q8_0: return gemm_q8_0_wide;
        default:                return NULL;
    }
}

ggml_py_gemm_tile_fn ggml_py_gemm_tile_avx2(int type, int64_t m) {
    (void) m;
    switch (type) {
        case GGML_PY_TYPE_Q4_0: return gemm_q4_0;
        case GGML_PY_TYPE_Q8_0: return gemm_q8_0;
        case GGML_PY_TYPE_F16:  return gemm_f16;
        case GGML_PY_TYPE_Q4_K: return gemm_q4_K;
        case GGML_PY_TYPE_Q5_K: return gemm_q5_K;
        case GGML_PY_TYPE_Q6_K: return gemm_q6_K;
        case GGML_PY_TYPE_Q2_K: return gemm_q2_K;
        case GGML_PY_TYPE_Q3_K: return gemm_q3_K;
        default:                return NULL;
    }
}

#else

ggml_py_gemm_rows8_fn ggml_py_gemm_rows8_avx2(int type) {
    (void) type;
    return NULL;
}

ggml_py_gemm_tile_fn ggml_py_gemm_wide_avx2(int type, int64_t m) {
    (void) type;
    (void) m;
    return NULL;
}

ggml_py_gemm_tile_fn ggml_py_gemm_tile_avx2(int type, int64_t m) {
    (void) type;
    (void) m;
    return NULL;
}

ggml_py_gemm_panel_fn ggml_py_gemm_panel_avx2(int type, int64_t m) {
    (void) type;
    (void) m;
    return NULL;
}

void ggml_py_q8_0_block_terms(const void *row, int64_t n, struct ggml_py_q8_0_terms *terms) {
    const ggml_py_block_q8_0 *yb = row;
    for (int64_t b = 0; b < n / GGML_PY_QK8_0; b++) {
        int32_t sum = 0;
        for (int j = 0; j < GGML_PY_QK8_0; j++) sum += yb[b].qs[j];
        terms[b].minus8_sum = -8 * sum;
        terms[b].d = ggml_py_fp16_to_fp32(yb[b].d);
    }
}

#endif /* GGML_PY_HAVE_AVX2 */
