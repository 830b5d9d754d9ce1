/* mul_mat.c - MUL_MAT under its task profiles.
 *
 * dst[i13][i12][i11][i01] = dot(src0 row i01 of batch (i12/r2, i13/r3), src1 row i11)
 * src0: (ne00 = K, ne01 = N, ne02, ne03), any type with a vec_dot
 * src1: (ne10 = K, ne11 = M, ne12, ne13), F32; dst: (N, M, ne12, ne13), F32
 *
 * CPU profile: INIT converts src1 rows to src0's vec_dot type (into the work
 * buffer) unless they can be used as they are; COMPUTE hands out tiles of
 * TILE_N x TILE_M dot products, so a tile of src0 rows stays in cache while it
 * meets several src1 rows.
 */
#include "impl.h"

#define TILE_N 16
#define TILE_M 8

static struct ggml_py_task_profile cpu_profile(void) {
    struct ggml_py_task_profile p;
    memset(&p, 0, sizeof(p));
    p.id = GGML_PY_MUL_MAT_CPU;
    strncpy(p.name, "cpu", sizeof(p.name) - 1);
    p.stages[GGML_PY_STAGE_INIT]    = (struct ggml_py_stage_flags) { .valid = 1, .parallel = 1 };
    p.stages[GGML_PY_STAGE_COMPUTE] = (struct ggml_py_stage_flags) { .valid = 1, .parallel = 1 };
    return p;
}

int ggml_py_mul_mat_profiles(const struct ggml_py_tensor *node,
                             struct ggml_py_task_profile out[GGML_PY_MAX_PROFILES]) {
    GGML_PY_UNUSED(node);
    out[0] = cpu_profile();
    return 1;
}

int ggml_py_mul_mat_default_profile_index(const struct ggml_py_tensor *node) {
    GGML_PY_UNUSED(node);
    return 0;
}

/* src1 is read in place when it already is packed rows of the vec_dot type. */
static bool src1_needs_conversion(const struct ggml_py_tensor *node) {
    const struct ggml_py_tensor *src0 = node->src[0], *src1 = node->src[1];
    const int vec_dot_type = ggml_py_get_type_traits(src0->type)->vec_dot_type;
    return vec_dot_type != src1->type || src1->nb[0] != sizeof(float);
}

size_t ggml_py_mul_mat_work_size(const struct ggml_py_tensor *node, int n_threads) {
    GGML_PY_UNUSED(n_threads);
    const struct ggml_py_tensor *src0 = node->src[0], *src1 = node->src[1];
    if (node->profile.id == GGML_PY_MUL_MAT_CPU && src1_needs_conversion(node)) {
        const int vec_dot_type = ggml_py_get_type_traits(src0->type)->vec_dot_type;
        return ggml_py_row_size(vec_dot_type, src1->ne[0]) *
               (size_t) (src1->ne[1] * src1->ne[2] * src1->ne[3]);
    }
    return 0;
}

static void convert_src1(const struct ggml_py_compute_params *params, const struct ggml_py_tensor *dst) {
    const struct ggml_py_tensor *src1 = dst->src[1];
    GGML_PY_TENSOR_LOCALS_1(ne1, src1);
    GGML_PY_STRIDE_LOCALS_1(nb1, src1);
    const int vec_dot_type = ggml_py_get_type_traits(dst->src[0]->type)->vec_dot_type;
    const ggml_py_from_float_fn from_float = ggml_py_get_type_traits(vec_dot_type)->from_float;
    const size_t row_size = ggml_py_row_size(vec_dot_type, ne10);
    float buf[1024];   /* gathers strided rows, a whole number of blocks at a time */
    int64_t ir0, ir1;
    ggml_py_thread_rows(ne11 * ne12 * ne13, params->ith, params->nth, &ir0, &ir1);
    for (int64_t ir = ir0; ir < ir1; ir++) {
        const int64_t i11 = ir % ne11, i12 = (ir / ne11) % ne12, i13 = ir / (ne11 * ne12);
        const char *s = (const char *) src1->data + i11 * nb11 + i12 * nb12 + i13 * nb13;
        char *d = (char *) params->wdata + ir * row_size;
        if (nb10 == sizeof(float)) {
            from_float((const float *) s, d, ne10);
            continue;
        }
        for (int64_t i0 = 0; i0 < ne10; i0 += 1024) {
            const int64_t n = GGML_PY_MIN(1024, ne10 - i0);
            for (int64_t j = 0; j < n; j++) buf[j] = *(const float *) (s + (i0 + j) * nb10);
            from_float(buf, d + ggml_py_row_size(vec_dot_type, i0), n);
        }
    }
}

static void compute_cpu(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    const struct ggml_py_tensor *src0 = dst->src[0], *src1 = dst->src[1];
    GGML_PY_BINARY_LOCALS(src0, src1, dst);
    const struct ggml_py_type_traits *tt = ggml_py_get_type_traits(src0->type);
    const ggml_py_vec_dot_fn vec_dot = tt->vec_dot;
    const bool converted = src1_needs_conversion(dst);
    const size_t row_size = ggml_py_row_size(tt->vec_dot_type, ne10);
    const int64_t r2 = ne12 / ne02, r3 = ne13 / ne03;   /* broadcast factors */

    const int64_t n_rows1 = ne11 * ne12 * ne13;          /* every src1 row of every batch */
    const int64_t tiles_n = (ne01 + TILE_N - 1) / TILE_N;
    const int64_t tiles_m = (n_rows1 + TILE_M - 1) / TILE_M;
    for (int64_t tile = params->ith; tile < tiles_n * tiles_m; tile += params->nth) {
        const int64_t tn = tile % tiles_n, tm = tile / tiles_n;
        const int64_t m_end = GGML_PY_MIN((tm + 1) * TILE_M, n_rows1);
        const int64_t n_end = GGML_PY_MIN((tn + 1) * TILE_N, ne01);
        for (int64_t ir1 = tm * TILE_M; ir1 < m_end; ir1++) {
            const int64_t i11 = ir1 % ne11, i12 = (ir1 / ne11) % ne12, i13 = ir1 / (ne11 * ne12);
            const char *y = converted
                ? (const char *) params->wdata + ir1 * row_size
                : (const char *) src1->data + i11 * nb11 + i12 * nb12 + i13 * nb13;
            const char *x = (const char *) src0->data + (i12 / r2) * nb02 + (i13 / r3) * nb03;
            float *d = (float *) ((char *) dst->data + i11 * nb1 + i12 * nb2 + i13 * nb3);
            for (int64_t i01 = tn * TILE_N; i01 < n_end; i01++) {
                vec_dot(ne00, &d[i01], x + i01 * nb01, y);
            }
        }
    }
}

void ggml_py_compute_mul_mat(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    switch (params->stage) {
        case GGML_PY_STAGE_INIT:
            if (src1_needs_conversion(dst)) convert_src1(params, dst);
            break;
        case GGML_PY_STAGE_COMPUTE:
            compute_cpu(params, dst);
            break;
        default:
            break;
    }
}
