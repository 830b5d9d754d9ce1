/* quants_impl.h - helpers shared by the quant kernels (not a contract). */
#ifndef GGML_PY_QUANTS_IMPL_H
#define GGML_PY_QUANTS_IMPL_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "impl.h"
#include "ggml_py_quants.h"

#define FP16_TO_FP32(h) ggml_py_fp16_to_fp32(h)
#define FP32_TO_FP16(f) ggml_py_fp32_to_fp16(f)

/* Round to nearest, ties to even, through the float mantissa (ggml's
 * nearest_int; valid for |f| < 2^22, which every caller guarantees). */
static inline int ggml_py_nearest_int(float f) {
    const float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, sizeof(i));
    return (i & 0x007fffff) - 0x00400000;
}

/* The legacy dot products other than Q4_0's and Q8_0's (those sum block by
 * block) accumulate in eight float lanes: lane k holds the running sum over
 * blocks of d * (integer dot of elements 4k..4k+3). That is the lane layout of
 * the AVX2 kernels (maddubs + madd), so the scalar twins and the SIMD kernels
 * agree bit for bit. This is the order the AVX2 horizontal sum
 * adds the lanes in. */
static inline float ggml_py_lanes_sum(const float acc[8]) {
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

static inline void ggml_py_lanes_fma(float acc[8], float d, const int8_t *qx, const int8_t *qy) {
    for (int k = 0; k < 8; k++) {
        const int s = qx[4 * k] * qy[4 * k] + qx[4 * k + 1] * qy[4 * k + 1] +
                      qx[4 * k + 2] * qy[4 * k + 2] + qx[4 * k + 3] * qy[4 * k + 3];
        acc[k] = fmaf(d, (float) s, acc[k]);
    }
}

/* 6-bit scale j and min j of a Q4_K / Q5_K block's 12 packed bytes. */
static inline void ggml_py_get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* 16 signed 6-bit scales of a Q3_K block (value - 32 already applied). */
static inline void ggml_py_q3_K_scales(const uint8_t *packed, int8_t out[16]) {
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
        const int hi = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (int8_t) ((lo | (hi << 4)) - 32);
    }
}

/* The value of largest magnitude (the first one on ties), sign kept. */
static inline float ggml_py_signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

/* Eight rows' blocks of `block` bytes side by side (a rows8 layout, include/ggml_py_quants.h):
 * for each fp16 half of the block's first `head` bytes the eight rows' halves (16 bytes),
 * then each later 32-bit word for the eight rows (32 bytes). n_rows a multiple of 8, nb
 * blocks a row. */
static inline void ggml_py_interleave_words_rows8(const void *src, void *dst, int64_t n_rows, int64_t nb,
                                                  size_t block, size_t head) {
    const uint8_t *x = src;
    uint8_t *out = dst;
    const size_t words = (block - head) / 4;
    for (int64_t g = 0; g < n_rows / 8; g++) {
        for (int64_t b = 0; b < nb; b++, out += 8 * block) {
            for (int r = 0; r < 8; r++) {
                const uint8_t *xb = x + ((8 * g + r) * nb + b) * block;
                for (size_t h = 0; h < head; h += 2) memcpy(out + 8 * h + 2 * r, xb + h, 2);
                for (size_t k = 0; k < words; k++) memcpy(out + 8 * head + 32 * k + 4 * r, xb + head + 4 * k, 4);
            }
        }
    }
}

#endif /* GGML_PY_QUANTS_IMPL_H */
