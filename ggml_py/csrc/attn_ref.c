/* attn_ref.c - the attention kernels' scalar twins (always built), the query
 * preparation of each K type, the generic kernels of other types, the int8 quantizer of
 * I8 caches, and the table the op reads its kernels from. The order of every sum is the
 * one attn.h states; attn_avx2.c does the same operations on eight lanes. */
#include <math.h>

#include "attn.h"
#include "impl.h"
#include "ggml_py_quants.h"
#include "quants_impl.h"
#include "simd.h"

/* ---- exp and the softmax numerators ---------------------------------------------- */

float ggml_py_attn_exp_ref(float x) {
    if (isnan(x)) return x;
    const float lo = -87.3f, hi = 88.72283935546875f;
    const int underflow = x < lo, overflow = x > hi;
    x = x < lo ? lo : (x > hi ? hi : x);
    float k = nearbyintf(x * 1.44269504088896341f);       /* ties to even, as round_ps */
    float r = fmaf(-k, 0.693359375f, x);                   /* ln2, high part */
    r = fmaf(-k, -2.12194440e-4f, r);                      /* ln2, low part */
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    if (k > 127.5f) {          /* 2^128 has no exponent bits: 2^127, and p doubled */
        k -= 1.0f;
        p = p + p;
    }
    const uint32_t bits = (uint32_t) ((int32_t) k + 127) << 23;
    float two_k;
    memcpy(&two_k, &bits, sizeof(two_k));
    const float e = underflow ? 0.0f : p * two_k;
    return overflow ? INFINITY : e;
}

float ggml_py_attn_exp_sum_ref(int64_t n, float *x, float max) {
    float lanes[8] = { 0 };
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        for (int l = 0; l < 8; l++) {
            x[j + l] = ggml_py_attn_exp_ref(x[j + l] - max);
            lanes[l] = lanes[l] + x[j + l];
        }
    }
    float sum = ggml_py_attn_tree8(lanes);
    for (; j < n; j++) {
        x[j] = ggml_py_attn_exp_ref(x[j] - max);
        sum = sum + x[j];
    }
    return sum;
}

/* the softmax's max: lanes j % 8, then the lanes in order, then the tail; a comparison
 * keeps the larger (NaN never wins; of -0 and +0 the one met first) */
float ggml_py_attn_max_ref(int64_t n, const float *x) {
    float lanes[8], max = -INFINITY;
    for (int l = 0; l < 8; l++) lanes[l] = -INFINITY;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) lanes[l] = x[j + l] > lanes[l] ? x[j + l] : lanes[l];
    for (int l = 0; l < 8; l++) max = lanes[l] > max ? lanes[l] : max;
    for (; j < n; j++) max = x[j] > max ? x[j] : max;
    return max;
}

/* ---- the int8 quantizer of I8 caches and queries ------------------------------------- */

void ggml_py_quantize_i8_group(const float *x, int8_t *q, float *d, int64_t n) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    const float scale = amax / 127.0f;
    const float id = scale != 0.0f ? 1.0f / scale : 0.0f;
    for (int64_t i = 0; i < n; i++) q[i] = (int8_t) ggml_py_nearest_int(x[i] * id);
    *d = scale;
}

/* ---- query preparation (one per K type; not twinned: a row per item) ------------------ */

void ggml_py_attn_q_prep_f32(int k_type, int64_t D, const float *q, void *out) {
    GGML_PY_UNUSED(k_type);
    memcpy(out, q, sizeof(float) * D);
}

void ggml_py_attn_q_prep_f16(int k_type, int64_t D, const float *q, void *out) {
    GGML_PY_UNUSED(k_type);
    float *y = out;
    int64_t d = 0;
#if defined(__F16C__)
    for (; d + 8 <= D; d += 8)     /* the same rounding as the scalar conversions, 8 at a time */
        _mm256_storeu_ps(y + d, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(q + d), _MM_FROUND_TO_NEAREST_INT)));
#endif
    for (; d < D; d++) y[d] = ggml_py_fp16_to_fp32(ggml_py_fp32_to_fp16(q[d]));
}

void ggml_py_attn_q_prep_q8_0(int k_type, int64_t D, const float *q, void *out) {
    GGML_PY_UNUSED(k_type);
    ggml_py_get_type_traits(GGML_PY_TYPE_Q8_0)->from_float(q, out, D);
}

void ggml_py_attn_q_prep_q4_0(int k_type, int64_t D, const float *q, void *out) {
    GGML_PY_UNUSED(k_type);
    ggml_py_attn_q_prep_q8_0(k_type, D, q, out);
}

/* I8: the scale (a float) at byte 0, the sum of the values (an int32) at byte 4, the int8
 * values from byte 32, zeros up to a multiple of 32 (the SIMD kernel reads whole vectors
 * of the query; the sum is what its unsigned operand adds, attn_avx2.c) */
void ggml_py_attn_q_prep_i8(int k_type, int64_t D, const float *q, void *out) {
    GGML_PY_UNUSED(k_type);
    int8_t *qs = (int8_t *) out + 32;
    float d;
    int32_t sum = 0;
    ggml_py_quantize_i8_group(q, qs, &d, D);
    for (int64_t i = 0; i < D; i++) sum += qs[i];
    memcpy(out, &d, sizeof(d));
    memcpy((char *) out + 4, &sum, sizeof(sum));
    memset(qs + D, 0, (size_t) ((D + 31) / 32 * 32 - D));
}

/* ---- element readers of the twins -------------------------------------------------- */

static inline float f32_at(const char *row, int64_t d) {
    float v;
    memcpy(&v, row + 4 * d, sizeof(v));
    return v;
}

static inline float f16_at(const char *row, int64_t d) {
    ggml_py_fp16_t h;
    memcpy(&h, row + 2 * d, sizeof(h));
    return ggml_py_fp16_to_fp32(h);
}

/* ---- scores ---------------------------------------------------------------------- */

#define FLOAT_SCORES_REF(t, AT)                                                                  \
void ggml_py_attn_scores_##t##_ref(int64_t D, int64_t nr, const void *q, size_t q_stride,       \
                                   const struct ggml_py_attn_rows *k, int64_t j0, int64_t nk,    \
                                   float *S, int64_t lds, float scale) {                         \
    const int64_t D8 = D & ~(int64_t) 7;                                                         \
    for (int64_t r = 0; r < nr; r++) {                                                           \
        const float *qr = (const float *) ((const char *) q + r * q_stride);                     \
        for (int64_t j = 0; j < nk; j++) {                                                       \
            const char *kr = ggml_py_attn_row(k, j0 + j);                                        \
            float lanes[8] = { 0 };                                                              \
            for (int64_t d = 0; d < D8; d += 8)                                                  \
                for (int l = 0; l < 8; l++) lanes[l] = fmaf(qr[d + l], AT(kr, d + l), lanes[l]); \
            float s = ggml_py_attn_tree8(lanes);                                                 \
            for (int64_t d = D8; d < D; d++) s = fmaf(qr[d], AT(kr, d), s);                      \
            S[r * lds + j] = s * scale;                                                          \
        }                                                                                        \
    }                                                                                            \
}
FLOAT_SCORES_REF(f32, f32_at)
FLOAT_SCORES_REF(f16, f16_at)

/* Q4_0 values of one block, as signed bytes (q - 8) in element order */
static inline void q4_0_values(const ggml_py_block_q4_0 *b, int8_t out[32]) {
    for (int e = 0; e < 16; e++) {
        out[e] = (int8_t) ((b->qs[e] & 0xF) - 8);
        out[e + 16] = (int8_t) ((b->qs[e] >> 4) - 8);
    }
}

void ggml_py_attn_scores_q8_0_ref(int64_t D, int64_t nr, const void *q, size_t q_stride,
                                  const struct ggml_py_attn_rows *k, int64_t j0, int64_t nk,
                                  float *S, int64_t lds, float scale) {
    for (int64_t r = 0; r < nr; r++) {
        const ggml_py_block_q8_0 *qb = (const void *) ((const char *) q + r * q_stride);
        for (int64_t j = 0; j < nk; j++) {
            const ggml_py_block_q8_0 *kb = (const void *) ggml_py_attn_row(k, j0 + j);
            float lanes[8] = { 0 };
            for (int64_t b = 0; b < D / 32; b++)
                ggml_py_lanes_fma(lanes, FP16_TO_FP32(kb[b].d) * FP16_TO_FP32(qb[b].d), kb[b].qs, qb[b].qs);
            S[r * lds + j] = ggml_py_attn_tree8(lanes) * scale;
        }
    }
}

void ggml_py_attn_scores_q4_0_ref(int64_t D, int64_t nr, const void *q, size_t q_stride,
                                  const struct ggml_py_attn_rows *k, int64_t j0, int64_t nk,
                                  float *S, int64_t lds, float scale) {
    for (int64_t r = 0; r < nr; r++) {
        const ggml_py_block_q8_0 *qb = (const void *) ((const char *) q + r * q_stride);
        for (int64_t j = 0; j < nk; j++) {
            const ggml_py_block_q4_0 *kb = (const void *) ggml_py_attn_row(k, j0 + j);
            float lanes[8] = { 0 };
            int8_t kv[32];
            for (int64_t b = 0; b < D / 32; b++) {
                q4_0_values(&kb[b], kv);
                ggml_py_lanes_fma(lanes, FP16_TO_FP32(kb[b].d) * FP16_TO_FP32(qb[b].d), kv, qb[b].qs);
            }
            S[r * lds + j] = ggml_py_attn_tree8(lanes) * scale;
        }
    }
}

void ggml_py_attn_scores_i8_ref(int64_t D, int64_t nr, const void *q, size_t q_stride,
                                const struct ggml_py_attn_rows *k, int64_t j0, int64_t nk,
                                float *S, int64_t lds, float scale) {
    for (int64_t r = 0; r < nr; r++) {
        const char *qr = (const char *) q + r * q_stride;
        const int8_t *qs = (const int8_t *) qr + 32;
        float dq;
        memcpy(&dq, qr, sizeof(dq));
        for (int64_t j = 0; j < nk; j++) {
            const int8_t *ks = (const int8_t *) ggml_py_attn_row(k, j0 + j);
            int32_t isum = 0;   /* exact: |sum| <= 127 * 127 * D */
            for (int64_t d = 0; d < D; d++) isum += (int32_t) qs[d] * ks[d];
            S[r * lds + j] = (float) isum * (dq * ggml_py_attn_row_scale(k, j0 + j)) * scale;
        }
    }
}

/* ---- scores times V ---------------------------------------------------------------- */

/* acc[r][d] += P[r][j] * (value d of row j: VALUE(vr, d)), j ascending for each (r, d) */
#define PV_REF(t, VALUE)                                                                          \
void ggml_py_attn_pv_##t##_ref(int64_t D, int64_t nr, const float *P, int64_t ldp,               \
                               const struct ggml_py_attn_rows *v, int64_t j0, int64_t nk,         \
                               float *acc) {                                                      \
    for (int64_t r = 0; r < nr; r++) {                                                            \
        float *a = acc + r * D;                                                                   \
        for (int64_t j = 0; j < nk; j++) {                                                        \
            const char *vr = ggml_py_attn_row(v, j0 + j);                                         \
            const float p = P[r * ldp + j];                                                       \
            for (int64_t d = 0; d < D; d++) a[d] = fmaf(p, VALUE(vr, d), a[d]);                  \
        }                                                                                         \
    }                                                                                             \
}

static inline float q8_0_value(const char *vr, int64_t d) {
    const ggml_py_block_q8_0 *b = (const ggml_py_block_q8_0 *) vr + d / 32;
    return (float) b->qs[d % 32] * FP16_TO_FP32(b->d);
}

static inline float q4_0_value(const char *vr, int64_t d) {
    const ggml_py_block_q4_0 *b = (const ggml_py_block_q4_0 *) vr + d / 32;
    const int e = (int) (d % 32);
    const int nib = e < 16 ? (b->qs[e] & 0xF) : (b->qs[e - 16] >> 4);
    return (float) (nib - 8) * FP16_TO_FP32(b->d);
}

PV_REF(f32, f32_at)
PV_REF(f16, f16_at)
PV_REF(q8_0, q8_0_value)
PV_REF(q4_0, q4_0_value)

float ggml_py_attn_i8_weights(const float *p, const float *sv, int64_t n, int16_t *wq) {
    float w[GGML_PY_ATTN_I8_KEYS], m = 0.0f;
    int finite = 1;
    for (int64_t j = 0; j < n; j++) {
        w[j] = p[j] * sv[j];
        finite = finite && isfinite(w[j]);
        m = w[j] > m ? w[j] : m;
    }
    if (!finite) {
        memset(wq, 0, sizeof(int16_t) * (size_t) n);
        return NAN;
    }
    const float iw = ggml_py_attn_i8_factor(m);
    for (int64_t j = 0; j < n; j++) wq[j] = (int16_t) ggml_py_nearest_int(w[j] * iw);
    return m / GGML_PY_ATTN_I8_WMAX;
}

void ggml_py_attn_pv_i8_ref(int64_t D, int64_t nr, const float *P, int64_t ldp,
                            const struct ggml_py_attn_rows *v, int64_t j0, int64_t nk, float *acc) {
    float sv[GGML_PY_ATTN_I8_KEYS];
    int16_t wq[GGML_PY_ATTN_I8_KEYS];
    for (int64_t jb = 0; jb < nk; jb += GGML_PY_ATTN_I8_KEYS) {
        const int64_t n = GGML_PY_MIN(GGML_PY_ATTN_I8_KEYS, nk - jb);
        for (int64_t j = 0; j < n; j++) sv[j] = ggml_py_attn_row_scale(v, j0 + jb + j);
        for (int64_t r = 0; r < nr; r++) {
            const float ws = ggml_py_attn_i8_weights(P + r * ldp + jb, sv, n, wq);
            for (int64_t d = 0; d < D; d++) {
                int32_t sum = 0;   /* exact: |sum| <= 64 * 32767 * 127 */
                for (int64_t j = 0; j < n; j++) sum += wq[j] * ((const int8_t *) ggml_py_attn_row(v, j0 + jb + j))[d];
                acc[r * D + d] = fmaf((float) sum, ws, acc[r * D + d]);
            }
        }
    }
}

/* ---- generic kernels: any type with a vec_dot (K) or a to_float (V) ---------------------- */

/* the query in the K type's vec_dot type, as MUL_MAT converts its activations */
static void q_prep_generic(int k_type, int64_t D, const float *q, void *out) {
    const int32_t dot_type = ggml_py_get_type_traits(k_type)->vec_dot_type;
    ggml_py_get_type_traits(dot_type)->from_float(q, out, D);
}

static void scores_generic(int64_t D, int64_t nr, const void *q, size_t q_stride,
                           const struct ggml_py_attn_rows *k, int64_t j0, int64_t nk,
                           float *S, int64_t lds, float scale) {
    const ggml_py_vec_dot_fn vec_dot = ggml_py_get_type_traits(k->type)->vec_dot;
    for (int64_t r = 0; r < nr; r++) {
        for (int64_t j = 0; j < nk; j++) {
            float s;
            vec_dot(D, &s, ggml_py_attn_row(k, j0 + j), (const char *) q + r * q_stride);
            S[r * lds + j] = s * scale;
        }
    }
}

static void pv_generic(int64_t D, int64_t nr, const float *P, int64_t ldp,
                       const struct ggml_py_attn_rows *v, int64_t j0, int64_t nk, float *acc) {
    const struct ggml_py_type_traits *vt = ggml_py_get_type_traits(v->type);
    float buf[256];    /* pieces of a row: whole blocks (256 is a multiple of every block) */
    for (int64_t j = 0; j < nk; j++) {
        const char *vr = ggml_py_attn_row(v, j0 + j);
        for (int64_t d0 = 0; d0 < D; d0 += 256) {
            const int64_t n = GGML_PY_MIN(256, D - d0);
            vt->to_float(vr + ggml_py_row_size(v->type, d0), buf, n);
            for (int64_t r = 0; r < nr; r++) {
                const float p = P[r * ldp + j];
                float *a = acc + r * D + d0;
                for (int64_t d = 0; d < n; d++) a[d] = fmaf(p, buf[d], a[d]);
            }
        }
    }
}

/* ---- the table ------------------------------------------------------------------------ */

struct kernel_row {
    int32_t type;
    ggml_py_attn_q_prep_fn q_prep;
    ggml_py_attn_scores_fn scores_ref, scores_simd;
    ggml_py_attn_pv_fn pv_ref, pv_simd;
};

#if defined(GGML_PY_HAVE_AVX2)
#define ATTN_SIMD(fn) fn##_avx2
#else
#define ATTN_SIMD(fn) NULL
#endif

#define KERNEL_ROW(t, T) { GGML_PY_TYPE_##T, ggml_py_attn_q_prep_##t,                             \
    ggml_py_attn_scores_##t##_ref, ATTN_SIMD(ggml_py_attn_scores_##t),                             \
    ggml_py_attn_pv_##t##_ref, ATTN_SIMD(ggml_py_attn_pv_##t) },
static const struct kernel_row kernel_rows[] = { GGML_PY_ATTN_TYPES(KERNEL_ROW) };
#undef KERNEL_ROW

static int use_simd = 0;

void ggml_py_attn_kernels_select(int simd) { use_simd = simd; }

ggml_py_attn_exp_sum_fn ggml_py_attn_exp_sum(void) {
#if defined(GGML_PY_HAVE_AVX2)
    if (use_simd) return ggml_py_attn_exp_sum_avx2;
#endif
    return ggml_py_attn_exp_sum_ref;
}

ggml_py_attn_max_fn ggml_py_attn_max(void) {
#if defined(GGML_PY_HAVE_AVX2)
    if (use_simd) return ggml_py_attn_max_avx2;
#endif
    return ggml_py_attn_max_ref;
}

static const struct kernel_row *row_of(int type) {
    for (size_t i = 0; i < sizeof(kernel_rows) / sizeof(kernel_rows[0]); i++)
        if (kernel_rows[i].type == type) return &kernel_rows[i];
    return NULL;
}

void ggml_py_attn_kernels_for(int k_type, int v_type, struct ggml_py_attn_kernels *out) {
    const struct kernel_row *k = row_of(k_type), *v = row_of(v_type);
    out->q_prep = k ? k->q_prep : q_prep_generic;
    out->scores = k ? (use_simd && k->scores_simd ? k->scores_simd : k->scores_ref) : scores_generic;
    out->pv = v ? (use_simd && v->pv_simd ? v->pv_simd : v->pv_ref) : pv_generic;
}
