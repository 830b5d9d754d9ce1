/* attn.h - the kernels of the ATTENTION op, one set per KV cache type (not a contract).
 *
 * A work item of the op is a block of nr query rows that read the same keys: the query
 * heads of one kv head, for one or a few tokens of one sequence. Its keys and values
 * are the rows of that kv head at the slots of one list; key j of the list lies at
 * slot slots[j]. The kernels (attn_ref.c: scalar twins, always built; attn_avx2.c) are
 *
 *   q_prep  one query row (D floats) in the form the K kernel reads: F32 K: as it is;
 *           F16 K: rounded to F16 (as MUL_MAT converts activations); Q8_0 / Q4_0 K: Q8_0
 *           blocks; I8 K: int8 with one scale (the cache's own quantizer) and the
 *           values' sum
 *   scores  S[r * lds + j - j0] = scale * dot(q_r, k_j) for r < nr, j0 <= j < j0 + nk
 *   pv      acc[r * D + d] += sum over j of P[r * ldp + j - j0] * v_j[d], j ascending (I8:
 *           in integers, below)
 *
 * Every (row, key) score and every (row, element) sum is computed by the same operations
 * in the same order whichever tile of a kernel computes it, and the SIMD kernels do the
 * scalar twins' operations: the bits of a row depend on its query and its keys and values
 * only, never on the other rows of the item, and the twins agree bit for bit. A float
 * dot product keeps eight lanes (element d in lane d % 8, fused multiply-adds), summed
 * as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), then the D % 8 last elements
 * one by one; the Q8_0 / Q4_0 dots keep lane l = the integer dot of elements 4l..4l+3
 * of each block, times the two block scales; the I8 dot is one exact integer sum.
 */
#ifndef GGML_PY_ATTN_H
#define GGML_PY_ATTN_H

#include <float.h>
#include <stddef.h>
#include <stdint.h>

#include "ggml_py.h"

/* The rows of one kv head in a cache pool, in list order. */
struct ggml_py_attn_rows {
    const char *base;          /* the pool's data, at this head's first element */
    size_t stride;             /* bytes from one slot to the next */
    const char *scale;         /* I8 pools: the scale of this head at slot 0 (else NULL) */
    size_t scale_stride;
    const int32_t *slots;      /* the list */
    int64_t n_slots;           /* its length (a kernel given part of it may prefetch past its part) */
    int32_t type;              /* the pool's enum ggml_py_type */
    int32_t row_bytes;         /* bytes of one head's row */
};

static inline const char *ggml_py_attn_row(const struct ggml_py_attn_rows *x, int64_t j) {
    return x->base + (int64_t) x->slots[j] * x->stride;
}

/* row j of the list asked into the L1 cache (nothing past the list's end) */
static inline void ggml_py_attn_prefetch_row(const struct ggml_py_attn_rows *x, int64_t j) {
    if (j >= x->n_slots) return;
    const char *row = ggml_py_attn_row(x, j);
    for (int32_t o = 0; o < x->row_bytes; o += 64) __builtin_prefetch(row + o, 0, 3);
}

static inline float ggml_py_attn_row_scale(const struct ggml_py_attn_rows *x, int64_t j) {
    float s;
    __builtin_memcpy(&s, x->scale + (int64_t) x->slots[j] * x->scale_stride, sizeof(s));
    return s;
}

typedef void (*ggml_py_attn_q_prep_fn)(int k_type, int64_t D, const float *q, void *out);
typedef void (*ggml_py_attn_scores_fn)(int64_t D, int64_t nr, const void *q, size_t q_stride,
                                       const struct ggml_py_attn_rows *k, int64_t j0, int64_t nk,
                                       float *S, int64_t lds, float scale);
typedef void (*ggml_py_attn_pv_fn)(int64_t D, int64_t nr, const float *P, int64_t ldp,
                                   const struct ggml_py_attn_rows *v, int64_t j0, int64_t nk,
                                   float *acc);
/* x[j] = exp(x[j] - max) for j < n; returns their sum (lanes j % 8, then the tail) */
typedef float (*ggml_py_attn_exp_sum_fn)(int64_t n, float *x, float max);
/* the largest of x[0 .. n - 1] that is not NaN (-inf if none; lanes j % 8, then the tail) */
typedef float (*ggml_py_attn_max_fn)(int64_t n, const float *x);

struct ggml_py_attn_kernels {
    ggml_py_attn_q_prep_fn q_prep;     /* by the K type */
    ggml_py_attn_scores_fn scores;     /* by the K type */
    ggml_py_attn_pv_fn pv;             /* by the V type */
};

/* I8 values are summed in integers. In each block of GGML_PY_ATTN_I8_KEYS keys (from j0),
 * row r's weights w_j = P[r][j] * (value row j's scale) are rounded to int16 on the
 * block's own scale: wq_j = nearest(w_j * (32767 / m)), m the largest w_j, ws = m / 32767
 * (all wq_j 0 when m is 0, or so small that 32767 / m overflows: such a block adds nothing,
 * see ggml_py_attn_i8_factor); then acc[r][d] = fma((float) sum_j wq_j * v_j[d], ws,
 * acc[r][d]), the sum exact in int32. A block with a weight that is not finite gives NaN. */
#define GGML_PY_ATTN_I8_KEYS 64
#define GGML_PY_ATTN_I8_WMAX 32767.0f

/* 32767 / m, a block's weights' factor to int16; 0 where that is not finite (m is 0, or
 * below 32767 / FLT_MAX), so that every path rounds such a block to zeros alike */
static inline float ggml_py_attn_i8_factor(float m) {
    const float iw = m > 0.0f ? GGML_PY_ATTN_I8_WMAX / m : 0.0f;
    return iw <= FLT_MAX ? iw : 0.0f;
}

/* A row's int16 weights wq of n <= GGML_PY_ATTN_I8_KEYS keys of a block, as above: p its
 * probabilities, sv the value rows' scales; returns the block's scale ws. */
float ggml_py_attn_i8_weights(const float *p, const float *sv, int64_t n, int16_t *wq);

/* Bytes of one prepared query row (any K type), a multiple of 64. */
static inline size_t ggml_py_attn_q_bytes(int64_t D) {
    return ((size_t) D * sizeof(float) + 64 + 63) / 64 * 64;
}

/* The K-side kernels of k_type and the V-side kernels of v_type in use (SIMD, or the
 * twins when forced): a type without kernels of its own gets the generic ones, which
 * read it through its traits (vec_dot, to_float). */
void ggml_py_attn_kernels_for(int k_type, int v_type, struct ggml_py_attn_kernels *out);
ggml_py_attn_exp_sum_fn ggml_py_attn_exp_sum(void);
ggml_py_attn_max_fn ggml_py_attn_max(void);
/* simd = 0: the scalar twins; 1: the SIMD kernels where built (called by select_kernels) */
void ggml_py_attn_kernels_select(int simd);

/* The types with kernels of their own (the KV cache types). */
#define GGML_PY_ATTN_TYPES(X) X(f32, F32) X(f16, F16) X(q8_0, Q8_0) X(q4_0, Q4_0) X(i8, I8)

#define GGML_PY_ATTN_DECLARE(t, T)                                                           \
    void ggml_py_attn_q_prep_##t(int k_type, int64_t D, const float *q, void *out);          \
    void ggml_py_attn_scores_##t##_ref(int64_t D, int64_t nr, const void *q, size_t q_stride, \
        const struct ggml_py_attn_rows *k, int64_t j0, int64_t nk, float *S, int64_t lds,     \
        float scale);                                                                          \
    void ggml_py_attn_scores_##t##_avx2(int64_t D, int64_t nr, const void *q, size_t q_stride,\
        const struct ggml_py_attn_rows *k, int64_t j0, int64_t nk, float *S, int64_t lds,     \
        float scale);                                                                          \
    void ggml_py_attn_pv_##t##_ref(int64_t D, int64_t nr, const float *P, int64_t ldp,        \
        const struct ggml_py_attn_rows *v, int64_t j0, int64_t nk, float *acc);               \
    void ggml_py_attn_pv_##t##_avx2(int64_t D, int64_t nr, const float *P, int64_t ldp,       \
        const struct ggml_py_attn_rows *v, int64_t j0, int64_t nk, float *acc);
GGML_PY_ATTN_TYPES(GGML_PY_ATTN_DECLARE)
#undef GGML_PY_ATTN_DECLARE

float ggml_py_attn_exp_sum_ref(int64_t n, float *x, float max);
float ggml_py_attn_exp_sum_avx2(int64_t n, float *x, float max);
float ggml_py_attn_max_ref(int64_t n, const float *x);
float ggml_py_attn_max_avx2(int64_t n, const float *x);

/* The int8 quantizer of I8 caches: x (n) -> q (n) with x ~ q * *d, d = max|x| / 127
 * (symmetric, one scale per group; rounding to nearest, ties to even). */
void ggml_py_quantize_i8_group(const float *x, int8_t *q, float *d, int64_t n);

/* tree8: the eight lanes of a float dot product summed in the kernels' one order */
static inline float ggml_py_attn_tree8(const float l[8]) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* exp(x) by the kernels' one formula (scalar; attn_avx2.c has the same on 8 lanes):
 * x = k ln2 + r, exp(r) by its Taylor polynomial to r^7, 2^k in the exponent bits;
 * below -87.3 (and -inf) 0, above ln(FLT_MAX) +inf. */
float ggml_py_attn_exp_ref(float x);

#endif /* GGML_PY_ATTN_H */
