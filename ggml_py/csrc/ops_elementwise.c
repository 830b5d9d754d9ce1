/* ops_elementwise.c - ADD/SUB/MUL/DIV with ggml broadcasting, the unary ops and
 * SWIGLU. Inputs may be strided; dst is contiguous. Work is split by rows. */
#include "impl.h"
#include "vec.h"

static inline float apply_binary(int op, float x, float y) {
    switch (op) {
        case GGML_PY_OP_ADD: return x + y;
        case GGML_PY_OP_SUB: return x - y;
        case GGML_PY_OP_MUL: return x * y;
        default:             return x / y;
    }
}

void ggml_py_compute_binary(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    if (params->stage != GGML_PY_STAGE_COMPUTE) return;
    const struct ggml_py_tensor *src0 = dst->src[0], *src1 = dst->src[1];
    GGML_PY_BINARY_LOCALS(src0, src1, dst);
    const int op = dst->op;
    int64_t ir0, ir1;
    ggml_py_thread_rows(ne01 * ne02 * ne03, params->ith, params->nth, &ir0, &ir1);
    for (int64_t ir = ir0; ir < ir1; ir++) {
        const int64_t i1 = ir % ne01, i2 = (ir / ne01) % ne02, i3 = ir / (ne01 * ne02);
        const char *x = (const char *) src0->data + i1 * nb01 + i2 * nb02 + i3 * nb03;
        const char *y = (const char *) src1->data + (i1 % ne11) * nb11 + (i2 % ne12) * nb12 +
                        (i3 % ne13) * nb13;
        float *d = (float *) ((char *) dst->data + i1 * nb1 + i2 * nb2 + i3 * nb3);
        if (nb00 == sizeof(float) && nb10 == sizeof(float) && ne10 == ne00) {
            const float *xf = (const float *) x, *yf = (const float *) y;
            switch (op) {  /* hoisted so each loop vectorises */
                case GGML_PY_OP_ADD: for (int64_t i = 0; i < ne0; i++) d[i] = xf[i] + yf[i]; break;
                case GGML_PY_OP_SUB: for (int64_t i = 0; i < ne0; i++) d[i] = xf[i] - yf[i]; break;
                case GGML_PY_OP_MUL: for (int64_t i = 0; i < ne0; i++) d[i] = xf[i] * yf[i]; break;
                default:             for (int64_t i = 0; i < ne0; i++) d[i] = xf[i] / yf[i]; break;
            }
        } else {
            for (int64_t i0 = 0; i0 < ne0; i0++) {
                const float xv = *(const float *) (x + i0 * nb00);
                const float yv = *(const float *) (y + (i0 % ne10) * nb10);
                d[i0] = apply_binary(op, xv, yv);
            }
        }
    }
}

#define GELU_COEF_A    0.044715f
#define SQRT_2_OVER_PI 0.79788456080286535587989211986876f

static inline float gelu_f32(float x) {
    /* as ggml: 0 from -10 down (-inf too, where the formula gives inf * 0), x from 10 up */
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * x * (1.0f + GELU_COEF_A * x * x)));
}

static inline float silu_f32(float x) {
    return x / (1.0f + expf(-x));
}

void ggml_py_compute_unary(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    if (params->stage != GGML_PY_STAGE_COMPUTE) return;
    const struct ggml_py_tensor *src0 = dst->src[0];
    GGML_PY_UNARY_LOCALS(src0, dst);
    const int op = dst->op;
    const float s = op == GGML_PY_OP_SCALE ? ggml_py_get_op_param_f32(dst, 0) : 0.0f;
    int64_t ir0, ir1;
    ggml_py_thread_rows(ne01 * ne02 * ne03, params->ith, params->nth, &ir0, &ir1);
    for (int64_t ir = ir0; ir < ir1; ir++) {
        const int64_t i1 = ir % ne01, i2 = (ir / ne01) % ne02, i3 = ir / (ne01 * ne02);
        const char *x = (const char *) src0->data + i1 * nb01 + i2 * nb02 + i3 * nb03;
        float *d = (float *) ((char *) dst->data + i1 * nb1 + i2 * nb2 + i3 * nb3);
        for (int64_t i0 = 0; i0 < ne0; i0++) {
            const float v = *(const float *) (x + i0 * nb00);
            float r;
            switch (op) {
                case GGML_PY_OP_SCALE: r = v * s; break;
                case GGML_PY_OP_NEG:   r = -v; break;
                case GGML_PY_OP_SQR:   r = v * v; break;
                case GGML_PY_OP_SQRT:  r = sqrtf(v); break;
                case GGML_PY_OP_RELU:  r = v > 0.0f ? v : 0.0f; break;
                case GGML_PY_OP_GELU:  r = gelu_f32(v); break;
                default:               r = silu_f32(v); break;
            }
            d[i0] = r;
        }
    }
}

void ggml_py_compute_swiglu(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    if (params->stage != GGML_PY_STAGE_COMPUTE) return;
    const struct ggml_py_tensor *src0 = dst->src[0], *src1 = dst->src[1];
    GGML_PY_BINARY_LOCALS(src0, src1, dst);
    const ggml_py_swiglu_fn swiglu = ggml_py_row_kernels()->swiglu;
    int64_t ir0, ir1;
    ggml_py_thread_rows(ne01 * ne02 * ne03, params->ith, params->nth, &ir0, &ir1);
    for (int64_t ir = ir0; ir < ir1; ir++) {
        const int64_t i1 = ir % ne01, i2 = (ir / ne01) % ne02, i3 = ir / (ne01 * ne02);
        const char *x = (const char *) src0->data + i1 * nb01 + i2 * nb02 + i3 * nb03;
        const char *g = (const char *) src1->data + i1 * nb11 + i2 * nb12 + i3 * nb13;
        float *d = (float *) ((char *) dst->data + i1 * nb1 + i2 * nb2 + i3 * nb3);
        if (nb00 == sizeof(float) && nb10 == sizeof(float)) {
            swiglu(ne0, d, (const float *) x, (const float *) g);
            continue;
        }
        for (int64_t i0 = 0; i0 < ne0; i0++) {
            d[i0] = silu_f32(*(const float *) (x + i0 * nb00)) * *(const float *) (g + i0 * nb10);
        }
    }
}
