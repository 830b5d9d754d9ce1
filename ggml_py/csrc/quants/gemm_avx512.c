/* gemm_avx512.c - the Q4_0 rows8 panel on 512-bit vectors: an item's two groups of
 * eight interleaved rows (mul_mat.c's compute_rows8: x and x2) in one register.
 *
 * From GGML_PY_PANEL_MIN_M activation rows a panel's work is byte products: four
 * activation bytes broadcast to a vector meet every row in its lanes. In a 256-bit
 * register they meet eight rows, here sixteen, which halves the broadcasts, loads and
 * float steps per product (docs/batching.md has the figures). Lanes 0 .. 7 are x's
 * rows, 8 .. 15 x2's, and each lane runs the eight-row panel's steps in its order
 * (gemm_avx2.c, legacy_panel): equal to vec_dot bit for bit. */
#include "quants_impl.h"
#include "simd.h"
#include "mul_mat.h"

#if defined(GGML_PY_HAVE_PANEL16)
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

#define BLOCK8 (8 * sizeof(ggml_py_block_q4_0))   /* a block of eight interleaved rows */
#define CHUNK 32   /* blocks unpacked at a time: 16 KiB of values, in L1 */
#define COLS 4     /* activation rows run together: two chains each, eight in flight */

/* Blocks [b0, b0 + nbc) of the two groups: w[8 b + g] = x's, then x2's, values
 * 4g .. 4g + 3 of their rows (0 .. 15), dx[b] their scales. The layout is
 * ggml_py_q4_0_interleave_rows8's: a block's eight scales, then 128 bytes whose low
 * nibbles are values 0 .. 15 and high nibbles 16 .. 31, four of each row to a word. */
INLINE void unpack(const char *x, const char *x2, int64_t b0, int nbc, __m512i *w, __m512 *dx) {
    const __m512i low = _mm512_set1_epi8(0xF);
    for (int b = 0; b < nbc; b++) {
        const char *xb = x + (b0 + b) * BLOCK8, *x2b = x2 + (b0 + b) * BLOCK8;
        dx[b] = _mm512_cvtph_ps(_mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *) xb)), _mm_loadu_si128((const __m128i *) x2b), 1));
        for (int j = 0; j < 4; j++) {
            const __m512i v = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) (xb + 16 + 32 * j))),
                _mm256_loadu_si256((const __m256i *) (x2b + 16 + 32 * j)), 1);
            w[8 * b + j] = _mm512_and_si512(v, low);
            w[8 * b + 4 + j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
    }
}

/* The same bytes of the next chunk asked for while this one is computed: the unpacking
 * reads a chunk in one burst, which the hardware prefetchers alone did not keep fed. */
INLINE void prefetch_block(const char *xb) {
    for (size_t l = 0; l < BLOCK8; l += 64) _mm_prefetch(xb + l, _MM_HINT_T0);
}

/* acc[c] += the unpacked blocks [0, nbc) against activation rows c < nc (y: their
 * block b0, by apart; ysum: their block sums, nb apart); next, next2: the groups'
 * bytes to ask for, a block per block (NULL: none). */
INLINE void chunk(int nc, int nbc, const __m512i *w, const __m512 *dx, const char *y, size_t by,
                  const int32_t *ysum, int64_t nb, __m512 *acc, const char *next, const char *next2) {
    __m512 a[COLS];
    for (int c = 0; c < nc; c++) a[c] = acc[c];
    for (int b = 0; b < nbc; b++) {
        if (next) {
            prefetch_block(next + b * BLOCK8);
            prefetch_block(next2 + b * BLOCK8);
        }
        __m512i even[COLS], odd[COLS];
        for (int c = 0; c < nc; c++) {
            even[c] = _mm512_set1_epi32(-8 * ysum[c * nb + b]);   /* (q - 8) . y */
            odd[c] = _mm512_setzero_si512();
        }
        for (int g = 0; g < 8; g += 2) {
            const __m512i w0 = _mm512_load_si512(w + 8 * b + g), w1 = _mm512_load_si512(w + 8 * b + g + 1);
            for (int c = 0; c < nc; c++) {
                const int8_t *qs = ((const ggml_py_block_q8_0 *) (y + c * by) + b)->qs;
                int32_t y0, y1;
                memcpy(&y0, qs + 4 * g, 4);
                memcpy(&y1, qs + 4 * g + 4, 4);
                even[c] = _mm512_dpbusd_epi32(even[c], w0, _mm512_set1_epi32(y0));
                odd[c] = _mm512_dpbusd_epi32(odd[c], w1, _mm512_set1_epi32(y1));
            }
        }
        for (int c = 0; c < nc; c++) {   /* vec_dot's float step: acc += (dx * dy) * sum */
            const float dy = FP16_TO_FP32(((const ggml_py_block_q8_0 *) (y + c * by) + b)->d);
            const __m512 sums = _mm512_cvtepi32_ps(_mm512_add_epi32(even[c], odd[c]));
            a[c] = _mm512_fmadd_ps(_mm512_mul_ps(dx[b], _mm512_set1_ps(dy)), sums, a[c]);
        }
    }
    for (int c = 0; c < nc; c++) acc[c] = a[c];
}

void ggml_py_gemm_q4_0_rows16_avx512(int64_t n, int nr1, const char *x, const char *x2, const char *y,
                                     size_t by, const int32_t *ysum, float *d, float *d2, int64_t ldd) {
    const int64_t nb = n / GGML_PY_QK4_0;
    _Alignas(64) __m512i w[8 * CHUNK];
    _Alignas(64) __m512 dx[CHUNK];
    __m512 acc[GGML_PY_PANEL_COLS];   /* lane r: row r of x (r < 8) or r - 8 of x2, against row c */
    for (int c = 0; c < nr1; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += CHUNK) {
        const int nbc = (int) GGML_PY_MIN(CHUNK, nb - b0);
        unpack(x, x2, b0, nbc, w, dx);
        /* past the last chunk: the next group's first, which a thread taking items in turn reads next */
        const char *next = x + (b0 + CHUNK) * BLOCK8, *next2 = x2 + (b0 + CHUNK) * BLOCK8;
        for (int c = 0; c < nr1; c += COLS, next = next2 = NULL) {
            const char *yc = y + c * by + b0 * sizeof(ggml_py_block_q8_0);
            if (c + COLS <= nr1) chunk(COLS, nbc, w, dx, yc, by, ysum + c * nb + b0, nb, acc + c, next, next2);
            else chunk(nr1 - c, nbc, w, dx, yc, by, ysum + c * nb + b0, nb, acc + c, next, next2);
        }
    }
    for (int c = 0; c < nr1; c++) {
        _mm256_storeu_ps(d + c * ldd, _mm512_castps512_ps256(acc[c]));
        _mm256_storeu_ps(d2 + c * ldd, _mm512_extractf32x8_ps(acc[c], 1));
    }
}

#endif
