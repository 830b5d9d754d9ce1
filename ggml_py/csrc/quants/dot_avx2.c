/* dot_avx2.c - AVX2 dot products of the quantized types and the AVX2
 * quantizers of the activation formats (Q8_0, Q8_1, Q8_K).
 *
 * Each kernel computes the same exact integer sums as its scalar twin in
 * dot_ref.c and combines them with the same float operations in the same
 * order, so results agree bit for bit; the quantizers emit the same bytes as
 * the reference quantizers (roundf and nearest-even rounding reproduced). */
#include "quants_impl.h"
#include "simd.h"

#if defined(GGML_PY_HAVE_AVX2)

#include "quants_avx2.h"

/* ---- legacy types: Q4_0 and Q8_0 block by block, the others in 8 float lanes,
 * lane k = elements 4k..4k+3 ---------------------------------------------------- */

void ggml_py_vec_dot_q4_0_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_block_q4_0 *x = vx;
    const ggml_py_block_q8_0 *y = vy;
    float acc = 0.0f;   /* block by block, as the reference */
    const __m256i eight = _mm256_set1_epi8(8);
    for (int64_t ib = 0; ib < n / GGML_PY_QK4_0; ib++) {
        const __m256i qy = _mm256_loadu_si256((const __m256i *) y[ib].qs);
        /* signed nibbles (q - 8): one signed dot product instead of two unsigned */
        const __m256i qx = _mm256_sub_epi8(ggml_py_nibbles32(x[ib].qs), eight);
        const int sum = ggml_py_hsum_i32_8(ggml_py_dot_s8s8(qx, qy));
        acc = fmaf(FP16_TO_FP32(x[ib].d) * FP16_TO_FP32(y[ib].d), (float) sum, acc);
    }
    *s = acc;
}

void ggml_py_vec_dot_q4_1_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_block_q4_1 *x = vx;
    const ggml_py_block_q8_1 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int64_t ib = 0; ib < n / GGML_PY_QK4_1; ib++) {
        const __m256 d = _mm256_set1_ps(FP16_TO_FP32(x[ib].d) * FP16_TO_FP32(y[ib].d));
        const __m256i qy = _mm256_loadu_si256((const __m256i *) y[ib].qs);
        const __m256i i = ggml_py_dot_u8s8(ggml_py_nibbles32(x[ib].qs), qy);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(i), acc);
        mins += FP16_TO_FP32(x[ib].m) * FP16_TO_FP32(y[ib].s);
    }
    *s = ggml_py_hsum_ps_avx(acc) + mins;
}

static inline __m256i q5_values(const uint8_t *qs, const uint8_t *qh) {
    const __m256i hi = _mm256_and_si256(ggml_py_bits32(qh), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(ggml_py_nibbles32(qs), hi);
}

void ggml_py_vec_dot_q5_0_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_block_q5_0 *x = vx;
    const ggml_py_block_q8_0 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    const __m256i sixteen = _mm256_set1_epi8(16);
    for (int64_t ib = 0; ib < n / GGML_PY_QK5_0; ib++) {
        const __m256 d = _mm256_set1_ps(FP16_TO_FP32(x[ib].d) * FP16_TO_FP32(y[ib].d));
        const __m256i qy = _mm256_loadu_si256((const __m256i *) y[ib].qs);
        const __m256i qx = q5_values(x[ib].qs, x[ib].qh);
        const __m256i i = _mm256_sub_epi32(ggml_py_dot_u8s8(qx, qy), ggml_py_dot_u8s8(sixteen, qy));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(i), acc);
    }
    *s = ggml_py_hsum_ps_avx(acc);
}

void ggml_py_vec_dot_q5_1_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_block_q5_1 *x = vx;
    const ggml_py_block_q8_1 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int64_t ib = 0; ib < n / GGML_PY_QK5_1; ib++) {
        const __m256 d = _mm256_set1_ps(FP16_TO_FP32(x[ib].d) * FP16_TO_FP32(y[ib].d));
        const __m256i qy = _mm256_loadu_si256((const __m256i *) y[ib].qs);
        const __m256i i = ggml_py_dot_u8s8(q5_values(x[ib].qs, x[ib].qh), qy);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(i), acc);
        mins += FP16_TO_FP32(x[ib].m) * FP16_TO_FP32(y[ib].s);
    }
    *s = ggml_py_hsum_ps_avx(acc) + mins;
}

void ggml_py_vec_dot_q8_0_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_block_q8_0 *x = vx;
    const ggml_py_block_q8_0 *y = vy;
    float acc = 0.0f;   /* block by block, as the reference */
    for (int64_t ib = 0; ib < n / GGML_PY_QK8_0; ib++) {
        const __m256i qx = _mm256_loadu_si256((const __m256i *) x[ib].qs);
        const __m256i qy = _mm256_loadu_si256((const __m256i *) y[ib].qs);
        const int sum = ggml_py_hsum_i32_8(ggml_py_dot_s8s8(qx, qy));
        acc = fmaf(FP16_TO_FP32(x[ib].d) * FP16_TO_FP32(y[ib].d), (float) sum, acc);
    }
    *s = acc;
}

/* ---- K-quants: integer sums per super-block, then the scalar float step ---- */

void ggml_py_vec_dot_q2_K_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_block_q2_K *x = vx;
    const ggml_py_block_q8_K *y = vy;
    float sumf = 0;
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++) {
        const __m256i mins = ggml_py_q2_K_mins_dot(x[i].scales, y[i].bsums);
        const __m128i m = _mm_add_epi32(_mm256_castsi256_si128(mins), _mm256_extracti128_si256(mins, 1));
        __m256i acc = _mm256_setzero_si256();
        for (int c = 0; c < 2; c++) {
            const __m256i sc = ggml_py_q2_K_half_scales(x[i].scales + 8 * c);
            const __m256i q2 = _mm256_loadu_si256((const __m256i *) (x[i].qs + 32 * c));
            for (int k = 0; k < 4; k++) {
                const __m256i qy = _mm256_loadu_si256((const __m256i *) (y[i].qs + 128 * c + 32 * k));
                const __m256i p = _mm256_maddubs_epi16(ggml_py_k23_values(q2, NULL, c, k), qy);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ggml_py_spread_i16(sc, 2 * k, 2 * k + 1)));
            }
        }
        const __m128i m2 = _mm_add_epi32(m, _mm_unpackhi_epi64(m, m));
        const int summs = _mm_cvtsi128_si32(_mm_add_epi32(m2, _mm_shuffle_epi32(m2, _MM_SHUFFLE(2, 3, 0, 1))));
        const int isum = ggml_py_hsum_i32_8(acc);
        const float dall = y[i].d * FP16_TO_FP32(x[i].d);
        const float dmin = y[i].d * FP16_TO_FP32(x[i].dmin);
        sumf += dall * (float) isum - dmin * (float) summs;
    }
    *s = sumf;
}

void ggml_py_vec_dot_q3_K_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_block_q3_K *x = vx;
    const ggml_py_block_q8_K *y = vy;
    float sumf = 0;
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++) {
        const __m128i sc = ggml_py_q3_K_scales_v(x[i].scales);
        const __m256i hmask = _mm256_loadu_si256((const __m256i *) x[i].hmask);
        /* the values' offset of 4 taken off once per block */
        __m256i acc = _mm256_sub_epi32(_mm256_setzero_si256(), ggml_py_k_offset(sc, y[i].bsums, 2));
        for (int c = 0; c < 2; c++) {
            const __m256i sch = ggml_py_scales8_i16(c ? _mm_unpackhi_epi64(sc, sc) : sc);
            const __m256i q2 = _mm256_loadu_si256((const __m256i *) (x[i].qs + 32 * c));
            for (int k = 0; k < 4; k++) {
                const __m256i qy = _mm256_loadu_si256((const __m256i *) (y[i].qs + 128 * c + 32 * k));
                const __m256i p = _mm256_maddubs_epi16(ggml_py_k23_values(q2, &hmask, c, k), qy);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ggml_py_spread_i16(sch, 2 * k, 2 * k + 1)));
            }
        }
        const int isum = ggml_py_hsum_i32_8(acc);
        const float d = FP16_TO_FP32(x[i].d) * y[i].d;
        sumf += d * (float) isum;
    }
    *s = sumf;
}

/* One Q4_K / Q5_K super-block against its Q8_K block: *isum and *summs get int32
 * lanes of k4_block_sum's two integer sums (dot_ref.c). */
static inline void k4_block(const uint8_t *packed, const uint8_t *qs, const uint8_t *qh,
                            const ggml_py_block_q8_K *y, __m256i *isum, __m128i *summs) {
    const __m256i sm = ggml_py_k4_scales_mins(packed);
    const __m256i scales = _mm256_permute2x128_si256(sm, sm, 0x00);
    *summs = ggml_py_k4_mins_dot(sm, y->bsums);
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        __m256i lo, hi;
        ggml_py_k4_chunk_values(qs, qh, c, &lo, &hi);
        acc = _mm256_add_epi32(acc, ggml_py_k4_chunk_dot(lo, hi, y->qs + 64 * c, scales, c));
    }
    *isum = acc;
}

void ggml_py_vec_dot_q4_K_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_block_q4_K *x = vx;
    const ggml_py_block_q8_K *y = vy;
    float sumf = 0;
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++) {
        __m256i isum;
        __m128i summs;
        k4_block(x[i].scales, x[i].qs, NULL, &y[i], &isum, &summs);
        sumf += ggml_py_k4_finish(&y[i], isum, summs, x[i].d, x[i].dmin);
    }
    *s = sumf;
}

void ggml_py_vec_dot_q5_K_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_block_q5_K *x = vx;
    const ggml_py_block_q8_K *y = vy;
    float sumf = 0;
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++) {
        __m256i isum;
        __m128i summs;
        k4_block(x[i].scales, x[i].qs, x[i].qh, &y[i], &isum, &summs);
        sumf += ggml_py_k4_finish(&y[i], isum, summs, x[i].d, x[i].dmin);
    }
    *s = sumf;
}

void ggml_py_vec_dot_q6_K_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_block_q6_K *x = vx;
    const ggml_py_block_q8_K *y = vy;
    float sumf = 0;
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++) {
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *q8 = y[i].qs;
        __m256i acc = _mm256_sub_epi32(_mm256_setzero_si256(), ggml_py_k_offset(_mm_loadu_si128((const __m128i *) x[i].scales), y[i].bsums, 5));
        for (int c = 0; c < 2; c++, ql += 64, qh += 32, q8 += 128) {
            const __m256i sc = ggml_py_scales8_i16(_mm_loadl_epi64((const __m128i *) (x[i].scales + 8 * c)));
            __m256i q[4];
            ggml_py_q6_K_half(ql, qh, q);
            for (int g = 0; g < 4; g++) {
                acc = _mm256_add_epi32(acc, ggml_py_q6_K_dot32(q[g], q8 + 32 * g, ggml_py_spread_i16(sc, 2 * g, 2 * g + 1)));
            }
        }
        const int isum = ggml_py_hsum_i32_8(acc);
        const float d = FP16_TO_FP32(x[i].d) * y[i].d;
        sumf += d * (float) isum;
    }
    *s = sumf;
}

/* ---- activation quantizers -------------------------------------------------- */

static inline float hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* Four vectors of 8 integral floats -> 32 int8 in order. */
static inline __m256i pack_i8(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256i i01 = _mm256_packs_epi32(_mm256_cvtps_epi32(a), _mm256_cvtps_epi32(b));
    const __m256i i23 = _mm256_packs_epi32(_mm256_cvtps_epi32(c), _mm256_cvtps_epi32(d));
    const __m256i i = _mm256_packs_epi16(i01, i23);
    return _mm256_permutevar8x32_epi32(i, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* One activation block: scale 127 / amax, ties to even (quantize_block_act's twin,
 * llama.cpp's x86 rounding). */
static inline __m256i quantize_block32(const float *x, float *d_out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; j++) {
        v[j] = _mm256_loadu_ps(x + 8 * j);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
    }
    const float max = hmax_ps(amax);
    const __m256 vid = _mm256_set1_ps(max != 0.0f ? 127.0f / max : 0.0f);
    for (int j = 0; j < 4; j++) {
        v[j] = _mm256_round_ps(_mm256_mul_ps(v[j], vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    *d_out = max / 127;
    return pack_i8(v[0], v[1], v[2], v[3]);
}

void ggml_py_quantize_row_q8_0_avx2(const float *x, void *vy, int64_t n) {
    ggml_py_block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / GGML_PY_QK8_0; i++, x += GGML_PY_QK8_0) {
        float d;
        const __m256i q = quantize_block32(x, &d);
        y[i].d = FP32_TO_FP16(d);
        _mm256_storeu_si256((__m256i *) y[i].qs, q);
    }
}

void ggml_py_quantize_row_q8_1_avx2(const float *x, void *vy, int64_t n) {
    ggml_py_block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / GGML_PY_QK8_1; i++, x += GGML_PY_QK8_1) {
        float d;
        const __m256i q = quantize_block32(x, &d);
        y[i].d = FP32_TO_FP16(d);
        _mm256_storeu_si256((__m256i *) y[i].qs, q);
        const int sum = ggml_py_hsum_i32_8(ggml_py_dot_u8s8(_mm256_set1_epi8(1), q));
        y[i].s = FP32_TO_FP16(sum * d);
    }
}

void ggml_py_quantize_row_q8_K_avx2(const float *x, void *vy, int64_t n) {
    ggml_py_block_q8_K *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++, x += GGML_PY_QK_K) {
        __m256 amax_v = _mm256_setzero_ps();
        for (int j = 0; j < GGML_PY_QK_K; j += 8) {
            amax_v = _mm256_max_ps(amax_v, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
        }
        const float amax = hmax_ps(amax_v);
        if (!amax) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        /* the first value of largest magnitude gives the sign, as in the reference */
        float max = 0;
        for (int j = 0; j < GGML_PY_QK_K; j++) {
            if (fabsf(x[j]) == amax) {
                max = x[j];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m256 vis = _mm256_set1_ps(iscale), v127 = _mm256_set1_ps(127.f);
        for (int j = 0; j < GGML_PY_QK_K; j += 32) {
            __m256 v[4];
            for (int k = 0; k < 4; k++) {
                const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * k), vis);
                v[k] = _mm256_min_ps(_mm256_round_ps(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), v127);
            }
            const __m256i q = pack_i8(v[0], v[1], v[2], v[3]);
            _mm256_storeu_si256((__m256i *) (y[i].qs + j), q);
            /* int32 lanes 0-3 sum the first 16 values, lanes 4-7 the next 16 */
            const __m256i s4 = ggml_py_dot_u8s8(_mm256_set1_epi8(1), q);
            const __m256i s2 = _mm256_hadd_epi32(s4, s4);
            const __m256i s1 = _mm256_hadd_epi32(s2, s2);
            y[i].bsums[j / 16] = (int16_t) _mm256_extract_epi32(s1, 0);
            y[i].bsums[j / 16 + 1] = (int16_t) _mm256_extract_epi32(s1, 4);
        }
        y[i].d = 1 / iscale;
    }
}

#endif /* GGML_PY_HAVE_AVX2 */
