/* ops_copy.c - DUP, CONT, CPY: any layout to any layout, converting through f32
 * with the type traits (to_float / from_float) when types differ. */
#include "impl.h"

/* Element (i0..i3) of an unquantized tensor as float. */
static inline float load_f32(const struct ggml_py_tensor *t, const char *p) {
    switch (t->type) {
        case GGML_PY_TYPE_F32:  return *(const float *) p;
        case GGML_PY_TYPE_F16:  return ggml_py_fp16_to_fp32(*(const ggml_py_fp16_t *) p);
        case GGML_PY_TYPE_BF16: return ggml_py_bf16_to_fp32(*(const ggml_py_bf16_t *) p);
        default:                return 0.0f;
    }
}

/* One element of es bytes; the common sizes as single moves. */
static inline void copy_elem(char *d, const char *s, size_t es) {
    switch (es) {
        case 1: *(uint8_t *) d = *(const uint8_t *) s; break;
        case 2: *(uint16_t *) d = *(const uint16_t *) s; break;
        case 4: *(uint32_t *) d = *(const uint32_t *) s; break;
        case 8: memcpy(d, s, 8); break;
        default: memcpy(d, s, es); break;
    }
}

/* Element v as dst's type; the Python layer allows conversions between
 * F32/F16/BF16 only (other types copy bits, see same_type below). */
static inline void store_f32(const struct ggml_py_tensor *t, char *p, float v) {
    switch (t->type) {
        case GGML_PY_TYPE_F32:  *(float *) p = v; break;
        case GGML_PY_TYPE_F16:  *(ggml_py_fp16_t *) p = ggml_py_fp32_to_fp16(v); break;
        case GGML_PY_TYPE_BF16: *(ggml_py_bf16_t *) p = ggml_py_fp32_to_bf16(v); break;
        default: break;
    }
}

/* Row ir (rows counted over dims 1..3, outermost slowest) of t. */
static inline const char *row_ptr(const struct ggml_py_tensor *t, int64_t ir) {
    const int64_t i1 = ir % t->ne[1], i2 = (ir / t->ne[1]) % t->ne[2];
    const int64_t i3 = ir / (t->ne[1] * t->ne[2]);
    return (const char *) t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

void ggml_py_compute_dup(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    if (params->stage != GGML_PY_STAGE_COMPUTE) return;
    const struct ggml_py_tensor *src0 = dst->src[0];
    GGML_PY_UNARY_LOCALS(src0, dst);
    const struct ggml_py_type_traits *ts = ggml_py_get_type_traits(src0->type);
    const struct ggml_py_type_traits *td = ggml_py_get_type_traits(dst->type);
    const int64_t n_elems = ne00 * ne01 * ne02 * ne03;

    /* dst rows are walked in dst's own index order; the source is read in its
     * own order, element k of the flattened tensor in both. */
    const int64_t nr = ne1 * ne2 * ne3;
    int64_t ir0, ir1;
    ggml_py_thread_rows(nr, params->ith, params->nth, &ir0, &ir1);

    const bool same_rows = ne00 == ne0 && src0->type == dst->type;
    const bool rows_packed = nb00 == ts->type_size && nb0 == td->type_size;
    /* With equal row lengths, row ir of dst is row ir of src0, but the outer
     * shapes may differ (a (4, 3) -> (2, 2, 3) copy), so each side splits ir
     * into its own indices. */
    if (same_rows && rows_packed) {
        /* same row shape: copy row by row, any outer strides */
        const size_t row = ggml_py_row_size(dst->type, ne0);
        for (int64_t ir = ir0; ir < ir1; ir++) {
            memcpy((char *) row_ptr(dst, ir), row_ptr(src0, ir), row);
        }
        return;
    }
    if (ne00 == ne0 && rows_packed && ts->to_float && td->from_float) {
        /* same row shape, other type: convert through floats on the stack, in
         * pieces of 1024 (a whole number of blocks of every type) */
        float buf[1024];
        for (int64_t ir = ir0; ir < ir1; ir++) {
            const char *s = row_ptr(src0, ir);
            char *d = (char *) row_ptr(dst, ir);
            for (int64_t i0 = 0; i0 < ne0; i0 += 1024) {
                const int64_t n = GGML_PY_MIN(1024, ne0 - i0);
                ts->to_float(s + ggml_py_row_size(src0->type, i0), buf, n);
                td->from_float(buf, d + ggml_py_row_size(dst->type, i0), n);
            }
        }
        return;
    }
    if (ne00 == ne0 && ne01 == ne1 && ne02 == ne2 && ne03 == ne3 && ts->blck_size == 1) {
        /* same shape, strided (e.g. CONT of a permuted view): walk both by
         * index, no flattening; same type moves bits, no conversion */
        const size_t es = ts->type_size;
        const bool same_type = src0->type == dst->type;
        for (int64_t ir = ir0; ir < ir1; ir++) {
            const int64_t i1 = ir % ne1, i2 = (ir / ne1) % ne2, i3 = ir / (ne1 * ne2);
            const char *s = (const char *) src0->data + i1 * nb01 + i2 * nb02 + i3 * nb03;
            char *d = (char *) dst->data + i1 * nb1 + i2 * nb2 + i3 * nb3;
            if (same_type && es == 2) {
                for (int64_t i0 = 0; i0 < ne0; i0++)
                    *(uint16_t *) (d + i0 * nb0) = *(const uint16_t *) (s + i0 * nb00);
            } else if (same_type && es == 4) {
                for (int64_t i0 = 0; i0 < ne0; i0++)
                    *(uint32_t *) (d + i0 * nb0) = *(const uint32_t *) (s + i0 * nb00);
            } else if (same_type) {
                for (int64_t i0 = 0; i0 < ne0; i0++) copy_elem(d + i0 * nb0, s + i0 * nb00, es);
            } else {
                for (int64_t i0 = 0; i0 < ne0; i0++)
                    store_f32(dst, d + i0 * nb0, load_f32(src0, s + i0 * nb00));
            }
        }
        return;
    }
    /* general case: element k of src goes to element k of dst (bits when the
     * types are equal, else F32/F16/BF16 conversions; the Python layer keeps
     * quantized tensors on the paths above) */
    const bool same_type = src0->type == dst->type;
    const size_t es = ts->type_size;
    for (int64_t ir = ir0; ir < ir1; ir++) {
        const int64_t i1 = ir % ne1, i2 = (ir / ne1) % ne2, i3 = ir / (ne1 * ne2);
        for (int64_t i0 = 0; i0 < ne0; i0++) {
            const int64_t k = ((i3 * ne2 + i2) * ne1 + i1) * ne0 + i0;
            if (k >= n_elems) return;
            const int64_t j0 = k % ne00, j1 = (k / ne00) % ne01;
            const int64_t j2 = (k / (ne00 * ne01)) % ne02, j3 = k / (ne00 * ne01 * ne02);
            const char *s = (const char *) src0->data + j0 * nb00 + j1 * nb01 + j2 * nb02 +
                            j3 * nb03;
            char *d = (char *) dst->data + i0 * nb0 + i1 * nb1 + i2 * nb2 + i3 * nb3;
            if (same_type) copy_elem(d, s, es);
            else store_f32(dst, d, load_f32(src0, s));
        }
    }
}
