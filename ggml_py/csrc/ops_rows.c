/* ops_rows.c - GET_ROWS, SET_ROWS and CONCAT. Row ids are checked: an id out
 * of range stops the graph with GGML_PY_STATUS_BAD_INDEX. */
#include "attn.h"
#include "impl.h"

void ggml_py_compute_get_rows(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    if (params->stage != GGML_PY_STAGE_COMPUTE) return;
    const struct ggml_py_tensor *src0 = dst->src[0], *src1 = dst->src[1];
    GGML_PY_BINARY_LOCALS(src0, src1, dst);
    const ggml_py_to_float_fn to_float = ggml_py_get_type_traits(src0->type)->to_float;
    int64_t ir0, ir1;
    ggml_py_thread_rows(ne10 * ne11 * ne12, params->ith, params->nth, &ir0, &ir1);
    for (int64_t ir = ir0; ir < ir1; ir++) {
        const int64_t i10 = ir % ne10, i11 = (ir / ne10) % ne11, i12 = ir / (ne10 * ne11);
        const int32_t row = *(const int32_t *) ((const char *) src1->data + i10 * nb10 +
                                                i11 * nb11 + i12 * nb12);
        float *d = (float *) ((char *) dst->data + i10 * nb1 + i11 * nb2 + i12 * nb3);
        if (row < 0 || row >= ne01) {
            ggml_py_set_error(params, GGML_PY_STATUS_BAD_INDEX);
            return;
        }
        const char *s = (const char *) src0->data + row * nb01 + i11 * nb02 + i12 * nb03;
        if (nb00 == ggml_py_get_type_traits(src0->type)->type_size) {
            to_float(s, d, ne00);
        } else {
            /* strided rows (e.g. a transposed view) of any unquantized type:
             * convert one element at a time (quantized rows are always packed) */
            for (int64_t i0 = 0; i0 < ne00; i0++) to_float(s + i0 * nb00, &d[i0], 1);
        }
    }
}

/* An I8 destination: each group of op_params[0] values of a row as int8 with one scale,
 * written into src[3] (F32, one per group: ne0 = groups per row, ne1 = ne2 = dst's) at the
 * same row of the same plane. */
static void set_rows_i8(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    const struct ggml_py_tensor *src0 = dst->src[0], *src1 = dst->src[1], *scales = dst->src[3];
    GGML_PY_BINARY_LOCALS(src0, src1, dst);
    const int64_t group = dst->op_params[0];
    int64_t ir0, ir1;
    ggml_py_thread_rows(ne01 * ne02, params->ith, params->nth, &ir0, &ir1);
    for (int64_t ir = ir0; ir < ir1; ir++) {
        const int64_t i01 = ir % ne01, i02 = ir / ne01;
        const int32_t row = *(const int32_t *) ((const char *) src1->data + i01 * nb10);
        if (row < 0 || row >= ne1) {
            ggml_py_set_error(params, GGML_PY_STATUS_BAD_INDEX);
            return;
        }
        const float *s = (const float *) ((const char *) src0->data + i01 * nb01 + i02 * nb02);   /* packed rows */
        int8_t *d = (int8_t *) dst->data + row * nb1 + i02 * nb2;
        float *sc = (float *) ((char *) scales->data + row * scales->nb[1] + i02 * scales->nb[2]);
        for (int64_t i0 = 0; i0 < ne00; i0 += group) ggml_py_quantize_i8_group(s + i0, d + i0, &sc[i0 / group], group);
    }
}

/* src[0]: F32 rows to write, src[1]: I32 ids, dst: the destination's view. */
void ggml_py_compute_set_rows(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    if (params->stage != GGML_PY_STAGE_COMPUTE) return;
    if (dst->type == GGML_PY_TYPE_I8) {
        set_rows_i8(params, dst);
        return;
    }
    const struct ggml_py_tensor *src0 = dst->src[0], *src1 = dst->src[1];
    GGML_PY_BINARY_LOCALS(src0, src1, dst);
    const ggml_py_from_float_fn from_float = ggml_py_get_type_traits(dst->type)->from_float;
    int64_t ir0, ir1;
    ggml_py_thread_rows(ne01 * ne02 * ne03, params->ith, params->nth, &ir0, &ir1);
    for (int64_t ir = ir0; ir < ir1; ir++) {
        const int64_t i01 = ir % ne01, i02 = (ir / ne01) % ne02, i03 = ir / (ne01 * ne02);
        const int32_t row = *(const int32_t *) ((const char *) src1->data + i01 * nb10);
        if (row < 0 || row >= ne1) {
            ggml_py_set_error(params, GGML_PY_STATUS_BAD_INDEX);
            return;
        }
        const char *s = (const char *) src0->data + i01 * nb01 + i02 * nb02 + i03 * nb03;
        char *d = (char *) dst->data + row * nb1 + i02 * nb2 + i03 * nb3;
        if (nb00 == sizeof(float)) {
            from_float((const float *) s, d, ne00);
        } else {
            float buf[256];   /* strided source: gather pieces (a whole number of blocks) */
            for (int64_t i0 = 0; i0 < ne00; i0 += 256) {
                const int64_t n = GGML_PY_MIN(256, ne00 - i0);
                for (int64_t j = 0; j < n; j++) buf[j] = *(const float *) (s + (i0 + j) * nb00);
                from_float(buf, d + ggml_py_row_size(dst->type, i0), n);
            }
        }
    }
}

void ggml_py_compute_concat(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    if (params->stage != GGML_PY_STAGE_COMPUTE) return;
    const struct ggml_py_tensor *src0 = dst->src[0], *src1 = dst->src[1];
    GGML_PY_BINARY_LOCALS(src0, src1, dst);
    const int dim = dst->op_params[0];
    int64_t ir0, ir1;
    ggml_py_thread_rows(ne1 * ne2 * ne3, params->ith, params->nth, &ir0, &ir1);
    for (int64_t ir = ir0; ir < ir1; ir++) {
        const int64_t i1 = ir % ne1, i2 = (ir / ne1) % ne2, i3 = ir / (ne1 * ne2);
        float *d = (float *) ((char *) dst->data + i1 * nb1 + i2 * nb2 + i3 * nb3);
        for (int64_t i0 = 0; i0 < ne0; i0++) {
            int64_t idx[4] = { i0, i1, i2, i3 };
            const struct ggml_py_tensor *s = src0;
            if (idx[dim] >= src0->ne[dim]) {
                idx[dim] -= src0->ne[dim];
                s = src1;
            }
            d[i0] = *(const float *) ((const char *) s->data + idx[0] * s->nb[0] +
                                      idx[1] * s->nb[1] + idx[2] * s->nb[2] + idx[3] * s->nb[3]);
        }
    }
}
