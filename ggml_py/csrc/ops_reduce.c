/* ops_reduce.c - SUM_ROWS, MEAN, ARGMAX, NORM, RMS_NORM, SOFT_MAX: one row at
 * a time, rows split over threads. Sums accumulate in double, as ggml's do
 * (RMS_NORM's in sixteen lanes: the row kernel sum_sq). */
#include "impl.h"
#include "vec.h"

#define FOR_EACH_ROW(src0)                                                            \
    int64_t ir0, ir1;                                                                 \
    ggml_py_thread_rows(ne01 * ne02 * ne03, params->ith, params->nth, &ir0, &ir1);    \
    for (int64_t ir = ir0; ir < ir1; ir++)

#define ROW_INDICES                                                                   \
    const int64_t i1 = ir % ne01, i2 = (ir / ne01) % ne02, i3 = ir / (ne01 * ne02);   \
    const char *x = (const char *) src0->data + i1 * nb01 + i2 * nb02 + i3 * nb03;    \
    GGML_PY_UNUSED(x)

static double row_sum(const char *x, int64_t n, size_t stride) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += *(const float *) (x + i * stride);
    return sum;
}

static void sum_or_mean(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst,
                        int mean) {
    if (params->stage != GGML_PY_STAGE_COMPUTE) return;
    const struct ggml_py_tensor *src0 = dst->src[0];
    GGML_PY_UNARY_LOCALS(src0, dst);
    FOR_EACH_ROW(src0) {
        ROW_INDICES;
        const double sum = row_sum(x, ne00, nb00);
        *(float *) ((char *) dst->data + i1 * nb1 + i2 * nb2 + i3 * nb3) =
            (float) (mean ? sum / (double) ne00 : sum);
    }
}

void ggml_py_compute_sum_rows(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    sum_or_mean(params, dst, 0);
}

void ggml_py_compute_mean(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    sum_or_mean(params, dst, 1);
}

void ggml_py_compute_argmax(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    if (params->stage != GGML_PY_STAGE_COMPUTE) return;
    const struct ggml_py_tensor *src0 = dst->src[0];
    GGML_PY_UNARY_LOCALS(src0, dst);
    int32_t *out = dst->data;   /* dst is contiguous: one id per source row */
    FOR_EACH_ROW(src0) {
        ROW_INDICES;
        /* as numpy: the first maximum wins, and the first NaN wins over everything */
        int32_t best = 0;
        float best_v = *(const float *) x;
        for (int64_t i = 1; i < ne00 && best_v == best_v; i++) {
            const float v = *(const float *) (x + i * nb00);
            if (v > best_v || v != v) { best_v = v; best = (int32_t) i; }
        }
        out[ir] = best;
    }
}

void ggml_py_compute_norm(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    if (params->stage != GGML_PY_STAGE_COMPUTE) return;
    const struct ggml_py_tensor *src0 = dst->src[0];
    GGML_PY_UNARY_LOCALS(src0, dst);
    const float eps = ggml_py_get_op_param_f32(dst, 0);
    FOR_EACH_ROW(src0) {
        ROW_INDICES;
        float *d = (float *) ((char *) dst->data + i1 * nb1 + i2 * nb2 + i3 * nb3);
        const float mean = (float) (row_sum(x, ne00, nb00) / (double) ne00);
        double sum2 = 0.0;
        for (int64_t i = 0; i < ne00; i++) {
            const float v = *(const float *) (x + i * nb00) - mean;
            d[i] = v;
            sum2 += (double) (v * v);
        }
        const float scale = 1.0f / sqrtf((float) (sum2 / (double) ne00) + eps);
        for (int64_t i = 0; i < ne00; i++) d[i] *= scale;
    }
}

void ggml_py_compute_rms_norm(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    if (params->stage != GGML_PY_STAGE_COMPUTE) return;
    const struct ggml_py_tensor *src0 = dst->src[0];
    GGML_PY_UNARY_LOCALS(src0, dst);
    const float eps = ggml_py_get_op_param_f32(dst, 0);
    const ggml_py_sum_sq_fn sum_sq = ggml_py_row_kernels()->sum_sq;
    float buf[1024];   /* a strided row's elements, a multiple of the lanes at a time */
    FOR_EACH_ROW(src0) {
        ROW_INDICES;
        float *d = (float *) ((char *) dst->data + i1 * nb1 + i2 * nb2 + i3 * nb3);
        double lanes[GGML_PY_SUM_SQ_LANES] = { 0 };
        if (nb00 == sizeof(float)) {
            sum_sq(ne00, (const float *) x, lanes);
        } else {
            for (int64_t i0 = 0; i0 < ne00; i0 += 1024) {
                const int64_t n = GGML_PY_MIN(1024, ne00 - i0);
                for (int64_t j = 0; j < n; j++) buf[j] = *(const float *) (x + (i0 + j) * nb00);
                sum_sq(n, buf, lanes);
            }
        }
        double sum2 = 0.0;
        for (int k = 0; k < GGML_PY_SUM_SQ_LANES; k++) sum2 += lanes[k];
        const float scale = 1.0f / sqrtf((float) (sum2 / (double) ne00) + eps);
        if (nb00 == sizeof(float)) {
            const float *xs = (const float *) x;
            for (int64_t i = 0; i < ne00; i++) d[i] = xs[i] * scale;
        } else {
            for (int64_t i = 0; i < ne00; i++) d[i] = *(const float *) (x + i * nb00) * scale;
        }
    }
}

/* softmax(x * scale + mask) per row; the mask row is (i1, i2 % ne12, i3 % ne13). */
void ggml_py_compute_soft_max(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    if (params->stage != GGML_PY_STAGE_COMPUTE) return;
    const struct ggml_py_tensor *src0 = dst->src[0], *mask = dst->src[1];
    GGML_PY_UNARY_LOCALS(src0, dst);
    const float scale = ggml_py_get_op_param_f32(dst, 0);
    const ggml_py_exp_sum_fn exp_sum = ggml_py_row_kernels()->exp_sum;
    /* this thread's scratch row in the work buffer */
    float *wp = (float *) ((char *) params->wdata +
                           params->ith * (sizeof(float) * ne00 + GGML_PY_CACHE_LINE));
    FOR_EACH_ROW(src0) {
        ROW_INDICES;
        float *d = (float *) ((char *) dst->data + i1 * nb1 + i2 * nb2 + i3 * nb3);
        for (int64_t i = 0; i < ne00; i++) wp[i] = *(const float *) (x + i * nb00) * scale;
        if (mask) {
            const char *m = (const char *) mask->data + i1 * mask->nb[1] +
                            (i2 % mask->ne[2]) * mask->nb[2] + (i3 % mask->ne[3]) * mask->nb[3];
            if (mask->type == GGML_PY_TYPE_F16) {
                for (int64_t i = 0; i < ne00; i++) wp[i] += ggml_py_fp16_to_fp32(((const ggml_py_fp16_t *) m)[i]);
            } else {
                for (int64_t i = 0; i < ne00; i++) wp[i] += ((const float *) m)[i];
            }
        }
        float max = -INFINITY;
        bool nan = false;   /* a NaN input makes the whole row NaN, as numpy's and ggml's */
        for (int64_t i = 0; i < ne00; i++) {
            max = wp[i] > max ? wp[i] : max;
            nan |= wp[i] != wp[i];
        }
        if (nan) {
            for (int64_t i = 0; i < ne00; i++) d[i] = NAN;
            continue;
        }
        const double sum = exp_sum(ne00, d, wp, max);
        /* sum 0: a fully masked row gives zeros; NaN (a +inf input): NaN, as numpy */
        const float inv = sum > 0.0 ? (float) (1.0 / sum) : sum == 0.0 ? 0.0f : NAN;
        for (int64_t i = 0; i < ne00; i++) d[i] *= inv;
    }
}
