/* quants_avx2.h - AVX2 building blocks of the quant kernels (dot products and
 * the mul_mat micro-kernels share them). Include only under GGML_PY_HAVE_AVX2. */
#ifndef GGML_PY_QUANTS_AVX2_H
#define GGML_PY_QUANTS_AVX2_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "quants_impl.h"
#include "simd.h"

/* 32 nibbles -> 32 bytes in 0..15: low nibbles are bytes 0..15, high 16..31. */
static inline __m256i ggml_py_nibbles32(const uint8_t *qs) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    /* the 16 bytes in both halves, the upper half shifted by 4: one shuffle fewer */
    const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) qs));
    const __m256i b = _mm256_srlv_epi16(t, _mm256_set_epi64x(0x0004000400040004, 0x0004000400040004, 0, 0));
#else
    const __m128i t = _mm_loadu_si128((const __m128i *) qs);
    const __m256i b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
#endif
    return _mm256_and_si256(b, _mm256_set1_epi8(0xF));
}

/* 32 bits -> 32 bytes, 0xFF where the bit is set (bit j -> byte j). */
static inline __m256i ggml_py_bits32(const uint8_t *x) {
    uint32_t x32;
    memcpy(&x32, x, sizeof(x32));
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int) x32), shuf);
    bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

/* acc + (int32 lane k = sum of ux[e] * sy[e] for e in 4k..4k+3), ux unsigned.
 * One VNNI instruction where the build targets it, maddubs + madd otherwise. The two
 * agree exactly because no caller's unsigned bytes exceed 128: a pair's sum then
 * lies in [-32768, 32512] and maddubs never saturates. */
static inline __m256i ggml_py_dot_u8s8_acc(__m256i acc, __m256i ux, __m256i sy) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, ux, sy);
#elif defined(GGML_PY_HAVE_VNNI)   /* AVX-VNNI */
    return _mm256_dpbusd_avx_epi32(acc, ux, sy);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(ux, sy), _mm256_set1_epi16(1)));
#endif
}

/* int32 lane k = sum of ux[e] * sy[e] for e in 4k..4k+3 (ux unsigned). */
static inline __m256i ggml_py_dot_u8s8(__m256i ux, __m256i sy) {
    return ggml_py_dot_u8s8_acc(_mm256_setzero_si256(), ux, sy);
}

/* The same for two signed vectors (sign moved onto y). */
static inline __m256i ggml_py_dot_s8s8(__m256i x, __m256i y) {
    return ggml_py_dot_u8s8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

static inline int ggml_py_hsum_i32_8(__m256i a) {
    const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    const __m128i s2 = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    const __m128i s1 = _mm_add_epi32(s2, _mm_shuffle_epi32(s2, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s1);
}

/* Sum of q * y over 32 values whose two halves of 16 have scales sc0, sc1
 * (p16: the 16 pair sums of maddubs). */
static inline __m256i ggml_py_scaled_dot32(__m256i p16, int sc0, int sc1) {
    const __m256i scales = _mm256_set_m128i(_mm_set1_epi16((short) sc1), _mm_set1_epi16((short) sc0));
    return _mm256_madd_epi16(p16, scales);
}

/* Half of a Q6_K super-block (ql: its 64 bytes of low nibbles, qh: its 32 bytes
 * of high bit pairs): 128 six-bit values, 0..63, as four groups of 32 bytes. */
static inline void ggml_py_q6_K_half(const uint8_t *ql, const uint8_t *qh, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3);
    const __m256i l0 = _mm256_loadu_si256((const __m256i *) ql);
    const __m256i l1 = _mm256_loadu_si256((const __m256i *) (ql + 32));
    const __m256i h = _mm256_loadu_si256((const __m256i *) qh);
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4));
}

/* Sum of (q - 32) * y over 32 Q6_K values whose halves of 16 have scales sc0, sc1
 * (yq: their 32 Q8_K activations); int32 lanes. */
static inline __m256i ggml_py_q6_K_dot32(__m256i q, const int8_t *yq, int sc0, int sc1) {
    const __m256i qy = _mm256_loadu_si256((const __m256i *) yq);
    const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, qy), _mm256_maddubs_epi16(_mm256_set1_epi8(32), qy));
    return ggml_py_scaled_dot32(p, sc0, sc1);
}

/* Q4_K / Q5_K tail: mins and the float step (same as k4_block_sum in dot_ref.c) */
static inline float ggml_py_k4_finish(const ggml_py_block_q8_K *y, __m256i acc, const uint8_t *mins,
                                      ggml_py_half d16, ggml_py_half dmin16) {
    int summs = 0;
    for (int j = 0; j < 8; j++) summs += mins[j] * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
    const int isum = ggml_py_hsum_i32_8(acc);
    const float d = FP16_TO_FP32(d16) * y->d;
    const float dmin = FP16_TO_FP32(dmin16) * y->d;
    return d * (float) isum - dmin * (float) summs;
}

/* Chunk c (0..3) of a Q4_K / Q5_K super-block's values: *lo the first 32, *hi the
 * next 32 (qs: the block's 128 bytes of nibbles; qh: Q5_K's 32 bytes of fifth
 * bits, NULL for Q4_K). */
static inline void ggml_py_k4_chunk_values(const uint8_t *qs, const uint8_t *qh, int c, __m256i *lo,
                                           __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m256i q4 = _mm256_loadu_si256((const __m256i *) (qs + 32 * c));
    *lo = _mm256_and_si256(q4, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
    if (qh) {
        const __m256i h = _mm256_loadu_si256((const __m256i *) qh), one = _mm256_set1_epi8(1);
        *lo = _mm256_or_si256(*lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * c), one), 4));
        *hi = _mm256_or_si256(*hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * c + 1), one), 4));
    }
}

/* Chunk c of a Q4_K/Q5_K super-block: 64 unsigned values (lo: the first 32,
 * hi: the next 32) times their Q8_K activations, each half scaled by its 6-bit
 * scale; int32 lanes. */
static inline __m256i ggml_py_k4_chunk_dot(__m256i lo, __m256i hi, const int8_t *yq, const uint8_t sc[2]) {
    const __m256i y0 = _mm256_loadu_si256((const __m256i *) yq);
    const __m256i y1 = _mm256_loadu_si256((const __m256i *) (yq + 32));
    const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), _mm256_set1_epi16(sc[0]));
    const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), _mm256_set1_epi16(sc[1]));
    return _mm256_add_epi32(p0, p1);
}

#endif /* GGML_PY_QUANTS_AVX2_H */
