/* simd.h - the few intrinsics helpers the SIMD kernels share. */
#ifndef GGML_PY_SIMD_H
#define GGML_PY_SIMD_H

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define GGML_PY_HAVE_AVX2 1

static inline float ggml_py_hsum_ps_avx(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v);
    __m128 hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}
#endif

#if defined(__AVX512F__)
#define GGML_PY_HAVE_AVX512 1
#endif

/* a byte dot-product instruction (vpdpbusd) on 256-bit vectors */
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define GGML_PY_HAVE_VNNI 1
#endif

#endif /* GGML_PY_SIMD_H */
