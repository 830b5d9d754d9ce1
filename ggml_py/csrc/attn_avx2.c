/* attn_avx2.c - AVX2 attention kernels: the operations of attn_ref.c's twins on
 * eight lanes, tiled so that a key row is read once for two query rows and a value row
 * once for four rows of scores.
 *
 * scores: 2 rows x 4 keys (8 accumulators), every row tile against four keys before
 *         the next four (a key row comes from memory once, not once per row tile; a row's
 *         four scores stored side by side, as the score buffer's rows lie far apart), then
 *         1 row x 8 keys for an odd last row (I8: the row paired with a stand-in whose
 *         scores are not stored); the eight accumulators are summed by one
 *         transposing reduction whose lane i is tree8 of accumulator i (attn.h), so a
 *         (row, key) score has the same bits in either tile. Quantized keys: the integer
 *         dot of each 32-value block (VNNI where the build targets it), K values in
 *         registers, never a float copy of a row. I8 keys with VNNI: keys in lanes,
 *         eight at a time (a panel), no reduction at all.
 * pv:     4 rows x 16 elements (8 accumulators; 8 rows for Q8_0 / Q4_0 where there are
 *         32 vector registers) over a block of keys; each value row is de-quantized in
 *         registers (int8 -> int32 -> float, times its block's scale) and fed to the fused
 *         multiply-adds, keys in ascending order for every element. I8: integer sums of
 *         int16 weights (attn.h), two keys per multiply-add.
 * The F32 / F16 and I8 score kernels run with the head size a constant where it is 64 or
 * 128 (SPECIALIZE_D). */
#include "attn.h"
#include "impl.h"
#include "simd.h"

#if defined(GGML_PY_HAVE_AVX2)

#include "quants_avx2.h"

/* lane i = tree8(v[i]) */
static inline __m256 reduce8(const __m256 v[8]) {
    const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* lane i = the sum of v[i]'s int32 lanes (exact) */
static inline __m256i reduce8_i32(const __m256i v[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* Rows come from a slot list (pages anywhere in the pool): the hardware prefetchers
 * cannot guess them, so each kernel asks for the row PREFETCH_BYTES of rows ahead of the
 * one it reads, past its own keys up to the list's end (slim and flash hand the score
 * kernel the list 64 keys at a time). */
#define PREFETCH_BYTES 2048

/* keys from the one read to the one asked for */
static inline int64_t prefetch_ahead(const struct ggml_py_attn_rows *x) {
    return GGML_PY_MAX(8, PREFETCH_BYTES / x->row_bytes);
}

/* Keys j .. j + 3 of the list at j0 (nk keys) into k4 (the first again past the end), the
 * four `ahead` keys on asked for; how many there are. The 2-row x 4-key tiles' step. */
static inline int key_quad(const struct ggml_py_attn_rows *k, int64_t j0, int64_t j, int64_t nk,
                           int64_t ahead, const char *k4[4]) {
    const int n4 = (int) GGML_PY_MIN(4, nk - j);
    for (int c = 0; c < 4; c++) {
        k4[c] = ggml_py_attn_row(k, j0 + j + (c < n4 ? c : 0));
        ggml_py_attn_prefetch_row(k, j0 + j + ahead + c);
    }
    return n4;
}

/* fn(D, ...) with D a constant for the usual head sizes, so that the compiler unrolls the
 * loops over a row (the same operations in the same order as with D a variable) */
#define SPECIALIZE_D(fn, D, ...)                                                                \
    do {                                                                                        \
        if ((D) == 64) fn(64, __VA_ARGS__);                                                     \
        else if ((D) == 128) fn(128, __VA_ARGS__);                                              \
        else fn(D, __VA_ARGS__);                                                                \
    } while (0)

/* ---- exp and the softmax numerators ------------------------------------------------- */

float ggml_py_attn_exp_sum_avx2(int64_t n, float *x, float max) {
    const __m256 vmax = _mm256_set1_ps(max);
    __m256 acc = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 e = ggml_py_exp_nonpositive_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), vmax));
        _mm256_storeu_ps(x + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    float sum = ggml_py_attn_tree8(lanes);
    for (; j < n; j++) {
        x[j] = ggml_py_attn_exp_ref(x[j] - max);
        sum = sum + x[j];
    }
    return sum;
}

/* maxps(x, m) is x > m ? x : m, the twin's comparison in each lane */
float ggml_py_attn_max_avx2(int64_t n, const float *x) {
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) m8 = _mm256_max_ps(_mm256_loadu_ps(x + j), m8);
    float lanes[8], max = -INFINITY;
    _mm256_storeu_ps(lanes, m8);
    for (int l = 0; l < 8; l++) max = lanes[l] > max ? lanes[l] : max;
    for (; j < n; j++) max = x[j] > max ? x[j] : max;
    return max;
}

/* ---- float keys (F32, F16) -------------------------------------------------------- */

static inline __m256 load8_f32(const char *row, int64_t d) { return _mm256_loadu_ps((const float *) row + d); }
static inline __m256 load8_f16(const char *row, int64_t d) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) ((const ggml_py_fp16_t *) row + d)));
}
static inline float at_f32(const char *row, int64_t d) { float v; memcpy(&v, row + 4 * d, 4); return v; }
static inline float at_f16(const char *row, int64_t d) {
    ggml_py_fp16_t h;
    memcpy(&h, row + 2 * d, 2);
    return ggml_py_fp16_to_fp32(h);
}

/* S of the (row, key) pairs of the 8 accumulators: lane i is pair (qr[i], kr[i]); the
 * D % 8 last elements one by one; pairs with a NULL row are not stored */
#define FLOAT_FINISH(AT)                                                                       \
    do {                                                                                       \
        float s8[8];                                                                           \
        _mm256_storeu_ps(s8, reduce8(acc));                                                    \
        for (int i = 0; i < 8; i++) {                                                          \
            if (out[i] == NULL) continue;                                                      \
            float s = s8[i];                                                                   \
            for (int64_t d = D8; d < D; d++) s = fmaf(qr[i][d], AT(kr[i], d), s);              \
            *out[i] = s * scale;                                                               \
        }                                                                                      \
    } while (0)

/* 2 rows x 4 keys of scores s (lane 4i + c: row i, key c), n4 keys stored, four adjacent
 * scores a row (rows of a long buffer lie far apart: whole vectors, not pairs) */
static inline void store_2x4(__m256 s, float *S, int64_t lds, int n4) {
    if (n4 == 4) {
        _mm_storeu_ps(S, _mm256_castps256_ps128(s));
        _mm_storeu_ps(S + lds, _mm256_extractf128_ps(s, 1));
    } else {
        float s8[8];
        _mm256_storeu_ps(s8, s);
        for (int c = 0; c < n4; c++) S[c] = s8[c], S[lds + c] = s8[4 + c];
    }
}

/* a row's eight adjacent scores, n8 of them stored */
static inline void store_1x8_scores(__m256 s, float *S, int n8) {
    if (n8 == 8) {
        _mm256_storeu_ps(S, s);
    } else {
        float s8[8];
        _mm256_storeu_ps(s8, s);
        for (int i = 0; i < n8; i++) S[i] = s8[i];
    }
}

/* 1 row x 8 keys, n8 of them stored */
static inline void store_1x8(const __m256 acc[8], float scale, float *S, int n8) {
    store_1x8_scores(_mm256_mul_ps(reduce8(acc), _mm256_set1_ps(scale)), S, n8);
}

#define FLOAT_SCORES_AVX2(t, LOAD8, AT)                                                         \
static inline __attribute__((always_inline)) void                                               \
float_scores_##t(int64_t D, int64_t nr, const void *q, size_t q_stride,                         \
                 const struct ggml_py_attn_rows *k, int64_t j0, int64_t nk,                      \
                 float *S, int64_t lds, float scale) {                                           \
    const int64_t D8 = D & ~(int64_t) 7;                                                        \
    const int64_t nr2 = nr & ~(int64_t) 1;                                                      \
    const int64_t ahead = prefetch_ahead(k);                                                    \
    for (int64_t j = 0; nr2 > 0 && j < nk; j += 4) {   /* keys outer: each read once */         \
        const char *k4[4];                                                                      \
        const int n4 = key_quad(k, j0, j, nk, ahead, k4);                                       \
        for (int64_t r = 0; r < nr2; r += 2) {                                                  \
            const float *q2[2];                                                                 \
            for (int i = 0; i < 2; i++) q2[i] = (const float *) ((const char *) q + (r + i) * q_stride); \
            __m256 acc[8];                                                                      \
            for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();                           \
            for (int64_t d = 0; d < D8; d += 8) {                                               \
                __m256 kv[4];                                                                   \
                for (int c = 0; c < 4; c++) kv[c] = LOAD8(k4[c], d);                            \
                for (int i = 0; i < 2; i++) {                                                   \
                    __m256 qv = _mm256_loadu_ps(q2[i] + d);                                     \
                    GGML_PY_KEEP_IN_REGISTER(qv);   /* one load for the four keys */          \
                    for (int c = 0; c < 4; c++) acc[4 * i + c] = _mm256_fmadd_ps(qv, kv[c], acc[4 * i + c]); \
                }                                                                               \
            }                                                                                   \
            if (D8 == D) {                                                                      \
                store_2x4(_mm256_mul_ps(reduce8(acc), _mm256_set1_ps(scale)), S + r * lds + j, lds, n4); \
                continue;                                                                       \
            }                                                                                   \
            const float *qr[8];                                                                 \
            const char *kr[8];                                                                  \
            float *out[8];                                                                      \
            for (int i = 0; i < 8; i++) {                                                       \
                qr[i] = q2[i / 4];                                                              \
                kr[i] = k4[i % 4];                                                              \
                out[i] = i % 4 < n4 ? S + (r + i / 4) * lds + j + i % 4 : NULL;                 \
            }                                                                                   \
            FLOAT_FINISH(AT);                                                                   \
        }                                                                                       \
    }                                                                                           \
    for (int64_t r = nr2; r < nr; r++) {                                                        \
        const float *q1 = (const float *) ((const char *) q + r * q_stride);                    \
        for (int64_t j = 0; j < nk; j += 8) {                                                   \
            const int n8 = (int) GGML_PY_MIN(8, nk - j);                                        \
            for (int i = 0; i < 8; i++) ggml_py_attn_prefetch_row(k, j0 + j + ahead + i);       \
            const float *qr[8];                                                                 \
            const char *kr[8];                                                                  \
            float *out[8];                                                                      \
            for (int i = 0; i < 8; i++) {                                                       \
                qr[i] = q1;                                                                     \
                kr[i] = ggml_py_attn_row(k, j0 + j + (i < n8 ? i : 0));                         \
                out[i] = i < n8 ? S + r * lds + j + i : NULL;                                   \
            }                                                                                   \
            __m256 acc[8];                                                                      \
            for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();                           \
            for (int64_t d = 0; d < D8; d += 8) {                                               \
                const __m256 qv = _mm256_loadu_ps(q1 + d);                                      \
                for (int i = 0; i < 8; i++) acc[i] = _mm256_fmadd_ps(qv, LOAD8(kr[i], d), acc[i]); \
            }                                                                                   \
            if (D8 == D) store_1x8(acc, scale, S + r * lds + j, n8);                            \
            else FLOAT_FINISH(AT);                                                              \
        }                                                                                       \
    }                                                                                           \
}                                                                                               \
void ggml_py_attn_scores_##t##_avx2(int64_t D, int64_t nr, const void *q, size_t q_stride,      \
                                    const struct ggml_py_attn_rows *k, int64_t j0, int64_t nk,   \
                                    float *S, int64_t lds, float scale) {                        \
    SPECIALIZE_D(float_scores_##t, D, nr, q, q_stride, k, j0, nk, S, lds, scale);            \
}
FLOAT_SCORES_AVX2(f32, load8_f32, at_f32)
FLOAT_SCORES_AVX2(f16, load8_f16, at_f16)

/* ---- Q8_0 / Q4_0 keys against Q8_0 queries ----------------------------------------------- */

static inline __m256i key_bytes_q8_0(const char *row, int64_t b, __m256 *d) {
    const ggml_py_block_q8_0 *kb = (const ggml_py_block_q8_0 *) row + b;
    *d = _mm256_set1_ps(ggml_py_fp16_to_fp32(kb->d));
    return _mm256_loadu_si256((const __m256i *) kb->qs);
}

static inline __m256i key_bytes_q4_0(const char *row, int64_t b, __m256 *d) {
    const ggml_py_block_q4_0 *kb = (const ggml_py_block_q4_0 *) row + b;
    *d = _mm256_set1_ps(ggml_py_fp16_to_fp32(kb->d));
    return _mm256_sub_epi8(ggml_py_nibbles32(kb->qs), _mm256_set1_epi8(8));
}

/* 2 rows x 4 keys and 1 row x 8 keys of quantized keys (blocks of 32) against Q8_0
 * queries: lane l of a (row, key) accumulator adds fma(dk * dq, integer dot of elements
 * 4l..4l+3) */
#define QUANT_SCORES_AVX2(t, KEY_BYTES)                                                         \
void ggml_py_attn_scores_##t##_avx2(int64_t D, int64_t nr, const void *q, size_t q_stride,      \
                                    const struct ggml_py_attn_rows *k, int64_t j0, int64_t nk,   \
                                    float *S, int64_t lds, float scale) {                        \
    const int64_t nb = D / 32;                                                                  \
    const int64_t nr2 = nr & ~(int64_t) 1;                                                      \
    const int64_t ahead = prefetch_ahead(k);                                                    \
    for (int64_t j = 0; nr2 > 0 && j < nk; j += 4) {   /* keys outer: each read once */         \
        const char *k4[4];                                                                      \
        const int n4 = key_quad(k, j0, j, nk, ahead, k4);                                       \
        for (int64_t r = 0; r < nr2; r += 2) {                                                  \
            const ggml_py_block_q8_0 *q2[2];                                                    \
            for (int i = 0; i < 2; i++) q2[i] = (const void *) ((const char *) q + (r + i) * q_stride); \
            __m256 acc[8];                                                                      \
            for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();                           \
            for (int64_t b = 0; b < nb; b++) {                                                  \
                __m256 dk[4];                                                                   \
                __m256i kq[4];                                                                  \
                for (int c = 0; c < 4; c++) kq[c] = KEY_BYTES(k4[c], b, &dk[c]);                \
                for (int i = 0; i < 2; i++) {                                                   \
                    const __m256i qq = _mm256_loadu_si256((const __m256i *) q2[i][b].qs);       \
                    const __m256i aq = _mm256_sign_epi8(qq, qq);                                \
                    const __m256 dq = _mm256_set1_ps(ggml_py_fp16_to_fp32(q2[i][b].d));         \
                    for (int c = 0; c < 4; c++)                                                 \
                        acc[4 * i + c] = _mm256_fmadd_ps(_mm256_mul_ps(dk[c], dq), _mm256_cvtepi32_ps( \
                            ggml_py_dot_u8s8(aq, _mm256_sign_epi8(kq[c], qq))), acc[4 * i + c]); \
                }                                                                               \
            }                                                                                   \
            store_2x4(_mm256_mul_ps(reduce8(acc), _mm256_set1_ps(scale)), S + r * lds + j, lds, n4); \
        }                                                                                       \
    }                                                                                           \
    for (int64_t r = nr2; r < nr; r++) {                                                        \
        const ggml_py_block_q8_0 *q1 = (const void *) ((const char *) q + r * q_stride);       \
        for (int64_t j = 0; j < nk; j += 8) {                                                   \
            const int n8 = (int) GGML_PY_MIN(8, nk - j);                                        \
            const char *kr[8];                                                                  \
            for (int i = 0; i < 8; i++) kr[i] = ggml_py_attn_row(k, j0 + j + (i < n8 ? i : 0)); \
            for (int i = 0; i < 8; i++) ggml_py_attn_prefetch_row(k, j0 + j + ahead + i);       \
            __m256 acc[8];                                                                      \
            for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();                           \
            for (int64_t b = 0; b < nb; b++) {                                                  \
                const __m256i qq = _mm256_loadu_si256((const __m256i *) q1[b].qs);              \
                const __m256i aq = _mm256_sign_epi8(qq, qq);                                    \
                const __m256 dq = _mm256_set1_ps(ggml_py_fp16_to_fp32(q1[b].d));                \
                for (int i = 0; i < 8; i++) {                                                   \
                    __m256 dk;                                                                  \
                    const __m256i kq = KEY_BYTES(kr[i], b, &dk);                                \
                    acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dk, dq), _mm256_cvtepi32_ps(         \
                        ggml_py_dot_u8s8(aq, _mm256_sign_epi8(kq, qq))), acc[i]);               \
                }                                                                               \
            }                                                                                   \
            store_1x8(acc, scale, S + r * lds + j, n8);                                         \
        }                                                                                       \
    }                                                                                           \
}
QUANT_SCORES_AVX2(q8_0, key_bytes_q8_0)
QUANT_SCORES_AVX2(q4_0, key_bytes_q4_0)

/* ---- I8 keys (one scale per row and head) against int8 queries: exact integer sums --- */

static inline int32_t tail_i8(const int8_t *qs, const int8_t *ks, int64_t d0, int64_t D) {
    int32_t s = 0;
    for (int64_t d = d0; d < D; d++) s += (int32_t) qs[d] * ks[d];
    return s;
}

static inline __attribute__((always_inline)) void
scores_i8(int64_t D, int64_t nr, const void *q, size_t q_stride, const struct ggml_py_attn_rows *k,
          int64_t j0, int64_t nk, float *S, int64_t lds, float scale) {
    const int64_t D32 = D & ~(int64_t) 31;
    const int64_t ahead = prefetch_ahead(k);
    /* keys outer (each read once), 2 rows x 4 keys; a last row alone reuses the first
     * (its sums are not stored) */
    for (int64_t j = 0; j < nk; j += 4) {
        const char *k4[4];
        float dk[4];
        const int n4 = key_quad(k, j0, j, nk, ahead, k4);
        for (int c = 0; c < 4; c++) dk[c] = ggml_py_attn_row_scale(k, j0 + j + (c < n4 ? c : 0));
        for (int64_t r = 0; r < nr; r += 2) {
            const int n2 = (int) GGML_PY_MIN(2, nr - r);
            const int8_t *q2[2];
            float dq[2];
            for (int i = 0; i < 2; i++) {
                const char *qr = (const char *) q + (r + (i < n2 ? i : 0)) * q_stride;
                memcpy(&dq[i], qr, sizeof(float));
                q2[i] = (const int8_t *) qr + 32;
            }
            __m256i acc[8];
            for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_si256();
            for (int64_t d = 0; d < D32; d += 32) {
                __m256i kq[4];
                for (int c = 0; c < 4; c++) kq[c] = _mm256_loadu_si256((const __m256i *) (k4[c] + d));
                for (int i = 0; i < 2; i++) {
                    const __m256i qq = _mm256_loadu_si256((const __m256i *) (q2[i] + d));
                    const __m256i aq = _mm256_sign_epi8(qq, qq);
                    for (int c = 0; c < 4; c++)
                        acc[4 * i + c] = ggml_py_dot_u8s8_acc(acc[4 * i + c], aq, _mm256_sign_epi8(kq[c], qq));
                }
            }
            if (n2 == 2 && D32 == D) {   /* lane 4i + c: (float) sum * (dq_i * dk_c) * scale */
                const __m256 dq8 = _mm256_setr_ps(dq[0], dq[0], dq[0], dq[0], dq[1], dq[1], dq[1], dq[1]);
                const __m256 dk8 = _mm256_setr_ps(dk[0], dk[1], dk[2], dk[3], dk[0], dk[1], dk[2], dk[3]);
                const __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(reduce8_i32(acc)), _mm256_mul_ps(dq8, dk8));
                store_2x4(_mm256_mul_ps(s, _mm256_set1_ps(scale)), S + r * lds + j, lds, n4);
                continue;
            }
            int32_t s8[8];
            _mm256_storeu_si256((__m256i *) s8, reduce8_i32(acc));
            for (int i = 0; i < n2; i++) {
                for (int c = 0; c < n4; c++) {
                    const int32_t sum = s8[4 * i + c] + tail_i8(q2[i], (const int8_t *) k4[c], D32, D);
                    S[(r + i) * lds + j + c] = (float) sum * (dq[i] * dk[c]) * scale;
                }
            }
        }
    }
}

#if defined(GGML_PY_HAVE_VNNI)
/* With VNNI: keys in lanes. Eight keys are turned into a panel once, then every query
 * row takes D / 4 vpdpbusd against it, each with four of its bytes broadcast: the row's
 * eight sums come out side by side, with no horizontal reduction. vpdpbusd multiplies
 * unsigned by signed bytes, so the panel holds k + 128 and the row's 128 * sum(q) is taken
 * off after: the same exact integer sum. (Without VNNI, maddubs would saturate on k + 128.) */
#define I8_PANEL_MAX_D 256

/* x[c] lane g -> x[g] lane c */
static inline void transpose8_epi32(__m256i x[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(x[2 * i], x[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(x[2 * i], x[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++)     /* rows 4h .. 4h + 3 */
        for (int i = 0; i < 2; i++) {
            u[4 * h + 2 * i] = _mm256_unpacklo_epi64(t[4 * h + i], t[4 * h + 2 + i]);
            u[4 * h + 2 * i + 1] = _mm256_unpackhi_epi64(t[4 * h + i], t[4 * h + 2 + i]);
        }
    for (int g = 0; g < 4; g++) {
        x[g] = _mm256_permute2x128_si256(u[g], u[4 + g], 0x20);
        x[g + 4] = _mm256_permute2x128_si256(u[g], u[4 + g], 0x31);
    }
}

/* panel[g] lane c = bytes 4g .. 4g + 3 of key row k8[c], each + 128; D % 32 == 0 */
static inline void i8_key_panel(int64_t D, const char *k8[8], __m256i *panel) {
    const __m256i flip = _mm256_set1_epi8((char) 0x80);
    for (int64_t d = 0; d < D; d += 32) {
        __m256i x[8];
        for (int c = 0; c < 8; c++) x[c] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *) (k8[c] + d)), flip);
        transpose8_epi32(x);
        for (int g = 0; g < 8; g++) panel[d / 4 + g] = x[g];
    }
}

static inline __attribute__((always_inline)) void
scores_i8_panel(int64_t D, int64_t nr, const void *q, size_t q_stride, const struct ggml_py_attn_rows *k,
                int64_t j0, int64_t nk, float *S, int64_t lds, float scale) {
    __m256i panel[I8_PANEL_MAX_D / 4];
    const int64_t ahead = prefetch_ahead(k);
    for (int64_t j = 0; j < nk; j += 8) {
        const int n8 = (int) GGML_PY_MIN(8, nk - j);
        const char *k8[8];
        float dk[8];
        for (int c = 0; c < 8; c++) {
            k8[c] = ggml_py_attn_row(k, j0 + j + (c < n8 ? c : 0));
            dk[c] = ggml_py_attn_row_scale(k, j0 + j + (c < n8 ? c : 0));
            ggml_py_attn_prefetch_row(k, j0 + j + ahead + c);
        }
        i8_key_panel(D, k8, panel);
        const __m256 dk8 = _mm256_loadu_ps(dk);
        for (int64_t r = 0; r < nr; r += 8) {   /* rows past nr: stand-ins, not stored */
            const int n = (int) GGML_PY_MIN(8, nr - r);
            const int8_t *qs[8];
            for (int i = 0; i < 8; i++) qs[i] = (const int8_t *) q + (r + (i < n ? i : 0)) * q_stride + 32;
            __m256i acc[8];
            for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_si256();
#pragma GCC unroll 16   /* the whole row at D = 64: no loop counting between the multiply-adds */
            for (int64_t g = 0; g < D / 4; g++) {
                const __m256i p = panel[g];
                for (int i = 0; i < 8; i++) {
                    int32_t q4;
                    memcpy(&q4, qs[i] + 4 * g, 4);
                    acc[i] = ggml_py_dot_u8s8_acc(acc[i], p, _mm256_set1_epi32(q4));
                }
            }
            const __m256 vscale = _mm256_set1_ps(scale);
            for (int i = 0; i < n; i++) {
                const char *qr = (const char *) q + (r + i) * q_stride;   /* dq at 0, sum(q) at 4 */
                int32_t qsum;
                memcpy(&qsum, qr + 4, sizeof(qsum));
                const __m256i sums = _mm256_sub_epi32(acc[i], _mm256_slli_epi32(_mm256_set1_epi32(qsum), 7));
                const __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(_mm256_broadcast_ss((const float *) qr), dk8));
                store_1x8_scores(_mm256_mul_ps(s, vscale), S + (r + i) * lds + j, n8);
            }
        }
    }
}
#endif

void ggml_py_attn_scores_i8_avx2(int64_t D, int64_t nr, const void *q, size_t q_stride,
                                 const struct ggml_py_attn_rows *k, int64_t j0, int64_t nk,
                                 float *S, int64_t lds, float scale) {
#if defined(GGML_PY_HAVE_VNNI)
    if (D % 32 == 0 && D <= I8_PANEL_MAX_D) {
        SPECIALIZE_D(scores_i8_panel, D, nr, q, q_stride, k, j0, nk, S, lds, scale);
        return;
    }
#endif
    SPECIALIZE_D(scores_i8, D, nr, q, q_stride, k, j0, nk, S, lds, scale);
}

/* ---- scores times V: values de-quantized in registers ------------------------------ */

#define PV_KEYS 64   /* keys per pass: their value rows stay in L1 for every tile */

/* 8 values of a row from element d (d % 8 == 0), as floats: q * block scale for Q8_0 /
 * Q4_0 (the exact product de-quantization makes) */
static inline __m256 deq8_f32(const char *vr, int64_t d) { return load8_f32(vr, d); }
static inline __m256 deq8_f16(const char *vr, int64_t d) { return load8_f16(vr, d); }
static inline __m256 deq8_q8_0(const char *vr, int64_t d) {
    const ggml_py_block_q8_0 *b = (const ggml_py_block_q8_0 *) vr + d / 32;
    const __m256i qi = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *) (b->qs + d % 32)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(qi), _mm256_set1_ps(ggml_py_fp16_to_fp32(b->d)));
}
static inline __m256 deq8_q4_0(const char *vr, int64_t d) {
    const ggml_py_block_q4_0 *b = (const ggml_py_block_q4_0 *) vr + d / 32;
    const int e = (int) (d % 32);
    __m256i qi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *) (b->qs + e % 16)));
    qi = e < 16 ? _mm256_and_si256(qi, _mm256_set1_epi32(0xF)) : _mm256_srli_epi32(qi, 4);
    qi = _mm256_sub_epi32(qi, _mm256_set1_epi32(8));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(qi), _mm256_set1_ps(ggml_py_fp16_to_fp32(b->d)));
}

static inline float value_f32(const char *vr, int64_t d) { return at_f32(vr, d); }
static inline float value_f16(const char *vr, int64_t d) { return at_f16(vr, d); }
/* (Q8_0 and Q4_0 rows are whole blocks of 32: no element is left for these) */
static inline float value_q8_0(const char *vr, int64_t d) { GGML_PY_UNUSED(vr); GGML_PY_UNUSED(d); return 0.0f; }
static inline float value_q4_0(const char *vr, int64_t d) { GGML_PY_UNUSED(vr); GGML_PY_UNUSED(d); return 0.0f; }

/* the weight of row r, key j: its probability */
#define P_AT(r, j) (P + (r) * ldp + (j))

/* With 32 vector registers the quantized types (their values take more than one conversion,
 * int8 -> int32 -> float) run tiles of 8 rows: each value row de-quantized once for twice the rows
 * (F32 / F16 keep 4: their conversion is one instruction or none, and the 8-row tile's
 * registers cost more than it saves) */
#if defined(__AVX512VL__)
#define PV_WIDE(t) PV_WIDE_##t
#else
#define PV_WIDE(t) 0
#endif
#define PV_WIDE_f32 0
#define PV_WIDE_f16 0
#define PV_WIDE_q8_0 1
#define PV_WIDE_q4_0 1

/* NR rows (1, 4 or 8) of acc from element d, NW vectors wide (1 or 2), keys jb..je */
#define PV_TILE(DEQ8, WEIGHT, NR, NW)                                                           \
    do {                                                                                        \
        __m256 a[NR][NW];                                                                       \
        for (int i = 0; i < NR; i++)                                                            \
            for (int w = 0; w < NW; w++) a[i][w] = _mm256_loadu_ps(acc + (r + i) * D + d + 8 * w); \
        for (int64_t j = jb; j < je; j++) {                                                     \
            const char *vr = ggml_py_attn_row(v, j0 + j);                                       \
            __m256 x[NW];                                                                       \
            for (int w = 0; w < NW; w++) x[w] = DEQ8(vr, d + 8 * w);                            \
            for (int i = 0; i < NR; i++) {                                                      \
                const __m256 p = _mm256_broadcast_ss(WEIGHT(r + i, j));                         \
                for (int w = 0; w < NW; w++) a[i][w] = _mm256_fmadd_ps(p, x[w], a[i][w]);       \
            }                                                                                   \
        }                                                                                       \
        for (int i = 0; i < NR; i++)                                                            \
            for (int w = 0; w < NW; w++) _mm256_storeu_ps(acc + (r + i) * D + d + 8 * w, a[i][w]); \
    } while (0)

/* rows r .. r+NR-1 over every element: 16 at a time, then 8, then one by one */
#define PV_ROWS(DEQ8, VALUE, WEIGHT, NR)                                                        \
    do {                                                                                        \
        int64_t d = 0;                                                                          \
        for (; d + 16 <= D; d += 16) PV_TILE(DEQ8, WEIGHT, NR, 2);                              \
        for (; d + 8 <= D; d += 8) PV_TILE(DEQ8, WEIGHT, NR, 1);                                \
        for (; d < D; d++)                                                                      \
            for (int i = 0; i < NR; i++) {                                                      \
                float *a = acc + (r + i) * D + d;                                               \
                for (int64_t j = jb; j < je; j++)                                               \
                    *a = fmaf(*WEIGHT(r + i, j), VALUE(ggml_py_attn_row(v, j0 + j), d), *a);    \
            }                                                                                   \
    } while (0)

/* the value rows of the next block in cache (their slots are anywhere in the pool) */
static inline void prefetch_block(const struct ggml_py_attn_rows *v, int64_t j0, int64_t jb, int64_t je) {
    if (jb == 0)
        for (int64_t j = 0; j < je; j++) ggml_py_attn_prefetch_row(v, j0 + j);
    for (int64_t j = je; j < je + PV_KEYS; j++) ggml_py_attn_prefetch_row(v, j0 + j);
}

#define PV_AVX2(t)                                                                              \
void ggml_py_attn_pv_##t##_avx2(int64_t D, int64_t nr, const float *P, int64_t ldp,            \
                                const struct ggml_py_attn_rows *v, int64_t j0, int64_t nk,      \
                                float *acc) {                                                   \
    for (int64_t jb = 0; jb < nk; jb += PV_KEYS) {                                              \
        const int64_t je = GGML_PY_MIN(nk, jb + PV_KEYS);                                       \
        prefetch_block(v, j0, jb, je);                                                          \
        int64_t r = 0;                                                                          \
        for (; PV_WIDE(t) && r + 8 <= nr; r += 8) PV_ROWS(deq8_##t, value_##t, P_AT, 8);        \
        for (; r + 4 <= nr; r += 4) PV_ROWS(deq8_##t, value_##t, P_AT, 4);                      \
        for (; r < nr; r++) PV_ROWS(deq8_##t, value_##t, P_AT, 1);                              \
    }                                                                                           \
}
PV_AVX2(f32)
PV_AVX2(f16)
PV_AVX2(q8_0)
PV_AVX2(q4_0)

/* I8: each block of keys' weights rounded to int16 (attn.h), the value rows interleaved in
 * pairs (int8 -> int16, lane l: element l of both rows) so that one multiply-add of int16
 * pairs takes two keys, the sums exact in int32 lanes, then scaled into acc. Tiles of
 * PV_I8_ROWS rows x 16 elements. */
#define PV_ROWS_MAX 32
#if defined(__AVX512VL__)
#define PV_I8_ROWS 8
#else
#define PV_I8_ROWS 4
#endif

/* wq[0 .. 15] = the int16 nearest to w[0 .. 15] * iw (all in [0, 32767]) */
static inline void round16_i16(__m256 w0, __m256 w1, __m256 iw, int16_t *wq) {
    const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(w0, iw));
    const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(w1, iw));
    _mm256_storeu_si256((__m256i *) wq, _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8));
}

/* A row's int16 weights of n keys (attn.h), a zero after an odd last key; returns the
 * block's scale. A whole block in registers, the largest weight found in any order; the
 * weights are finite when their sum is (none is negative, and 64 of them cannot overflow: a
 * value row's scale is at most FLT_MAX / 127). A shorter last block by the twin's code. */
static inline float i8_weights(const float *p, const float *sv, int64_t n, int16_t *wq) {
    if (n < GGML_PY_ATTN_I8_KEYS) {
        wq[n] = 0;
        return ggml_py_attn_i8_weights(p, sv, n, wq);
    }
    __m256 w[8];
    for (int k = 0; k < 8; k++) w[k] = _mm256_mul_ps(_mm256_loadu_ps(p + 8 * k), _mm256_loadu_ps(sv + 8 * k));
    __m256 m8 = w[0], sum8 = w[0];
    for (int k = 1; k < 8; k++) m8 = _mm256_max_ps(w[k], m8), sum8 = _mm256_add_ps(sum8, w[k]);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float m = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    float sums[8];
    _mm256_storeu_ps(sums, sum8);
    if (!isfinite(ggml_py_attn_tree8(sums))) {
        memset(wq, 0, sizeof(int16_t) * GGML_PY_ATTN_I8_KEYS);
        return NAN;
    }
    const __m256 iw = _mm256_set1_ps(ggml_py_attn_i8_factor(m));
    for (int k = 0; k < 8; k += 2) round16_i16(w[k], w[k + 1], iw, wq + 8 * k);
    return m / GGML_PY_ATTN_I8_WMAX;
}

/* NR rows (r ..) x 16 elements (d ..) of the block's n keys (value rows vr) */
#define PV_I8_TILE(NR)                                                                          \
    do {                                                                                        \
        __m256i lo[NR], hi[NR];   /* elements 0-3, 8-11 and 4-7, 12-15 */                     \
        for (int i = 0; i < NR; i++) lo[i] = hi[i] = _mm256_setzero_si256();                    \
        for (int64_t j = 0; j < n; j += 2) {                                                    \
            const __m256i a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) (vr[j] + d))); \
            const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) (vr[j + 1] + d))); \
            const __m256i vl = _mm256_unpacklo_epi16(a, b), vh = _mm256_unpackhi_epi16(a, b);   \
            for (int i = 0; i < NR; i++) {                                                      \
                int32_t w2;                                                                     \
                memcpy(&w2, wq[r + i - r0] + j, sizeof(w2));                                    \
                const __m256i w = _mm256_set1_epi32(w2);                                        \
                lo[i] = ggml_py_dot_s16_acc(lo[i], vl, w);                                      \
                hi[i] = ggml_py_dot_s16_acc(hi[i], vh, w);                                      \
            }                                                                                   \
        }                                                                                       \
        for (int i = 0; i < NR; i++) {                                                          \
            float *a = acc + (r + i) * D + d;                                                   \
            const __m256 s = _mm256_set1_ps(ws[r + i - r0]);                                   \
            const __m256i s0 = _mm256_permute2x128_si256(lo[i], hi[i], 0x20);                   \
            const __m256i s1 = _mm256_permute2x128_si256(lo[i], hi[i], 0x31);                   \
            _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), s, _mm256_loadu_ps(a))); \
            _mm256_storeu_ps(a + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), s, _mm256_loadu_ps(a + 8))); \
        }                                                                                       \
    } while (0)

void ggml_py_attn_pv_i8_avx2(int64_t D, int64_t nr, const float *P, int64_t ldp,
                             const struct ggml_py_attn_rows *v, int64_t j0, int64_t nk, float *acc) {
    int16_t wq[PV_ROWS_MAX][GGML_PY_ATTN_I8_KEYS];
    float ws[PV_ROWS_MAX], sv[GGML_PY_ATTN_I8_KEYS];
    const char *vr[GGML_PY_ATTN_I8_KEYS + 1];
    for (int64_t jb = 0; jb < nk; jb += GGML_PY_ATTN_I8_KEYS) {
        const int64_t n = GGML_PY_MIN(GGML_PY_ATTN_I8_KEYS, nk - jb);
        prefetch_block(v, j0, jb, jb + n);
        for (int64_t j = 0; j < n; j++) {
            vr[j] = ggml_py_attn_row(v, j0 + jb + j);
            sv[j] = ggml_py_attn_row_scale(v, j0 + jb + j);
        }
        vr[n] = vr[0];   /* an odd last key's partner, of weight 0 */
        for (int64_t r0 = 0; r0 < nr; r0 += PV_ROWS_MAX) {
            const int64_t r1 = GGML_PY_MIN(nr, r0 + PV_ROWS_MAX);
            for (int64_t r = r0; r < r1; r++) ws[r - r0] = i8_weights(P + r * ldp + jb, sv, n, wq[r - r0]);
            int64_t d = 0;
            for (; d + 16 <= D; d += 16) {
                int64_t r = r0;
                for (; r + PV_I8_ROWS <= r1; r += PV_I8_ROWS) PV_I8_TILE(PV_I8_ROWS);
                for (; r < r1; r++) PV_I8_TILE(1);
            }
            for (; d < D; d++)
                for (int64_t r = r0; r < r1; r++) {
                    int32_t sum = 0;
                    for (int64_t j = 0; j < n; j++) sum += wq[r - r0][j] * ((const int8_t *) vr[j])[d];
                    acc[r * D + d] = fmaf((float) sum, ws[r - r0], acc[r * D + d]);
                }
        }
    }
}

#endif
