/* gemm_avx512.c - the rows8 panels on 512-bit vectors: an item's two groups of eight
 * interleaved rows (mul_mat.c's compute_rows8: x and x2) in one register, for Q4_0, Q4_K,
 * Q5_K and Q6_K.
 *
 * From GGML_PY_PANEL_MIN_M activation rows (Q4_0's from four) a panel's work is byte products: four
 * activation bytes broadcast to a vector meet every row in its lanes. In a 256-bit
 * register they meet eight rows, here sixteen, which halves the broadcasts, loads and
 * float steps per product (docs/quants.md has the figures). Lanes 0 .. 7 are x's rows,
 * 8 .. 15 x2's. Each lane's integer sums are the exact sums of the 256-bit panels
 * (gemm_avx2.c), and its float steps theirs in their order: equal to vec_dot bit for
 * bit. The byte products are VNNI's, into int32 lanes: the K-quants' sub-block sums
 * then take their scale by one multiply, where the 256-bit panels sum products in int16
 * and multiply by the scales in a madd. */
#include "quants_impl.h"
#include "simd.h"
#include "mul_mat.h"

#if defined(GGML_PY_HAVE_PANEL16)
#include "gemm_panels.h"

#define INLINE static inline __attribute__((always_inline))

#define COLS GGML_PY_PANEL_PASS   /* activation rows run together: two chains each, eight in flight */
#define K16_CHUNK 1   /* K-quant super-blocks at a time: one super-block's two groups unpacked
                        * (~5 KiB) and the activation rows' blocks stay in L1 together */

/* The next chunk's bytes (a block of each group) asked for while this one is computed:
 * the unpacking reads a chunk in one burst, which the hardware prefetchers alone did not
 * keep fed. */
INLINE void prefetch_blocks(const char *next, const char *next2, size_t bytes) {
    for (size_t l = 0; l < bytes; l += 64) {
        _mm_prefetch(next + l, _MM_HINT_T0);
        _mm_prefetch(next2 + l, _MM_HINT_T0);
    }
}

/* d[c * ldd + i] = lane i of acc[c], d2[c * ldd + i] lane 8 + i, for nr1 activation rows */
INLINE void store_rows16(const __m512 *acc, int nr1, float *d, float *d2, int64_t ldd) {
    for (int c = 0; c < nr1; c++) {
        _mm256_storeu_ps(d + c * ldd, _mm512_castps512_ps256(acc[c]));
        _mm256_storeu_ps(d2 + c * ldd, _mm512_extractf32x8_ps(acc[c], 1));
    }
}

/* ---- Q4_0 ---- */
#define BLOCK8 (8 * sizeof(ggml_py_block_q4_0))   /* a block of eight interleaved rows */
#define CHUNK 8   /* blocks unpacked at a time: their values (4 KiB) and every activation row's
                    * bytes for them (32 rows: 8.5 KiB) stay in L1 together, where 32 blocks'
                    * (16 KiB and 34 KiB) did not */

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

/* acc[c] += the unpacked blocks [0, nbc) against activation rows c < nc (y: their
 * block b0, by apart; yt: their block terms, nb apart); next, next2: the groups'
 * bytes to ask for, a block per block (NULL: none). */
INLINE void chunk(int nc, int nbc, const __m512i *w, const __m512 *dx, const char *y, size_t by,
                  const struct ggml_py_q8_0_terms *yt, int64_t nb, __m512 *acc, const char *next, const char *next2) {
    __m512 a[COLS];
    for (int c = 0; c < nc; c++) a[c] = acc[c];
    for (int b = 0; b < nbc; b++) {
        if (next) prefetch_blocks(next + b * BLOCK8, next2 + b * BLOCK8, BLOCK8);
        __m512i even[COLS], odd[COLS];
        for (int c = 0; c < nc; c++) {
            even[c] = _mm512_set1_epi32(yt[c * nb + b].minus8_sum);   /* (q - 8) . y */
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
            const __m512 sums = _mm512_cvtepi32_ps(_mm512_add_epi32(even[c], odd[c]));
            a[c] = _mm512_fmadd_ps(_mm512_mul_ps(dx[b], _mm512_set1_ps(yt[c * nb + b].d)), sums, a[c]);
        }
    }
    for (int c = 0; c < nc; c++) acc[c] = a[c];
}

void ggml_py_gemm_q4_0_rows16_avx512(int64_t n, int nr1, const char *x, const char *x2, const char *y,
                                     size_t by, const struct ggml_py_q8_0_terms *yt, float *d, float *d2, int64_t ldd) {
    const int64_t nb = n / GGML_PY_QK4_0;
    _Alignas(64) __m512i w[8 * CHUNK];
    _Alignas(64) __m512 dx[CHUNK];
    __m512 acc[GGML_PY_PANEL_COLS];   /* lane r: row r of x (r < 8) or r - 8 of x2, against row c */
    for (int c = 0; c < nr1; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += CHUNK) {
        const int nbc = (int) GGML_PY_MIN(CHUNK, nb - b0);
        unpack(x, x2, b0, nbc, w, dx);
        /* past the last chunk: the next group's first, which a thread taking items in turn reads next */
        const char *next = x + (b0 + nbc) * BLOCK8, *next2 = x2 + (b0 + nbc) * BLOCK8;
        for (int c = 0; c < nr1; c += COLS, next = next2 = NULL) {
            const char *yc = y + c * by + b0 * sizeof(ggml_py_block_q8_0);
#define PASS(nc) chunk(nc, nbc, w, dx, yc, by, yt + c * nb + b0, nb, acc + c, next, next2)
            GGML_PY_PANEL_PASSES(nr1 - c, PASS)
#undef PASS
        }
    }
    store_rows16(acc, nr1, d, d2, ldd);
}

/* ---- the K-quants ----
 *
 * isum[c] += sc * (the exact sum of ng groups of four values, w[g] lanes r: row r's
 * values, against activation row c's bytes from `at` of its Q8_K block b; y: their
 * blocks, by apart): one sub-block's products by VNNI into int32 lanes, in two chains,
 * times each row's scale. */
INLINE void add_scaled_sub_block(int nc, int ng, const __m512i *w, __m512i sc, const char *y, size_t by,
                                 int64_t b, int at, __m512i *isum) {
    __m512i even[COLS], odd[COLS];
    for (int c = 0; c < nc; c++) even[c] = odd[c] = _mm512_setzero_si512();
    for (int g = 0; g < ng; g += 2) {
        const __m512i w0 = _mm512_load_si512(w + g), w1 = _mm512_load_si512(w + g + 1);
        for (int c = 0; c < nc; c++) {
            const int8_t *qs = ((const ggml_py_block_q8_K *) (y + c * by) + b)->qs + at + 4 * g;
            int32_t y0, y1;
            memcpy(&y0, qs, 4);
            memcpy(&y1, qs + 4, 4);
            even[c] = _mm512_dpbusd_epi32(even[c], w0, _mm512_set1_epi32(y0));
            odd[c] = _mm512_dpbusd_epi32(odd[c], w1, _mm512_set1_epi32(y1));
        }
    }
    for (int c = 0; c < nc; c++)
        isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(_mm512_add_epi32(even[c], odd[c]), sc));
}

/* ---- Q4_K / Q5_K ----
 *
 * Each group unpacked as the 256-bit panel unpacks it (ggml_py_k4_rows8_unpack_half) into its
 * halves of the 512-bit vectors, then gemm_avx2.c's k4_panel_chunk on sixteen rows. */
struct k_panel16 {
    __m512i w[64 * K16_CHUNK], sc[8 * K16_CHUNK], mn[4 * K16_CHUNK];
    __m512 dx[K16_CHUNK], dm[K16_CHUNK];
};

/* Super-blocks [b0, b0 + nbc) of the groups x and x2 (nbc <= K16_CHUNK) into p: x's in the
 * vectors' low halves (lanes 0 .. 7), x2's in their high halves. */
static void k4_rows16_interleave(int five_bits, const char *x, const char *x2, int64_t b0, int nbc,
                                 struct k_panel16 *p) {
    __m256i *w = (__m256i *) p->w, *sc = (__m256i *) p->sc, *mn = (__m256i *) p->mn;
    float *dx = (float *) p->dx, *dm = (float *) p->dm;
    ggml_py_k4_rows8_unpack_half(five_bits, x, b0, nbc, (struct k_panel_view) { w, sc, mn, dx, dm });
    ggml_py_k4_rows8_unpack_half(five_bits, x2, b0, nbc, (struct k_panel_view) { w + 1, sc + 1, mn + 1, dx + 8, dm + 8 });
}

/* acc[c] += the unpacked super-blocks [0, nbc) against activation rows c < nc (y: their
 * super-block b0, by apart): gemm_avx2.c's k4_panel_chunk on sixteen rows, each
 * sub-block's sum by add_scaled_sub_block; next, next2: as Q4_0's chunk's, `block` bytes a
 * super-block. */
INLINE void k4_panel16_chunk(int nc, int nbc, const struct k_panel16 *p, const char *y, size_t by, __m512 *acc,
                             const char *next, const char *next2, size_t block) {
    __m512 a[COLS];
    for (int c = 0; c < nc; c++) a[c] = acc[c];
    for (int b = 0; b < nbc; b++) {
        if (next) prefetch_blocks(next + b * block, next2 + b * block, block);
        __m512i isum[COLS];
        for (int c = 0; c < nc; c++) isum[c] = _mm512_setzero_si512();
        for (int s = 0; s < 8; s++) {   /* the scale: the int16 copy in the lane's low half */
            const __m512i sc = _mm512_and_si512(_mm512_load_si512(p->sc + 8 * b + s), _mm512_set1_epi32(0xFFFF));
            add_scaled_sub_block(nc, 8, p->w + 64 * b + 8 * s, sc, y, by, b, 32 * s, isum);
        }
        for (int c = 0; c < nc; c++) {
            const ggml_py_block_q8_K *yb = (const ggml_py_block_q8_K *) (y + c * by) + b;
            const __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *) yb->bsums),
                                                 _mm_loadu_si128((const __m128i *) (yb->bsums + 8)));
            const __m512i pp = _mm512_broadcast_i32x4(pairs);
            __m512i msum = _mm512_madd_epi16(_mm512_load_si512(p->mn + 4 * b), _mm512_shuffle_epi32(pp, 0x00));
            msum = _mm512_add_epi32(msum, _mm512_madd_epi16(_mm512_load_si512(p->mn + 4 * b + 1), _mm512_shuffle_epi32(pp, 0x55)));
            msum = _mm512_add_epi32(msum, _mm512_madd_epi16(_mm512_load_si512(p->mn + 4 * b + 2), _mm512_shuffle_epi32(pp, 0xAA)));
            msum = _mm512_add_epi32(msum, _mm512_madd_epi16(_mm512_load_si512(p->mn + 4 * b + 3), _mm512_shuffle_epi32(pp, 0xFF)));
            const __m512 dy = _mm512_set1_ps(yb->d);
            const __m512 d = _mm512_mul_ps(p->dx[b], dy), dmin = _mm512_mul_ps(p->dm[b], dy);
            const __m512 t = _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(isum[c])),
                                           _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(msum)));
            a[c] = _mm512_add_ps(a[c], t);
        }
    }
    for (int c = 0; c < nc; c++) acc[c] = a[c];
}

void ggml_py_gemm_k4_rows16_avx512(int five_bits, int64_t n, int nr1, const char *x, const char *x2,
                                   const char *y, size_t by, float *d, float *d2, int64_t ldd) {
    const int64_t nb = n / GGML_PY_QK_K;
    _Alignas(64) struct k_panel16 p;
    __m512 acc[GGML_PY_PANEL_COLS];
    for (int c = 0; c < nr1; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += K16_CHUNK) {
        const int nbc = (int) GGML_PY_MIN(K16_CHUNK, nb - b0);
        k4_rows16_interleave(five_bits, x, x2, b0, nbc, &p);
        const char *yc = y + b0 * sizeof(ggml_py_block_q8_K);
        const size_t block = five_bits ? K5_ROWS8_BLOCK : K4_ROWS8_BLOCK;
        const char *next = x + (b0 + nbc) * block, *next2 = x2 + (b0 + nbc) * block;
        for (int c = 0; c < nr1; c += COLS, next = next2 = NULL) {
#define PASS(nc) k4_panel16_chunk(nc, nbc, &p, yc + c * by, by, acc + c, next, next2, block)
            GGML_PY_PANEL_PASSES(nr1 - c, PASS)
#undef PASS
        }
    }
    store_rows16(acc, nr1, d, d2, ldd);
}

/* ---- Q6_K: as Q4_K's (gemm_avx2.c's q6_K_panel_chunk) ---- */
struct q6_panel16 {
    __m512i w[64 * K16_CHUNK], sc[16 * K16_CHUNK], sp[8 * K16_CHUNK];
    __m512 dx[K16_CHUNK];
};

/* Super-blocks [b0, b0 + nbc) of the groups x and x2 (nbc <= K16_CHUNK) into p, as Q4_K's. */
static void q6_rows16_interleave(const char *x, const char *x2, int64_t b0, int nbc, struct q6_panel16 *p) {
    __m256i *w = (__m256i *) p->w, *sc = (__m256i *) p->sc, *sp = (__m256i *) p->sp;
    float *dx = (float *) p->dx;
    ggml_py_q6_rows8_unpack_half(x, b0, nbc, (struct q6_panel_view) { w, sc, sp, dx });
    ggml_py_q6_rows8_unpack_half(x2, b0, nbc, (struct q6_panel_view) { w + 1, sc + 1, sp + 1, dx + 8 });
}

/* gemm_avx2.c's q6_K_panel_chunk on sixteen rows, each sub-block's sum by
 * add_scaled_sub_block (the scale: the int16 copy in the lane's high half, sign-extended);
 * next, next2: as Q4_K's */
INLINE void q6_panel16_chunk(int nc, int nbc, const struct q6_panel16 *p, const char *y, size_t by, __m512 *acc,
                             const char *next, const char *next2) {
    __m512 a[COLS];
    for (int c = 0; c < nc; c++) a[c] = acc[c];
    for (int b = 0; b < nbc; b++) {
        if (next) prefetch_blocks(next + b * Q6_ROWS8_BLOCK, next2 + b * Q6_ROWS8_BLOCK, Q6_ROWS8_BLOCK);
        __m512i isum[COLS];
        for (int c = 0; c < nc; c++) isum[c] = _mm512_setzero_si512();
        for (int s = 0; s < 16; s++) {   /* sub-blocks of 16 values: four groups */
            const __m512i sc = _mm512_srai_epi32(_mm512_load_si512(p->sc + 16 * b + s), 16);
            add_scaled_sub_block(nc, 4, p->w + 64 * b + 4 * s, sc, y, by, b, 16 * s, isum);
        }
        for (int c = 0; c < nc; c++) {
            const ggml_py_block_q8_K *yb = (const ggml_py_block_q8_K *) (y + c * by) + b;
            __m512i off = _mm512_setzero_si512();
            for (int k = 0; k < 8; k++) {
                int32_t pair;
                memcpy(&pair, yb->bsums + 2 * k, 4);
                off = _mm512_add_epi32(off, _mm512_madd_epi16(_mm512_load_si512(p->sp + 8 * b + k), _mm512_set1_epi32(pair)));
            }
            const __m512i is = _mm512_sub_epi32(isum[c], _mm512_slli_epi32(off, 5));
            a[c] = _mm512_add_ps(a[c], _mm512_mul_ps(_mm512_mul_ps(p->dx[b], _mm512_set1_ps(yb->d)), _mm512_cvtepi32_ps(is)));
        }
    }
    for (int c = 0; c < nc; c++) acc[c] = a[c];
}

void ggml_py_gemm_q6_K_rows16_avx512(int64_t n, int nr1, const char *x, const char *x2, const char *y,
                                     size_t by, float *d, float *d2, int64_t ldd) {
    const int64_t nb = n / GGML_PY_QK_K;
    _Alignas(64) struct q6_panel16 p;
    __m512 acc[GGML_PY_PANEL_COLS];
    for (int c = 0; c < nr1; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += K16_CHUNK) {
        const int nbc = (int) GGML_PY_MIN(K16_CHUNK, nb - b0);
        q6_rows16_interleave(x, x2, b0, nbc, &p);
        const char *yc = y + b0 * sizeof(ggml_py_block_q8_K);
        const char *next = x + (b0 + nbc) * Q6_ROWS8_BLOCK, *next2 = x2 + (b0 + nbc) * Q6_ROWS8_BLOCK;
        for (int c = 0; c < nr1; c += COLS, next = next2 = NULL) {
#define PASS(nc) q6_panel16_chunk(nc, nbc, &p, yc + c * by, by, acc + c, next, next2)
            GGML_PY_PANEL_PASSES(nr1 - c, PASS)
#undef PASS
        }
    }
    store_rows16(acc, nr1, d, d2, ldd);
}
#endif
