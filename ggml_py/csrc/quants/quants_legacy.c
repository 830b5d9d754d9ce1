/* quants_legacy.c - reference quantizers and de-quantizers of the 32-element
 * block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1), and the scalar twins of the
 * Q8_0 / Q8_1 activation quantizers.
 *
 * The quantizers are bit-identical to ggml's quantize_row_*_ref: same scale
 * choice, same float expressions in the same order, same rounding (truncation
 * after +0.5 / +8.5 / +16.5, or roundf). The build disables floating-point
 * contraction so no compiler fuses a multiply and an add behind our back. */
#include "quants_impl.h"

/* A float's integer part, as x86's truncating conversion gives it (what ggml's casts
 * compile to), defined in C for every input: a NaN — which a row holding NaN or inf
 * produces below — or a value past int32 gives INT32_MIN, whose low byte is 0. The
 * casts to 8 bits that follow keep the low byte (gcc's rule). Finite rows never get
 * here with a value outside the 8-bit range, so their blocks do not change. */
static inline int32_t trunc_i32(float v) {
    return (v > -2147483648.0f && v < 2147483648.0f) ? (int32_t) v : INT32_MIN;
}

/* The element of largest magnitude, first one on ties (sign kept). */
static inline void min_max(const float *x, int n, float *min, float *max) {
    *min = FLT_MAX;
    *max = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < *min) *min = x[j];
        if (x[j] > *max) *max = x[j];
    }
}

void ggml_py_quantize_row_q4_0_ref(const float *x, void *vy, int64_t n) {
    ggml_py_block_q4_0 *y = vy;
    for (int64_t i = 0; i < n / GGML_PY_QK4_0; i++, x += GGML_PY_QK4_0) {
        const float d = ggml_py_signed_absmax(x, GGML_PY_QK4_0) / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = FP32_TO_FP16(d);
        for (int j = 0; j < 16; j++) {
            const uint8_t q0 = GGML_PY_MIN(15, (int8_t) trunc_i32(x[j] * id + 8.5f));
            const uint8_t q1 = GGML_PY_MIN(15, (int8_t) trunc_i32(x[j + 16] * id + 8.5f));
            y[i].qs[j] = q0 | (q1 << 4);
        }
    }
}

void ggml_py_quantize_row_q4_1_ref(const float *x, void *vy, int64_t n) {
    ggml_py_block_q4_1 *y = vy;
    for (int64_t i = 0; i < n / GGML_PY_QK4_1; i++, x += GGML_PY_QK4_1) {
        float min, max;
        min_max(x, GGML_PY_QK4_1, &min, &max);
        const float d = (max - min) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = FP32_TO_FP16(d);
        y[i].m = FP32_TO_FP16(min);
        for (int j = 0; j < 16; j++) {
            const uint8_t q0 = GGML_PY_MIN(15, (int8_t) trunc_i32((x[j] - min) * id + 0.5f));
            const uint8_t q1 = GGML_PY_MIN(15, (int8_t) trunc_i32((x[j + 16] - min) * id + 0.5f));
            y[i].qs[j] = q0 | (q1 << 4);
        }
    }
}

void ggml_py_quantize_row_q5_0_ref(const float *x, void *vy, int64_t n) {
    ggml_py_block_q5_0 *y = vy;
    for (int64_t i = 0; i < n / GGML_PY_QK5_0; i++, x += GGML_PY_QK5_0) {
        const float d = ggml_py_signed_absmax(x, GGML_PY_QK5_0) / -16;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = FP32_TO_FP16(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            const uint8_t q0 = GGML_PY_MIN(31, (int8_t) trunc_i32(x[j] * id + 16.5f));
            const uint8_t q1 = GGML_PY_MIN(31, (int8_t) trunc_i32(x[j + 16] * id + 16.5f));
            y[i].qs[j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4);
            qh |= ((q0 & 0x10u) >> 4) << j;
            qh |= ((q1 & 0x10u) >> 4) << (j + 16);
        }
        memcpy(y[i].qh, &qh, sizeof(qh));
    }
}

void ggml_py_quantize_row_q5_1_ref(const float *x, void *vy, int64_t n) {
    ggml_py_block_q5_1 *y = vy;
    for (int64_t i = 0; i < n / GGML_PY_QK5_1; i++, x += GGML_PY_QK5_1) {
        float min, max;
        min_max(x, GGML_PY_QK5_1, &min, &max);
        const float d = (max - min) / 31;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = FP32_TO_FP16(d);
        y[i].m = FP32_TO_FP16(min);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            const uint8_t q0 = (uint8_t) trunc_i32((x[j] - min) * id + 0.5f);
            const uint8_t q1 = (uint8_t) trunc_i32((x[j + 16] - min) * id + 0.5f);
            y[i].qs[j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4);
            qh |= ((q0 & 0x10u) >> 4) << j;
            qh |= ((q1 & 0x10u) >> 4) << (j + 16);
        }
        memcpy(y[i].qh, &qh, sizeof(qh));
    }
}

void ggml_py_quantize_row_q8_0_ref(const float *x, void *vy, int64_t n) {
    ggml_py_block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / GGML_PY_QK8_0; i++, x += GGML_PY_QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < GGML_PY_QK8_0; j++) amax = GGML_PY_MAX(amax, fabsf(x[j]));
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = FP32_TO_FP16(d);
        for (int j = 0; j < GGML_PY_QK8_0; j++) y[i].qs[j] = (int8_t) trunc_i32(roundf(x[j] * id));
    }
}

void ggml_py_quantize_row_q8_1_ref(const float *x, void *vy, int64_t n) {
    ggml_py_block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / GGML_PY_QK8_1; i++, x += GGML_PY_QK8_1) {
        float amax = 0.0f;
        for (int j = 0; j < GGML_PY_QK8_1; j++) amax = GGML_PY_MAX(amax, fabsf(x[j]));
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = FP32_TO_FP16(d);
        int sum = 0;
        for (int j = 0; j < GGML_PY_QK8_1; j++) {
            y[i].qs[j] = (int8_t) trunc_i32(roundf(x[j] * id));
            sum += y[i].qs[j];
        }
        y[i].s = FP32_TO_FP16(sum * d);
    }
}

/* Q8_0 / Q8_1 rows made while computing (MUL_MAT's activations, CPY into Q8_0):
 * llama.cpp's CPU backend on x86 scales by 127 / amax and rounds to nearest even
 * where ggml's reference quantizers above (what files are written with) use 1 / d
 * and roundf — a few quants in ten thousand differ. These are the scalar twins of
 * the SIMD activation quantizers, so ggml_py's activations are llama.cpp's. */
static float quantize_block_act(const float *x, int8_t *q, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) amax = GGML_PY_MAX(amax, fabsf(x[j]));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int j = 0; j < n; j++) q[j] = (int8_t) trunc_i32(nearbyintf(x[j] * id));
    return amax / 127;
}

void ggml_py_quantize_row_q8_0_act_ref(const float *x, void *vy, int64_t n) {
    ggml_py_block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / GGML_PY_QK8_0; i++, x += GGML_PY_QK8_0) {
        y[i].d = FP32_TO_FP16(quantize_block_act(x, y[i].qs, GGML_PY_QK8_0));
    }
}

void ggml_py_quantize_row_q8_1_act_ref(const float *x, void *vy, int64_t n) {
    ggml_py_block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / GGML_PY_QK8_1; i++, x += GGML_PY_QK8_1) {
        const float d = quantize_block_act(x, y[i].qs, GGML_PY_QK8_1);
        int sum = 0;
        for (int j = 0; j < GGML_PY_QK8_1; j++) sum += y[i].qs[j];
        y[i].d = FP32_TO_FP16(d);
        y[i].s = FP32_TO_FP16(sum * d);
    }
}

void ggml_py_dequantize_row_q4_0(const void *vx, float *y, int64_t n) {
    const ggml_py_block_q4_0 *x = vx;
    for (int64_t i = 0; i < n / GGML_PY_QK4_0; i++, y += GGML_PY_QK4_0) {
        const float d = FP16_TO_FP32(x[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = ((x[i].qs[j] & 0x0F) - 8) * d;
            y[j + 16] = ((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

void ggml_py_q4_0_interleave_rows8(const void *src, void *dst, int64_t n_rows, int64_t n) {
    ggml_py_interleave_words_rows8(src, dst, n_rows, n / GGML_PY_QK4_0, sizeof(ggml_py_block_q4_0), 2);
}

void ggml_py_dequantize_row_q4_1(const void *vx, float *y, int64_t n) {
    const ggml_py_block_q4_1 *x = vx;
    for (int64_t i = 0; i < n / GGML_PY_QK4_1; i++, y += GGML_PY_QK4_1) {
        const float d = FP16_TO_FP32(x[i].d), m = FP16_TO_FP32(x[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = (x[i].qs[j] & 0x0F) * d + m;
            y[j + 16] = (x[i].qs[j] >> 4) * d + m;
        }
    }
}

void ggml_py_dequantize_row_q5_0(const void *vx, float *y, int64_t n) {
    const ggml_py_block_q5_0 *x = vx;
    for (int64_t i = 0; i < n / GGML_PY_QK5_0; i++, y += GGML_PY_QK5_0) {
        const float d = FP16_TO_FP32(x[i].d);
        uint32_t qh;
        memcpy(&qh, x[i].qh, sizeof(qh));
        for (int j = 0; j < 16; j++) {
            const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            y[j] = (((x[i].qs[j] & 0x0F) | h0) - 16) * d;
            y[j + 16] = (((x[i].qs[j] >> 4) | h1) - 16) * d;
        }
    }
}

void ggml_py_dequantize_row_q5_1(const void *vx, float *y, int64_t n) {
    const ggml_py_block_q5_1 *x = vx;
    for (int64_t i = 0; i < n / GGML_PY_QK5_1; i++, y += GGML_PY_QK5_1) {
        const float d = FP16_TO_FP32(x[i].d), m = FP16_TO_FP32(x[i].m);
        uint32_t qh;
        memcpy(&qh, x[i].qh, sizeof(qh));
        for (int j = 0; j < 16; j++) {
            const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            y[j] = ((x[i].qs[j] & 0x0F) | h0) * d + m;
            y[j + 16] = ((x[i].qs[j] >> 4) | h1) * d + m;
        }
    }
}

void ggml_py_dequantize_row_q8_0(const void *vx, float *y, int64_t n) {
    const ggml_py_block_q8_0 *x = vx;
    for (int64_t i = 0; i < n / GGML_PY_QK8_0; i++, y += GGML_PY_QK8_0) {
        const float d = FP16_TO_FP32(x[i].d);
        for (int j = 0; j < GGML_PY_QK8_0; j++) y[j] = x[i].qs[j] * d;
    }
}

void ggml_py_dequantize_row_q8_1(const void *vx, float *y, int64_t n) {
    const ggml_py_block_q8_1 *x = vx;
    for (int64_t i = 0; i < n / GGML_PY_QK8_1; i++, y += GGML_PY_QK8_1) {
        const float d = FP16_TO_FP32(x[i].d);
        for (int j = 0; j < GGML_PY_QK8_1; j++) y[j] = x[i].qs[j] * d;
    }
}
