/* ops.c - per-op dispatch, default task profiles and work-buffer sizes. */
#include "impl.h"

static struct ggml_py_task_profile make_profile(int32_t id, const char *name) {
    struct ggml_py_task_profile p;
    memset(&p, 0, sizeof(p));
    p.id = id;
    strncpy(p.name, name, sizeof(p.name) - 1);
    return p;
}

static int is_view_op(int op) {
    return op == GGML_PY_OP_NONE || op == GGML_PY_OP_VIEW || op == GGML_PY_OP_RESHAPE ||
           op == GGML_PY_OP_PERMUTE || op == GGML_PY_OP_TRANSPOSE;
}

int ggml_py_op_profiles(const struct ggml_py_tensor *node,
                        struct ggml_py_task_profile out[GGML_PY_MAX_PROFILES]) {
    if (is_view_op(node->op)) {
        out[0] = make_profile(0, "none");   /* nothing to run */
        return 1;
    }
    if (node->op == GGML_PY_OP_MUL_MAT) return ggml_py_mul_mat_profiles(node, out);
    if (node->op == GGML_PY_OP_ALL_REDUCE) {
        /* MPI on the main thread; the workers sleep meanwhile (wait_now) instead of
         * spinning on cores that the MPI library and the other processes may want */
        out[0] = make_profile(0, "comm");
        out[0].stages[GGML_PY_STAGE_COMPUTE] = (struct ggml_py_stage_flags) { .valid = 1, .wait = 1 };
        return 1;
    }
    if (node->op == GGML_PY_OP_ATTENTION) return ggml_py_attention_profiles(node, out);
    out[0] = make_profile(0, "compute");
    out[0].stages[GGML_PY_STAGE_COMPUTE] = (struct ggml_py_stage_flags) { .valid = 1, .parallel = 1 };
    return 1;
}

struct ggml_py_task_profile ggml_py_default_profile(const struct ggml_py_tensor *node) {
    struct ggml_py_task_profile profiles[GGML_PY_MAX_PROFILES];
    ggml_py_op_profiles(node, profiles);
    if (node->op == GGML_PY_OP_MUL_MAT) return profiles[ggml_py_mul_mat_default_profile_index(node)];
    if (node->op == GGML_PY_OP_ATTENTION) return profiles[ggml_py_attention_default_profile_index(node)];
    return profiles[0];
}

size_t ggml_py_node_work_size(const struct ggml_py_tensor *node, int n_threads) {
    switch (node->op) {
        case GGML_PY_OP_MUL_MAT:
            return ggml_py_mul_mat_work_size(node, n_threads);
        case GGML_PY_OP_SOFT_MAX:
            /* one scratch row per thread, a cache line apart */
            return (size_t) n_threads * (sizeof(float) * node->ne[0] + GGML_PY_CACHE_LINE);
        case GGML_PY_OP_ATTENTION:
            return ggml_py_attention_work_size(node, n_threads);
        case GGML_PY_OP_ROPE:
            /* per thread: cos/sin of the current token's angles */
            return (size_t) n_threads * (sizeof(float) * node->ne[0] + GGML_PY_CACHE_LINE);
        default:
            return 0;
    }
}

void ggml_py_compute_forward(const struct ggml_py_compute_params *params, struct ggml_py_tensor *node) {
    switch (node->op) {
        case GGML_PY_OP_DUP:
        case GGML_PY_OP_CPY:
        case GGML_PY_OP_CONT:     ggml_py_compute_dup(params, node); break;
        case GGML_PY_OP_ADD:
        case GGML_PY_OP_SUB:
        case GGML_PY_OP_MUL:
        case GGML_PY_OP_DIV:      ggml_py_compute_binary(params, node); break;
        case GGML_PY_OP_SCALE:
        case GGML_PY_OP_NEG:
        case GGML_PY_OP_SQR:
        case GGML_PY_OP_SQRT:
        case GGML_PY_OP_RELU:
        case GGML_PY_OP_GELU:
        case GGML_PY_OP_SILU:     ggml_py_compute_unary(params, node); break;
        case GGML_PY_OP_SWIGLU:   ggml_py_compute_swiglu(params, node); break;
        case GGML_PY_OP_SUM_ROWS: ggml_py_compute_sum_rows(params, node); break;
        case GGML_PY_OP_MEAN:     ggml_py_compute_mean(params, node); break;
        case GGML_PY_OP_ARGMAX:   ggml_py_compute_argmax(params, node); break;
        case GGML_PY_OP_NORM:     ggml_py_compute_norm(params, node); break;
        case GGML_PY_OP_RMS_NORM: ggml_py_compute_rms_norm(params, node); break;
        case GGML_PY_OP_SOFT_MAX: ggml_py_compute_soft_max(params, node); break;
        case GGML_PY_OP_MUL_MAT:  ggml_py_compute_mul_mat(params, node); break;
        case GGML_PY_OP_GET_ROWS: ggml_py_compute_get_rows(params, node); break;
        case GGML_PY_OP_SET_ROWS: ggml_py_compute_set_rows(params, node); break;
        case GGML_PY_OP_ROPE:     ggml_py_compute_rope(params, node); break;
        case GGML_PY_OP_CONCAT:   ggml_py_compute_concat(params, node); break;
        case GGML_PY_OP_ATTENTION: ggml_py_compute_attention(params, node); break;
        case GGML_PY_OP_ALL_REDUCE: ggml_py_compute_all_reduce(params, node); break;
        default: break;           /* views and leaves: nothing to compute */
    }
}
