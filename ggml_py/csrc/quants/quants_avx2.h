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
    /* the 16 bytes in both halves (a broadcast load), the upper half shifted by 4:
     * one shuffle fewer than shifting a copy and inserting it. Bits a shift moves
     * across bytes fall outside the mask. */
    const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) qs));
    const __m256i b = _mm256_srlv_epi32(t, _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0));
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
 * agree exactly because no caller's unsigned bytes exceed 128 without VNNI: a pair's
 * sum then lies in [-32768, 32512] and maddubs never saturates. */
static inline __m256i ggml_py_dot_u8s8_acc(__m256i acc, __m256i ux, __m256i sy) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, ux, sy);
#elif defined(GGML_PY_HAVE_VNNI)   /* AVX-VNNI */
    return _mm256_dpbusd_avx_epi32(acc, ux, sy);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(ux, sy), _mm256_set1_epi16(1)));
#endif
}

/* acc + (int32 lane k = x[2k] * y[2k] + x[2k+1] * y[2k+1]), int16 lanes (exact: no caller
 * multiplies -32768 by -32768) */
static inline __m256i ggml_py_dot_s16_acc(__m256i acc, __m256i x, __m256i y) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(acc, x, y);
#elif defined(GGML_PY_HAVE_VNNI)   /* AVX-VNNI */
    return _mm256_dpwssd_avx_epi32(acc, x, y);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(x, y));
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

/* Lane i of the result: the sum of s[i]'s lanes (four weight rows' sums at once,
 * by unpacks and adds rather than hadds; docs/benchmarks.md). */
static inline __m128i ggml_py_hsum4_i32_4(const __m128i s[4]) {
    const __m128i t0 = _mm_add_epi32(_mm_unpacklo_epi32(s[0], s[1]), _mm_unpackhi_epi32(s[0], s[1]));
    const __m128i t1 = _mm_add_epi32(_mm_unpacklo_epi32(s[2], s[3]), _mm_unpackhi_epi32(s[2], s[3]));
    return _mm_add_epi32(_mm_unpacklo_epi64(t0, t1), _mm_unpackhi_epi64(t0, t1));
}

static inline __m128i ggml_py_hsum4_i32_8(const __m256i s[4]) {
    const __m256i t0 = _mm256_add_epi32(_mm256_unpacklo_epi32(s[0], s[1]), _mm256_unpackhi_epi32(s[0], s[1]));
    const __m256i t1 = _mm256_add_epi32(_mm256_unpacklo_epi32(s[2], s[3]), _mm256_unpackhi_epi32(s[2], s[3]));
    const __m256i u = _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
    return _mm_add_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
}

/* Every int16 of each 128-bit lane of v set to that lane's int16 number lo (low
 * lane) or hi (high lane): one shuffle spreads a scale over its values. */
static inline __m256i ggml_py_spread_i16(__m256i v, int lo, int hi) {
    const char l0 = (char) (2 * lo), l1 = (char) (2 * lo + 1), h0 = (char) (2 * hi), h1 = (char) (2 * hi + 1);
    return _mm256_shuffle_epi8(v, _mm256_setr_epi8(l0, l1, l0, l1, l0, l1, l0, l1, l0, l1, l0, l1, l0, l1, l0, l1,
                                                   h0, h1, h0, h1, h0, h1, h0, h1, h0, h1, h0, h1, h0, h1, h0, h1));
}

/* Eight int8 scales (the low 8 bytes of sc: half c's 8c .. 8c + 7 of Q3_K's or
 * Q6_K's 16) as int16, in both 128-bit lanes. */
static inline __m256i ggml_py_scales8_i16(__m128i sc) {
    return _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sc));
}

/* Q3_K's 16 signed 6-bit scales (value - 32) from its 12 packed bytes, on 32-bit
 * words (ggml_py_q3_K_scales at once; no round trip through memory). */
static inline __m128i ggml_py_q3_K_scales_v(const uint8_t *packed) {
    uint32_t a[3];
    memcpy(a, packed, sizeof(a));
    const uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
    const uint32_t s0 = (a[0] & m4) | ((a[2] & m2) << 4);
    const uint32_t s1 = (a[1] & m4) | (((a[2] >> 2) & m2) << 4);
    const uint32_t s2 = ((a[0] >> 4) & m4) | (((a[2] >> 4) & m2) << 4);
    const uint32_t s3 = ((a[1] >> 4) & m4) | (((a[2] >> 6) & m2) << 4);
    return _mm_sub_epi8(_mm_set_epi32((int) s3, (int) s2, (int) s1, (int) s0), _mm_set1_epi8(32));
}

/* Sum of q * y over 32 Q6_K values 0..63 (yq: their 32 Q8_K activations), halves
 * of 16 scaled by the int16s of sc (ggml_py_spread_i16); int32 lanes. The - 32 of
 * each value is taken off once per block (ggml_py_k_offset). */
static inline __m256i ggml_py_q6_K_dot32(__m256i q, const int8_t *yq, __m256i sc) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *) yq)), sc);
}

/* (sum of scale j * (sum of activations 16j .. 16j + 15)) << shift, in int32
 * lanes: what an offset of 2^shift on every value (Q6_K's 32, Q3_K's 4) takes off
 * a block's integer sum (scales: the block's 16 int8 scales). */
static inline __m256i ggml_py_k_offset(__m128i scales, const int16_t *bsums, int shift) {
    const __m256i s = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scales), _mm256_loadu_si256((const __m256i *) bsums));
    return _mm256_slli_epi32(s, shift);
}

/* Q2_K's scales 8c .. 8c + 7 of half c (low nibbles of its 16 bytes) as int16,
 * in both 128-bit lanes. */
static inline __m256i ggml_py_q2_K_half_scales(const uint8_t *packed) {
    const __m128i b = _mm_and_si128(_mm_loadl_epi64((const __m128i *) packed), _mm_set1_epi8(0xF));
    return _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(b));
}

/* int32 lanes summing to sum of min j * bsums[j] (Q2_K's mins: the high nibbles
 * of its 16 scale bytes). */
static inline __m256i ggml_py_q2_K_mins_dot(const uint8_t *packed, const int16_t *bsums) {
    const __m128i m = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *) packed), 4), _mm_set1_epi8(0xF));
    return _mm256_madd_epi16(_mm256_cvtepu8_epi16(m), _mm256_loadu_si256((const __m256i *) bsums));
}

/* Values 128c + 32k .. + 31 of a Q2_K / Q3_K super-block, without Q3_K's offset
 * of 4: two bits at 2k of qs (its 32 bytes of half c) and, for Q3_K, the bit
 * 4c + k of each hmask byte as bit 2 (hmask: NULL for Q2_K); 0..7. */
static inline __m256i ggml_py_k23_values(__m256i qs, const __m256i *hmask, int c, int k) {
    const __m256i v = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * k), _mm256_set1_epi8(3));
    if (!hmask) return v;
    const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(*hmask, 4 * c + k), _mm256_set1_epi8(1));
    return _mm256_or_si256(v, _mm256_slli_epi16(hb, 2));
}

/* A Q4_K / Q5_K block's 8 six-bit scales (int16s of the low 128-bit lane) and 8
 * mins (high lane), from its 12 packed bytes: ggml_py_get_scale_min_k4 for all
 * j at once, on 32-bit words. */
static inline __m256i ggml_py_k4_scales_mins(const uint8_t *packed) {
    uint32_t u[3];
    memcpy(u, packed, sizeof(u));
    const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
    const uint32_t sc0 = u[0] & m6, mn0 = u[1] & m6;
    const uint32_t sc1 = (u[2] & m4) | (((u[0] >> 6) & m2) << 4);
    const uint32_t mn1 = ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4);
    return _mm256_cvtepu8_epi16(_mm_set_epi32((int) mn1, (int) mn0, (int) sc1, (int) sc0));
}

/* int32 lanes summing to sum of min j * (bsums[2j] + bsums[2j + 1]) (sm: as
 * ggml_py_k4_scales_mins returns). */
static inline __m128i ggml_py_k4_mins_dot(__m256i sm, const int16_t *bsums) {
    const __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *) bsums),
                                         _mm_loadu_si128((const __m128i *) (bsums + 8)));
    return _mm_madd_epi16(_mm256_extracti128_si256(sm, 1), pairs);
}

/* Q4_K / Q5_K tail: the float step of k4_block_sum in dot_ref.c (isum, summs:
 * lanes of the integer sums). */
static inline float ggml_py_k4_finish(const ggml_py_block_q8_K *y, __m256i isum, __m128i summs,
                                      ggml_py_half d16, ggml_py_half dmin16) {
    const __m128i m = _mm_add_epi32(summs, _mm_unpackhi_epi64(summs, summs));
    const int msum = _mm_cvtsi128_si32(_mm_add_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1))));
    const int sum = ggml_py_hsum_i32_8(isum);
    const float d = FP16_TO_FP32(d16) * y->d;
    const float dmin = FP16_TO_FP32(dmin16) * y->d;
    return d * (float) sum - dmin * (float) msum;
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
 * scale (scales: the block's eight as int16s in both 128-bit lanes); int32 lanes. */
static inline __m256i ggml_py_k4_chunk_dot(__m256i lo, __m256i hi, const int8_t *yq, __m256i scales, int c) {
    const __m256i y0 = _mm256_loadu_si256((const __m256i *) yq);
    const __m256i y1 = _mm256_loadu_si256((const __m256i *) (yq + 32));
    const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), ggml_py_spread_i16(scales, 2 * c, 2 * c));
    const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), ggml_py_spread_i16(scales, 2 * c + 1, 2 * c + 1));
    return _mm256_add_epi32(p0, p1);
}

#endif /* GGML_PY_QUANTS_AVX2_H */
