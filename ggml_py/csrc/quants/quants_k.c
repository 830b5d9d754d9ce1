/* quants_k.c - reference quantizers and de-quantizers of the K-quants
 * (super-blocks of 256: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and of Q8_K, the
 * activation format their dot products use.
 *
 * The quantizers follow ggml's quantize_row_*_ref step for step (the scale
 * searches make_qx_quants / make_q3_quants / make_qkx2_quants, then the scales
 * quantized against a super-block scale, then the values re-quantized with
 * the scales as stored), so their bytes equal ggml's. Contraction is off in
 * this build: the float expressions round exactly as written. */
#include "quants_impl.h"

#define GROUP_MAX_EPS 1e-15f

/* Symmetric scale for n values into [-nmax, nmax - 1]; L gets value + nmax.
 * rmse_type 1 weighs each value by x^2 and searches 18 scales around the
 * first guess for the least weighted squared error. */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L, int rmse_type) {
    const float max = ggml_py_signed_absmax(x, n), amax = fabsf(max);
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t) n);
        return 0.f;
    }
    float iscale = -nmax / max;
    if (rmse_type == 0) {
        for (int i = 0; i < n; i++) {
            const int l = ggml_py_nearest_int(iscale * x[i]);
            L[i] = (int8_t) (nmax + GGML_PY_MAX(-nmax, GGML_PY_MIN(nmax - 1, l)));
        }
        return 1 / iscale;
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = ggml_py_nearest_int(iscale * x[i]);
        l = GGML_PY_MAX(-nmax, GGML_PY_MIN(nmax - 1, l));
        L[i] = (int8_t) (l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = ggml_py_nearest_int(iscale * x[i]);
            l = GGML_PY_MAX(-nmax, GGML_PY_MIN(nmax - 1, l));
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                const int l = ggml_py_nearest_int(iscale * x[i]);
                L[i] = (int8_t) (nmax + GGML_PY_MAX(-nmax, GGML_PY_MIN(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q3_K's search: a first guess, then up to 5 sweeps moving single values to
 * the level that most improves the x^2-weighted fit. */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L) {
    const float max = ggml_py_signed_absmax(x, n), amax = fabsf(max);
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t) n);
        return 0.f;
    }
    const float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = ggml_py_nearest_int(iscale * x[i]);
        l = GGML_PY_MAX(-nmax, GGML_PY_MIN(nmax - 1, l));
        L[i] = (int8_t) l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = ggml_py_nearest_int(x[i] * sl2 / slx);
                new_l = GGML_PY_MAX(-nmax, GGML_PY_MIN(nmax - 1, new_l));
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t) new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t) (L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Scale and (negated) min for n values into [0, nmax], weighted least squares
 * over nstep + 1 candidate scales (ggml's make_qkx2_quants). */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                              float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                              bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t) n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        const int l = ggml_py_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t) GGML_PY_MAX(0, GGML_PY_MIN(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = ggml_py_nearest_int(iscale * (x[i] - min));
            l = GGML_PY_MAX(0, GGML_PY_MIN(nmax, l));
            Laux[i] = (uint8_t) l;
            const float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t) n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* Pack 256 2-bit values: byte l of each 32-byte group holds four values 32 apart. */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < GGML_PY_QK_K; j += 128) {
        for (int l = 0; l < 32; l++) {
            qs[j / 4 + l] = L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6);
        }
    }
}

/* ---- Q2_K ------------------------------------------------------------------- */

void ggml_py_quantize_row_q2_K_ref(const float *x, void *vy, int64_t n) {
    ggml_py_block_q2_K *y = vy;
    uint8_t L[GGML_PY_QK_K], Laux[16];
    float weights[16], mins[16], scales[16];
    const float q4scale = 15.f;
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++, x += GGML_PY_QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++) weights[l] = fabsf(x[16 * j + l]);
            scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux,
                                         -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < 16; j++) y[i].scales[j] = (uint8_t) ggml_py_nearest_int(iscale * scales[j]);
            y[i].d = FP32_TO_FP16(max_scale / q4scale);
        } else {
            memset(y[i].scales, 0, 16);
            y[i].d = FP32_TO_FP16(0.f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < 16; j++) {
                y[i].scales[j] |= (uint8_t) (ggml_py_nearest_int(iscale * mins[j]) << 4);
            }
            y[i].dmin = FP32_TO_FP16(max_min / q4scale);
        } else {
            y[i].dmin = FP32_TO_FP16(0.f);
        }
        for (int j = 0; j < 16; j++) {
            const float d = FP16_TO_FP32(y[i].d) * (y[i].scales[j] & 0xF);
            if (!d) continue;
            const float dm = FP16_TO_FP32(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ii++) {
                const int l = ggml_py_nearest_int((x[16 * j + ii] + dm) / d);
                L[16 * j + ii] = (uint8_t) GGML_PY_MAX(0, GGML_PY_MIN(3, l));
            }
        }
        pack_2bit(L, y[i].qs);
    }
}

void ggml_py_dequantize_row_q2_K(const void *vx, float *y, int64_t n) {
    const ggml_py_block_q2_K *x = vx;
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++) {
        const float d = FP16_TO_FP32(x[i].d), min = FP16_TO_FP32(x[i].dmin);
        const uint8_t *q = x[i].qs;
        int is = 0;
        for (int c = 0; c < GGML_PY_QK_K; c += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int half = 0; half < 2; half++) {
                    const uint8_t sc = x[i].scales[is++];
                    const float dl = d * (sc & 0xF), ml = min * (sc >> 4);
                    for (int l = 0; l < 16; l++) *y++ = dl * ((q[l + 16 * half] >> shift) & 3) - ml;
                }
            }
        }
    }
}

/* ---- Q3_K ------------------------------------------------------------------- */

void ggml_py_quantize_row_q3_K_ref(const float *x, void *vy, int64_t n) {
    ggml_py_block_q3_K *y = vy;
    int8_t L[GGML_PY_QK_K];
    float scales[16];
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++, x += GGML_PY_QK_K) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
            const float scale = fabsf(scales[j]);
            if (scale > amax) {
                amax = scale;
                max_scale = scales[j];
            }
        }
        memset(y[i].scales, 0, 12);
        if (max_scale) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < 16; j++) {
                int8_t l = (int8_t) ggml_py_nearest_int(iscale * scales[j]);
                l = (int8_t) (GGML_PY_MAX(-32, GGML_PY_MIN(31, l)) + 32);
                if (j < 8) {
                    y[i].scales[j] = l & 0xF;
                } else {
                    y[i].scales[j - 8] |= (uint8_t) ((l & 0xF) << 4);
                }
                l >>= 4;
                y[i].scales[j % 4 + 8] |= (uint8_t) (l << (2 * (j / 4)));
            }
            y[i].d = FP32_TO_FP16(1 / iscale);
        } else {
            y[i].d = FP32_TO_FP16(0.f);
        }
        int8_t sc[16];
        ggml_py_q3_K_scales(y[i].scales, sc);
        for (int j = 0; j < 16; j++) {
            const float d = FP16_TO_FP32(y[i].d) * sc[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) {
                const int l = ggml_py_nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t) (GGML_PY_MAX(-4, GGML_PY_MIN(3, l)) + 4);
            }
        }
        /* high bits: bit b of hmask[m] belongs to value 32 * b + m */
        memset(y[i].hmask, 0, 32);
        int m = 0;
        uint8_t hm = 1;
        for (int j = 0; j < GGML_PY_QK_K; j++) {
            if (L[j] > 3) {
                y[i].hmask[m] |= hm;
                L[j] -= 4;
            }
            if (++m == 32) {
                m = 0;
                hm <<= 1;
            }
        }
        pack_2bit((const uint8_t *) L, y[i].qs);
    }
}

void ggml_py_dequantize_row_q3_K(const void *vx, float *y, int64_t n) {
    const ggml_py_block_q3_K *x = vx;
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++) {
        const float d_all = FP16_TO_FP32(x[i].d);
        int8_t sc[16];
        ggml_py_q3_K_scales(x[i].scales, sc);
        const uint8_t *q = x[i].qs, *hm = x[i].hmask;
        uint8_t m = 1;
        int is = 0;
        for (int c = 0; c < GGML_PY_QK_K; c += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
                for (int half = 0; half < 2; half++) {
                    const float dl = d_all * sc[is++];
                    for (int l = 16 * half; l < 16 * half + 16; l++) {
                        *y++ = dl * ((int8_t) ((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
                    }
                }
            }
        }
    }
}

/* ---- Q4_K and Q5_K ---------------------------------------------------------- */

/* Shared first half of Q4_K / Q5_K: per 32 a scale and min (nmax 15 or 31),
 * both quantized to 6 bits against the block's d and dmin. Fills L. */
static void quantize_k4_scales(const float *x, int nmax, float rmin, int nstep, uint8_t *L,
                               ggml_py_half *yd, ggml_py_half *ydmin, uint8_t *yscales) {
    uint8_t Laux[32];
    float weights[32], mins[8], scales[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                     rmin, 0.1f, nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < 8; j++) {
        uint8_t ls = (uint8_t) ggml_py_nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t) ggml_py_nearest_int(inv_min * mins[j]);
        ls = GGML_PY_MIN(63, ls);
        lm = GGML_PY_MIN(63, lm);
        if (j < 4) {
            yscales[j] = ls;
            yscales[j + 4] = lm;
        } else {
            yscales[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            yscales[j - 4] |= (uint8_t) ((ls >> 4) << 6);
            yscales[j] |= (uint8_t) ((lm >> 4) << 6);
        }
    }
    *yd = FP32_TO_FP16(max_scale / 63.f);
    *ydmin = FP32_TO_FP16(max_min / 63.f);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        ggml_py_get_scale_min_k4(j, yscales, &sc, &m);
        const float d = FP16_TO_FP32(*yd) * sc;
        if (!d) continue;
        const float dm = FP16_TO_FP32(*ydmin) * m;
        for (int ii = 0; ii < 32; ii++) {
            const int l = ggml_py_nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t) GGML_PY_MAX(0, GGML_PY_MIN(nmax, l));
        }
    }
}

void ggml_py_quantize_row_q4_K_ref(const float *x, void *vy, int64_t n) {
    ggml_py_block_q4_K *y = vy;
    uint8_t L[GGML_PY_QK_K];
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++, x += GGML_PY_QK_K) {
        quantize_k4_scales(x, 15, -1.f, 20, L, &y[i].d, &y[i].dmin, y[i].scales);
        uint8_t *q = y[i].qs;
        for (int j = 0; j < GGML_PY_QK_K; j += 64, q += 32) {
            for (int l = 0; l < 32; l++) q[l] = L[j + l] | (L[j + l + 32] << 4);
        }
    }
}

void ggml_py_q4_K_interleave_rows8(const void *src, void *dst, int64_t n_rows, int64_t n) {
    ggml_py_interleave_words_rows8(src, dst, n_rows, n / GGML_PY_QK_K, sizeof(ggml_py_block_q4_K), 4);
}

void ggml_py_q5_K_interleave_rows8(const void *src, void *dst, int64_t n_rows, int64_t n) {
    ggml_py_interleave_words_rows8(src, dst, n_rows, n / GGML_PY_QK_K, sizeof(ggml_py_block_q5_K), 4);
}

void ggml_py_q6_K_interleave_rows8(const void *src, void *dst, int64_t n_rows, int64_t n) {
    const int64_t nb = n / GGML_PY_QK_K;
    const ggml_py_block_q6_K *x = src;
    uint8_t *out = dst;
    for (int64_t g = 0; g < n_rows / 8; g++) {
        for (int64_t b = 0; b < nb; b++, out += 8 * sizeof(ggml_py_block_q6_K)) {
            for (int r = 0; r < 8; r++) {
                const ggml_py_block_q6_K *xb = x + (8 * g + r) * nb + b;
                for (int k = 0; k < 4; k++) memcpy(out + 32 * k + 4 * r, xb->scales + 4 * k, 4);
                memcpy(out + 128 + 2 * r, &xb->d, 2);
                for (int h = 0; h < 2; h++) {
                    for (int j = 0; j < 8; j++) {   /* the words of four values of each kind */
                        uint8_t *o = out + 144 + 96 * (8 * h + j) + 4 * r;
                        memcpy(o, xb->ql + 64 * h + 4 * j, 4);
                        memcpy(o + 32, xb->ql + 64 * h + 32 + 4 * j, 4);
                        memcpy(o + 64, xb->qh + 32 * h + 4 * j, 4);
                    }
                }
            }
        }
    }
}

void ggml_py_dequantize_row_q4_K(const void *vx, float *y, int64_t n) {
    const ggml_py_block_q4_K *x = vx;
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++) {
        const uint8_t *q = x[i].qs;
        const float d = FP16_TO_FP32(x[i].d), min = FP16_TO_FP32(x[i].dmin);
        for (int is = 0; is < 8; is += 2, q += 32) {
            uint8_t sc, m;
            ggml_py_get_scale_min_k4(is, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            ggml_py_get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

void ggml_py_quantize_row_q5_K_ref(const float *x, void *vy, int64_t n) {
    ggml_py_block_q5_K *y = vy;
    uint8_t L[GGML_PY_QK_K];
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++, x += GGML_PY_QK_K) {
        quantize_k4_scales(x, 31, -0.5f, 15, L, &y[i].d, &y[i].dmin, y[i].scales);
        uint8_t *qh = y[i].qh, *ql = y[i].qs;
        memset(qh, 0, 32);
        uint8_t m1 = 1, m2 = 2;
        for (int c = 0; c < GGML_PY_QK_K; c += 64, ql += 32, m1 <<= 2, m2 <<= 2) {
            for (int j = 0; j < 32; j++) {
                int l1 = L[c + j], l2 = L[c + j + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = (uint8_t) (l1 | (l2 << 4));
            }
        }
    }
}

void ggml_py_dequantize_row_q5_K(const void *vx, float *y, int64_t n) {
    const ggml_py_block_q5_K *x = vx;
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++) {
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        const float d = FP16_TO_FP32(x[i].d), min = FP16_TO_FP32(x[i].dmin);
        uint8_t u1 = 1, u2 = 2;
        for (int is = 0; is < 8; is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
            uint8_t sc, m;
            ggml_py_get_scale_min_k4(is, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            ggml_py_get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

/* ---- Q6_K ------------------------------------------------------------------- */

void ggml_py_quantize_row_q6_K_ref(const float *x, void *vy, int64_t n) {
    ggml_py_block_q6_K *y = vy;
    int8_t L[GGML_PY_QK_K];
    float scales[16];
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++, x += GGML_PY_QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < 16; ib++) {
            scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1);
            const float abs_scale = fabsf(scales[ib]);
            if (abs_scale > max_abs_scale) {
                max_abs_scale = abs_scale;
                max_scale = scales[ib];
            }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        const float iscale = -128.f / max_scale;
        y[i].d = FP32_TO_FP16(1 / iscale);
        for (int ib = 0; ib < 16; ib++) {
            y[i].scales[ib] = (int8_t) GGML_PY_MIN(127, ggml_py_nearest_int(iscale * scales[ib]));
        }
        for (int j = 0; j < 16; j++) {
            const float d = FP16_TO_FP32(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) {
                const int l = ggml_py_nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t) (GGML_PY_MAX(-32, GGML_PY_MIN(31, l)) + 32);
            }
        }
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < GGML_PY_QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
                const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
                ql[l] = q1 | (q3 << 4);
                ql[l + 32] = q2 | (q4 << 4);
                qh[l] = (L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                        ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6);
            }
        }
    }
}

void ggml_py_dequantize_row_q6_K(const void *vx, float *y, int64_t n) {
    const ggml_py_block_q6_K *x = vx;
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++) {
        const float d = FP16_TO_FP32(x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int c = 0; c < GGML_PY_QK_K; c += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * sc[is] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}

/* ---- Q8_K ------------------------------------------------------------------- */

void ggml_py_quantize_row_q8_K_ref(const float *x, void *vy, int64_t n) {
    ggml_py_block_q8_K *y = vy;
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++, x += GGML_PY_QK_K) {
        const float max = ggml_py_signed_absmax(x, GGML_PY_QK_K), amax = fabsf(max);
        if (!amax) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        /* -127 (not -128) keeps every value in [-127, 127] */
        const float iscale = -127.f / max;
        for (int j = 0; j < GGML_PY_QK_K; j++) {
            y[i].qs[j] = (int8_t) GGML_PY_MIN(127, ggml_py_nearest_int(iscale * x[j]));
        }
        for (int j = 0; j < 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t) sum;
        }
        y[i].d = 1 / iscale;
    }
}

void ggml_py_dequantize_row_q8_K(const void *vx, float *y, int64_t n) {
    const ggml_py_block_q8_K *x = vx;
    for (int64_t i = 0; i < n / GGML_PY_QK_K; i++, y += GGML_PY_QK_K) {
        for (int j = 0; j < GGML_PY_QK_K; j++) y[j] = x[i].d * x[i].qs[j];
    }
}
