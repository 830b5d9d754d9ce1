/* simd.h - the few intrinsics helpers the SIMD kernels share. */
#ifndef GGML_PY_SIMD_H
#define GGML_PY_SIMD_H

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include <math.h>
#define GGML_PY_HAVE_AVX2 1

static inline float ggml_py_hsum_ps_avx(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v);
    __m128 hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* An opaque step on a vector: the compiler must hold v in a register here, as it is.
 * Without it, gcc re-associates a chain of integer adds into a tree that spills, or
 * folds one load into every instruction that uses the value. */
#define GGML_PY_KEEP_IN_REGISTER(v) __asm__("" : "+x"(v))

/* The step both exps below share, for x clamped to [-87.3, ln(FLT_MAX)]: *k = x / ln2
 * rounded to nearest (ties to even), r = x - k ln2 (|r| <= ln2 / 2), exp(r) by its Taylor
 * polynomial to r^7 (relative error < 2e-7 there). */
static inline __m256 ggml_py_exp_reduced_ps(__m256 x, __m256 *k) {
    *k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(*k, _mm256_set1_ps(0.693359375f), x);       /* ln2, high part */
    r = _mm256_fnmadd_ps(*k, _mm256_set1_ps(-2.12194440e-4f), r);           /* ln2, low part */
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    return _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
}

/* 2^k for integral k in [-126, 127], built in the exponent bits */
static inline __m256 ggml_py_exp2_int_ps(__m256 k) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23));
}

/* exp(x) for 8 floats: exp(r) times 2^k (ggml_py_exp_reduced_ps). Below -87.3 (2^k would
 * leave the normal range) the result is 0, -inf included; above ln(FLT_MAX) it is +inf,
 * as expf overflows; NaN stays NaN. */
static inline __m256 ggml_py_exp_ps(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3f), hi = _mm256_set1_ps(88.72283935546875f);
    const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    const __m256 overflow = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
    x = _mm256_min_ps(hi, _mm256_max_ps(lo, x));   /* NaN: both return their second operand, x */
    __m256 k;
    __m256 p = ggml_py_exp_reduced_ps(x, &k);
    /* k = 128 (x near ln(FLT_MAX)) has no exponent bits: 2^127, and p doubled */
    const __m256 top = _mm256_cmp_ps(k, _mm256_set1_ps(127.5f), _CMP_GT_OQ);
    k = _mm256_sub_ps(k, _mm256_and_ps(top, _mm256_set1_ps(1.0f)));
    p = _mm256_add_ps(p, _mm256_and_ps(top, p));
    const __m256 e = _mm256_andnot_ps(underflow, _mm256_mul_ps(p, ggml_py_exp2_int_ps(k)));
    return _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), overflow);
}

/* ggml_py_exp_ps for x <= 0 or NaN (a softmax's x - max), the same bits: such x never
 * overflow, nor reach k = 128 */
static inline __m256 ggml_py_exp_nonpositive_ps(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3f);
    const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    __m256 k;
    const __m256 p = ggml_py_exp_reduced_ps(_mm256_max_ps(lo, x), &k);   /* NaN: max returns x */
    return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, ggml_py_exp2_int_ps(k)));
}
#endif

#if defined(__AVX512F__)
#define GGML_PY_HAVE_AVX512 1
#endif

/* the rows8 panels on 512-bit vectors (gemm_avx512.c), beside the AVX2 kernels whose
 * unpacking they share: byte dot products (VNNI), byte and word operations (BW) and
 * 256-bit halves (DQ) on them */
#if defined(GGML_PY_HAVE_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX512DQ__)
#define GGML_PY_HAVE_PANEL16 1
#endif

/* a byte dot-product instruction (vpdpbusd) on 256-bit vectors */
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define GGML_PY_HAVE_VNNI 1
#endif

#endif /* GGML_PY_SIMD_H */
