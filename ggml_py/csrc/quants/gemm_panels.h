/* gemm_panels.h - what the 256-bit panels (gemm_avx2.c) and the 512-bit ones
 * (gemm_avx512.c) share: the K-quants' unpacked super-blocks of eight rows, and the
 * 512-bit kernels. Include only under GGML_PY_HAVE_AVX2. */
#ifndef GGML_PY_GEMM_PANELS_H
#define GGML_PY_GEMM_PANELS_H

#include <immintrin.h>
#include <stdint.h>

#include "quants_impl.h"

#define K_PANEL_CHUNK 8   /* super-blocks interleaved at a time: 16 KiB of values */

/* A panel chunk takes its activation rows in passes of up to GGML_PY_PANEL_PASS. PASS(nc)
 * runs one, nc = min(GGML_PY_PANEL_PASS, n) a compile-time constant: the chunk kernels keep
 * a pass's sums in registers only for a constant count (given a count known at run time,
 * gcc kept them in memory, and a last pass of one to three rows, e.g. of 9 - 11 rows,
 * slowed the whole product; docs/quants.md). */
#define GGML_PY_PANEL_PASS 4
#define GGML_PY_PANEL_PASSES(n, PASS)           \
    switch (GGML_PY_MIN(GGML_PY_PANEL_PASS, n)) { \
        case 1: PASS(1); break;                 \
        case 2: PASS(2); break;                 \
        case 3: PASS(3); break;                 \
        default: PASS(GGML_PY_PANEL_PASS); break; \
    }
#define K4_ROWS8_BLOCK (8 * sizeof(ggml_py_block_q4_K))   /* a super-block of eight rows */
#define K5_ROWS8_BLOCK (8 * sizeof(ggml_py_block_q5_K))
#define Q6_ROWS8_BLOCK (8 * sizeof(ggml_py_block_q6_K))

/* Interleaved super-blocks: w[64 b + 8 s + g] lane r = row r's values 4g .. 4g + 3
 * of sub-block s of super-block b; sc[8 b + s] int16 lanes 2r, 2r + 1 = row r's
 * scale of sub-block s; mn[4 b + k] lanes 2r, 2r + 1 = its mins of sub-blocks 2k
 * and 2k + 1; dx, dm[8 b + r] its d and dmin. Rows past nr0: zeros. */
struct k_panel {
    __m256i w[64 * K_PANEL_CHUNK], sc[8 * K_PANEL_CHUNK], mn[4 * K_PANEL_CHUNK];
    float dx[8 * K_PANEL_CHUNK], dm[8 * K_PANEL_CHUNK];
};

/* w[64 b + 8 v + g] lane r = row r's values 32v + 4g .. 32v + 4g + 3 of super-block
 * b; sc[16 b + s] int16 lanes 2r, 2r + 1 = its scale of sub-block s; sp[8 b + k]
 * lanes 2r, 2r + 1 = its scales 2k and 2k + 1; dx[8 b + r] its d. */
struct q6_panel {
    __m256i w[64 * K_PANEL_CHUNK], sc[16 * K_PANEL_CHUNK], sp[8 * K_PANEL_CHUNK];
    float dx[8 * K_PANEL_CHUNK];
};

/* Where an unpacking writes eight rows: a panel's arrays as above (step 1), or one group's
 * halves of a 512-bit panel's (step 2: vector i of the layout above at [2 i], the floats
 * of super-block b from [16 b]; the other group's from [2 i + 1] and [16 b + 8]), so that
 * the two groups' unpackings meet in one register without being copied. */
struct k_panel_view {
    __m256i *w, *sc, *mn;
    float *dx, *dm;
};
struct q6_panel_view {
    __m256i *w, *sc, *sp;
    float *dx;
};

/* Super-blocks [b0, b0 + nbc) (nbc <= K_PANEL_CHUNK) of eight rows interleaved by
 * ggml_py_q4_K_interleave_rows8 (five_bits: Q5_K's) or ggml_py_q6_K_interleave_rows8 at
 * x, unpacked as the 256-bit panels unpack them into one group's halves of a 512-bit
 * panel (v: step 2). */
void ggml_py_k4_rows8_unpack_half(int five_bits, const char *x, int64_t b0, int nbc, struct k_panel_view v);
void ggml_py_q6_rows8_unpack_half(const char *x, int64_t b0, int nbc, struct q6_panel_view v);

/* The rows8 kernels from GGML_PY_PANEL_MIN_M activation rows for an item's two groups at
 * once (x2 not NULL) on 512-bit vectors, built where GGML_PY_HAVE_PANEL16 (simd.h): Q4_0,
 * Q4_K or (five_bits) Q5_K, Q6_K. The rows8 contract (mul_mat.h) otherwise. */
void ggml_py_gemm_q4_0_rows16_avx512(int64_t n, int nr1, const char *x, const char *x2, const char *y,
                                     size_t by, const struct ggml_py_q8_0_terms *yt, float *d, float *d2, int64_t ldd);
void ggml_py_gemm_k4_rows16_avx512(int five_bits, int64_t n, int nr1, const char *x, const char *x2,
                                   const char *y, size_t by, float *d, float *d2, int64_t ldd);
void ggml_py_gemm_q6_K_rows16_avx512(int64_t n, int nr1, const char *x, const char *x2, const char *y,
                                     size_t by, float *d, float *d2, int64_t ldd);

#endif /* GGML_PY_GEMM_PANELS_H */
