/* ops_attention.c - ATTENTION: softmax(scale * q k^T) v over a list of cache slots per token.
 *
 * q:        F32 (ne0 = D, ne1 = H, ne2 = T), rows of D contiguous
 * k, v:     the cache pools, (ne0 = Hkv*D, ne1 = slots), F32/F16 or any type with a
 *           vec_dot (k) and a to_float (v); query head h reads kv head h / (H / Hkv)
 * kv_index: I32, 2*T + N values: for token t the pair (start, count) at [2t, 2t+1] names
 *           the slots it attends to, index[start .. start+count), which lie in the N
 *           values after the pairs (tokens of one sequence share one list, in position order)
 * dst:      F32 (ne0 = D, ne1 = H, ne2 = T); a token with no slots gets zeros
 *
 * A work item is (token, kv head): the query heads sharing that kv head read each K and
 * V row once. Each item is computed by one thread start to end, in slot-list order, so a
 * token's result depends on its own query row and slots only - not on the other tokens
 * of the batch, the thread count or which thread ran it (batches are bitwise invariant).
 */
#include "impl.h"
#include "vec.h"

/* Per-thread scratch, in floats: the G converted query rows (rounded up to floats),
 * G score rows of up to n_slots, a dequantised V row and G output accumulators. */
static size_t attention_thread_floats(const struct ggml_py_tensor *node) {
    const struct ggml_py_tensor *q = node->src[0], *k = node->src[1];
    const int64_t D = q->ne[0], H = q->ne[1], Hkv = k->ne[0] / D, G = H / Hkv;
    const int32_t dot_type = ggml_py_get_type_traits(k->type)->vec_dot_type;
    const size_t q_row = (ggml_py_row_size(dot_type, D) + sizeof(float) - 1) / sizeof(float);
    return (size_t) G * (q_row + (size_t) k->ne[1] + (size_t) D) + (size_t) D;
}

/* A token's slot list lies after the (start, count) pairs and holds valid slots
 * (the index is data written per step: a bad one is reported, never followed). */
static bool index_ok(int32_t start, int32_t count, int64_t first, int64_t n_index,
                     const int32_t *slots, int64_t n_slots) {
    if (count < 0 || count > n_slots || start < first || start + (int64_t) count > n_index) return false;
    for (int32_t j = 0; j < count; j++)
        if (slots[j] < 0 || slots[j] >= n_slots) return false;
    return true;
}

size_t ggml_py_attention_work_size(const struct ggml_py_tensor *node, int n_threads) {
    return (size_t) n_threads * (sizeof(float) * attention_thread_floats(node) + GGML_PY_CACHE_LINE);
}

void ggml_py_compute_attention(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    if (params->stage != GGML_PY_STAGE_COMPUTE) return;
    const struct ggml_py_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
    const int32_t *index = (const int32_t *) dst->src[3]->data;
    const int64_t n_index = dst->src[3]->ne[0];
    const int64_t D = q->ne[0], H = q->ne[1], T = q->ne[2];
    const int64_t Hkv = k->ne[0] / D, G = H / Hkv, n_slots = k->ne[1];
    const float scale = ggml_py_get_op_param_f32(dst, 0);

    const struct ggml_py_type_traits *kt = ggml_py_get_type_traits(k->type);
    const struct ggml_py_type_traits *vt = ggml_py_get_type_traits(v->type);
    const struct ggml_py_type_traits *qt = ggml_py_get_type_traits(kt->vec_dot_type);
    const size_t k_head = ggml_py_row_size(k->type, D), v_head = ggml_py_row_size(v->type, D);
    const size_t q_row = (ggml_py_row_size(kt->vec_dot_type, D) + sizeof(float) - 1) / sizeof(float);
    const ggml_py_exp_sum_fn exp_sum = ggml_py_row_kernels()->exp_sum;

    float *scratch = (float *) ((char *) params->wdata +
                                params->ith * (sizeof(float) * attention_thread_floats(dst) + GGML_PY_CACHE_LINE));
    float *q_conv = scratch;                          /* G * q_row             */
    float *scores = q_conv + G * q_row;               /* G * n_slots           */
    float *v_row = scores + G * n_slots;              /* D                     */
    float *acc = v_row + D;                           /* G * D                 */

    struct ggml_py_items taken = { 0, 0 };
    for (int64_t item; (item = ggml_py_next_item(params, T * Hkv, &taken)) >= 0;) {
        const int64_t t = item / Hkv, g = item % Hkv;
        const int32_t start = index[2 * t], count = index[2 * t + 1];
        const int32_t *slots = index + start;
        if (!index_ok(start, count, 2 * T, n_index, slots, n_slots)) {
            ggml_py_set_error(params, GGML_PY_STATUS_BAD_INDEX);
            continue;
        }
        for (int64_t h = 0; h < G; h++) {
            const float *qh = (const float *) ((const char *) q->data + (g * G + h) * q->nb[1] + t * q->nb[2]);
            qt->from_float(qh, q_conv + h * q_row, D);   /* as MUL_MAT converts its src1 rows */
        }
        /* scores: one K row read for all G heads */
        for (int32_t j = 0; j < count; j++) {
            const char *kr = (const char *) k->data + (int64_t) slots[j] * k->nb[1] + g * k_head;
            for (int64_t h = 0; h < G; h++) {
                float s;
                kt->vec_dot(D, &s, kr, q_conv + h * q_row);
                scores[h * n_slots + j] = s * scale;
            }
        }
        for (int64_t h = 0; h < G; h++) {
            float *sh = scores + h * n_slots, max = -INFINITY;
            for (int32_t j = 0; j < count; j++) max = sh[j] > max ? sh[j] : max;
            const double sum = count ? exp_sum(count, sh, sh, max) : 0.0;
            const float inv = sum > 0.0 ? (float) (1.0 / sum) : 0.0f;
            for (int32_t j = 0; j < count; j++) sh[j] *= inv;
            memset(acc + h * D, 0, sizeof(float) * D);
        }
        /* out_h = sum_j p_hj v_j, one V row read for all G heads, slots in list order */
        for (int32_t j = 0; j < count; j++) {
            const char *vr = (const char *) v->data + (int64_t) slots[j] * v->nb[1] + g * v_head;
            vt->to_float(vr, v_row, D);
            for (int64_t h = 0; h < G; h++) {
                const float p = scores[h * n_slots + j];
                float *a = acc + h * D;
                for (int64_t d = 0; d < D; d++) a[d] += p * v_row[d];
            }
        }
        for (int64_t h = 0; h < G; h++) {
            float *out = (float *) ((char *) dst->data + (g * G + h) * dst->nb[1] + t * dst->nb[2]);
            memcpy(out, acc + h * D, sizeof(float) * D);
        }
    }
}
