/* dot_ref.c - scalar dot products of the quantized types with their vec_dot
 * types. Always built; the reference the AVX2 kernels must match bit for bit.
 *
 * Integer parts are exact; floats are combined in a fixed order the SIMD
 * kernels reproduce: Q4_0 and Q8_0 once per block, the other legacy types in eight lanes
 * (see ggml_py_lanes_fma), K-quants once per super-block, d * isum - dmin * summs. */
#include "quants_impl.h"

/* ---- legacy types: unpack a block to int8, then the shared lane update ---- */

static inline void unpack_q4(const uint8_t *qs, int offset, int8_t q[32]) {
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t) ((qs[j] & 0x0F) - offset);
        q[j + 16] = (int8_t) ((qs[j] >> 4) - offset);
    }
}

static inline void unpack_q5(const uint8_t *qs, const uint8_t *qh_bytes, int offset, int8_t q[32]) {
    uint32_t qh;
    memcpy(&qh, qh_bytes, sizeof(qh));
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t) (((qs[j] & 0x0F) | (((qh >> j) & 1) << 4)) - offset);
        q[j + 16] = (int8_t) (((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - offset);
    }
}

/* Q4_0 sums each block exactly, then adds it in: acc = fma(dx * dy, sum, acc),
 * block after block (the order its row-interleaved mul_mat kernel can follow). */
void ggml_py_vec_dot_q4_0_ref(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_block_q4_0 *x = vx;
    const ggml_py_block_q8_0 *y = vy;
    float acc = 0.0f;
    int8_t q[32];
    for (int64_t ib = 0; ib < n / GGML_PY_QK4_0; ib++) {
        unpack_q4(x[ib].qs, 8, q);
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += q[j] * y[ib].qs[j];
        acc = fmaf(FP16_TO_FP32(x[ib].d) * FP16_TO_FP32(y[ib].d), (float) sum, acc);
    }
    *s = acc;
}

void ggml_py_vec_dot_q4_1_ref(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_block_q4_1 *x = vx;
    const ggml_py_block_q8_1 *y = vy;
    float acc[8] = { 0 }, mins = 0.0f;
    int8_t q[32];
    for (int64_t ib = 0; ib < n / GGML_PY_QK4_1; ib++) {
        unpack_q4(x[ib].qs, 0, q);
        ggml_py_lanes_fma(acc, FP16_TO_FP32(x[ib].d) * FP16_TO_FP32(y[ib].d), q, y[ib].qs);
        mins += FP16_TO_FP32(x[ib].m) * FP16_TO_FP32(y[ib].s);
    }
    *s = ggml_py_lanes_sum(acc) + mins;
}

void ggml_py_vec_dot_q5_0_ref(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_block_q5_0 *x = vx;
    const ggml_py_block_q8_0 *y = vy;
    float acc[8] = { 0 };
    int8_t q[32];
    for (int64_t ib = 0; ib < n / GGML_PY_QK5_0; ib++) {
        unpack_q5(x[ib].qs, x[ib].qh, 16, q);
        ggml_py_lanes_fma(acc, FP16_TO_FP32(x[ib].d) * FP16_TO_FP32(y[ib].d), q, y[ib].qs);
    }
    *s = ggml_py_lanes_sum(acc);
}

void ggml_py_vec_dot_q5_1_ref(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_block_q5_1 *x = vx;
    const ggml_py_block_q8_1 *y = vy;
    float acc[8] = { 0 }, mins = 0.0f;
    int8_t q[32];
    for (int64_t ib = 0; ib < n / GGML_PY_QK5_1; ib++) {
        unpack_q5(x[ib].qs, x[ib].qh, 0, q);
        ggml_py_lanes_fma(acc, FP16_TO_FP32(x[ib].d) * FP16_TO_FP32(y[ib].d), q, y[ib].qs);
        mins += FP16_TO_FP32(x[ib].m) * FP16_TO_FP32(y[ib].s);
    }
    *s = ggml_py_lanes_sum(acc) + mins;
}

/* Q8_0 as Q4_0: each block summed exactly, then acc = fma(dx * dy, sum, acc). */
void ggml_py_vec_dot_q8_0_ref(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_block_q8_0 *x = vx;
    const ggml_py_block_q8_0 *y = vy;
    float acc = 0.0f;
    for (int64_t ib = 0; ib < n / GGML_PY_QK8_0; ib++) {
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += x[ib].qs[j] * y[ib].qs[j];
        acc = fmaf(FP16_TO_FP32(x[ib].d) * FP16_TO_FP32(y[ib].d), (float) sum, acc);
    }
    *s = acc;
}

/* ---- K-quants: exact integer sums per super-block -------------------------- */

static inline int dot16(const int8_t *q, const int8_t *q8) {
    int sum = 0;
    for (int l = 0; l < 16; l++) sum += q[l] * q8[l];
    return sum;
}

void ggml_py_vec_dot_q2_K_ref(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_block_q2_K *x = vx;
    const ggml_py_block_q8_K *y = vy;
    float sumf = 0;
    int8_t q[GGML_PY_QK_K];
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++) {
        for (int c = 0; c < 2; c++) {          /* value 128c + 32k + l: 2 bits at 2k of qs[32c + l] */
            for (int k = 0; k < 4; k++) {
                for (int l = 0; l < 32; l++) q[128 * c + 32 * k + l] = (x[i].qs[32 * c + l] >> (2 * k)) & 3;
            }
        }
        int isum = 0, summs = 0;
        for (int j = 0; j < 16; j++) {
            isum += (x[i].scales[j] & 0xF) * dot16(q + 16 * j, y[i].qs + 16 * j);
            summs += y[i].bsums[j] * (x[i].scales[j] >> 4);
        }
        const float dall = y[i].d * FP16_TO_FP32(x[i].d);
        const float dmin = y[i].d * FP16_TO_FP32(x[i].dmin);
        sumf += dall * (float) isum - dmin * (float) summs;
    }
    *s = sumf;
}

void ggml_py_vec_dot_q3_K_ref(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_block_q3_K *x = vx;
    const ggml_py_block_q8_K *y = vy;
    float sumf = 0;
    int8_t q[GGML_PY_QK_K], sc[16];
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++) {
        for (int c = 0; c < 2; c++) {
            for (int k = 0; k < 4; k++) {
                const uint8_t m = (uint8_t) (1 << (4 * c + k));
                for (int l = 0; l < 32; l++) {
                    const int lo = (x[i].qs[32 * c + l] >> (2 * k)) & 3;
                    q[128 * c + 32 * k + l] = (int8_t) (lo - ((x[i].hmask[l] & m) ? 0 : 4));
                }
            }
        }
        ggml_py_q3_K_scales(x[i].scales, sc);
        int isum = 0;
        for (int j = 0; j < 16; j++) isum += sc[j] * dot16(q + 16 * j, y[i].qs + 16 * j);
        const float d = FP16_TO_FP32(x[i].d) * y[i].d;
        sumf += d * (float) isum;
    }
    *s = sumf;
}

/* Q4_K / Q5_K: eight sub-blocks of 32 with 6-bit scales and mins. */
static inline float k4_block_sum(const ggml_py_block_q8_K *y, const int8_t *q, const uint8_t *scales,
                                 ggml_py_half d16, ggml_py_half dmin16) {
    int isum = 0, summs = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        ggml_py_get_scale_min_k4(j, scales, &sc, &m);
        isum += sc * (dot16(q + 32 * j, y->qs + 32 * j) + dot16(q + 32 * j + 16, y->qs + 32 * j + 16));
        summs += m * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
    }
    const float d = FP16_TO_FP32(d16) * y->d;
    const float dmin = FP16_TO_FP32(dmin16) * y->d;
    return d * (float) isum - dmin * (float) summs;
}

void ggml_py_vec_dot_q4_K_ref(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_block_q4_K *x = vx;
    const ggml_py_block_q8_K *y = vy;
    float sumf = 0;
    int8_t q[GGML_PY_QK_K];
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++) {
        for (int c = 0; c < 4; c++) {          /* 64 values per 32 bytes: low nibbles, then high */
            for (int l = 0; l < 32; l++) {
                q[64 * c + l] = (int8_t) (x[i].qs[32 * c + l] & 0xF);
                q[64 * c + 32 + l] = (int8_t) (x[i].qs[32 * c + l] >> 4);
            }
        }
        sumf += k4_block_sum(&y[i], q, x[i].scales, x[i].d, x[i].dmin);
    }
    *s = sumf;
}

void ggml_py_vec_dot_q5_K_ref(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_block_q5_K *x = vx;
    const ggml_py_block_q8_K *y = vy;
    float sumf = 0;
    int8_t q[GGML_PY_QK_K];
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++) {
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                const int h = x[i].qh[l];
                q[64 * c + l] = (int8_t) ((x[i].qs[32 * c + l] & 0xF) | (((h >> (2 * c)) & 1) << 4));
                q[64 * c + 32 + l] = (int8_t) ((x[i].qs[32 * c + l] >> 4) | (((h >> (2 * c + 1)) & 1) << 4));
            }
        }
        sumf += k4_block_sum(&y[i], q, x[i].scales, x[i].d, x[i].dmin);
    }
    *s = sumf;
}

void ggml_py_vec_dot_q6_K_ref(int64_t n, float *s, const void *vx, const void *vy) {
    const ggml_py_block_q6_K *x = vx;
    const ggml_py_block_q8_K *y = vy;
    float sumf = 0;
    int8_t q[GGML_PY_QK_K];
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++) {
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        for (int c = 0; c < 2; c++, ql += 64, qh += 32) {
            int8_t *qc = q + 128 * c;
            for (int l = 0; l < 32; l++) {
                qc[l] = (int8_t) (((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                qc[l + 32] = (int8_t) (((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                qc[l + 64] = (int8_t) (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                qc[l + 96] = (int8_t) (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        }
        int isum = 0;
        for (int j = 0; j < 16; j++) isum += x[i].scales[j] * dot16(q + 16 * j, y[i].qs + 16 * j);
        const float d = FP16_TO_FP32(x[i].d) * y[i].d;
        sumf += d * (float) isum;
    }
    *s = sumf;
}
