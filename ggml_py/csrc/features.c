/* features.c - what this binary was compiled for (reported by system_info). */
#include "ggml_py.h"

uint32_t ggml_py_build_features(void) {
    uint32_t f = 0;
#if defined(__SSE3__)
    f |= GGML_PY_FEATURE_SSE3;
#endif
#if defined(__AVX__)
    f |= GGML_PY_FEATURE_AVX;
#endif
#if defined(__AVX2__)
    f |= GGML_PY_FEATURE_AVX2;
#endif
#if defined(__FMA__)
    f |= GGML_PY_FEATURE_FMA;
#endif
#if defined(__F16C__)
    f |= GGML_PY_FEATURE_F16C;
#endif
#if defined(__AVX512F__)
    f |= GGML_PY_FEATURE_AVX512;
#endif
#if defined(__AVX512VNNI__)
    f |= GGML_PY_FEATURE_AVX512_VNNI;
#endif
#if defined(__AVX512BF16__)
    f |= GGML_PY_FEATURE_AVX512_BF16;
#endif
#if defined(__AVXVNNI__)
    f |= GGML_PY_FEATURE_AVX_VNNI;
#endif
#if defined(__AMX_INT8__)
    f |= GGML_PY_FEATURE_AMX_INT8;
#endif
#if defined(GGML_PY_USE_BLAS)
    f |= GGML_PY_FEATURE_BLAS;
#endif
#if defined(__SANITIZE_THREAD__)
    f |= GGML_PY_FEATURE_TSAN;
#endif
    return f;
}
