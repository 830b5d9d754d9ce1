/* ops_rope.c - rotary position embeddings, one position per token.
 * a: (ne0 = head_dim, ne1 = heads, ne2 = tokens, ne3), positions: I32 [ne2].
 * The angles depend on the token only, so each thread computes cos/sin once
 * per token (in its work-buffer slot) and reuses them for every head. */
#include "impl.h"

static void rope_angles(float *cache, int32_t pos, int n_dims, float freq_base, float freq_scale,
                        const float *freq_factors) {
    /* theta_i = pos * freq_scale * base^(-2i/n_dims), built by repeated
     * multiplication in float as ggml does, so angles match it bit for bit */
    const float theta_scale = powf(freq_base, -2.0f / (float) n_dims);
    float theta = (float) pos;
    for (int i = 0; i < n_dims / 2; i++) {
        const float factor = freq_factors ? freq_factors[i] : 1.0f;
        const float t = freq_scale * (theta / factor);   /* ggml: rope_yarn(theta / ff, freq_scale) */
        cache[2 * i]     = cosf(t);
        cache[2 * i + 1] = sinf(t);
        theta *= theta_scale;
    }
}

void ggml_py_compute_rope(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    if (params->stage != GGML_PY_STAGE_COMPUTE) return;
    const struct ggml_py_tensor *src0 = dst->src[0], *pos = dst->src[1];
    const struct ggml_py_tensor *factors = dst->src[2];
    GGML_PY_UNARY_LOCALS(src0, dst);
    const int n_dims = dst->op_params[0];
    const int mode = dst->op_params[1];
    const float freq_base = ggml_py_get_op_param_f32(dst, 2);
    const float freq_scale = ggml_py_get_op_param_f32(dst, 3);
    const float *freq_factors = factors ? (const float *) factors->data : NULL;
    float *cache = (float *) ((char *) params->wdata +
                              params->ith * (sizeof(float) * ne00 + GGML_PY_CACHE_LINE));
    const int half = n_dims / 2;

    int64_t ir0, ir1;
    ggml_py_thread_rows(ne01 * ne02 * ne03, params->ith, params->nth, &ir0, &ir1);
    int64_t cached_token = -1;
    for (int64_t ir = ir0; ir < ir1; ir++) {
        const int64_t i1 = ir % ne01, i2 = (ir / ne01) % ne02, i3 = ir / (ne01 * ne02);
        const int64_t token = i3 * ne02 + i2;
        if (token != cached_token) {
            const int32_t p = ((const int32_t *) pos->data)[i2];
            rope_angles(cache, p, n_dims, freq_base, freq_scale, freq_factors);
            cached_token = token;
        }
        const char *x = (const char *) src0->data + i1 * nb01 + i2 * nb02 + i3 * nb03;
        float *d = (float *) ((char *) dst->data + i1 * nb1 + i2 * nb2 + i3 * nb3);
        for (int i = 0; i < half; i++) {
            const int64_t j0 = mode == GGML_PY_ROPE_NEOX ? i : 2 * i;
            const int64_t j1 = mode == GGML_PY_ROPE_NEOX ? i + half : 2 * i + 1;
            const float x0 = *(const float *) (x + j0 * nb00);
            const float x1 = *(const float *) (x + j1 * nb00);
            const float c = cache[2 * i], s = cache[2 * i + 1];
            d[j0] = x0 * c - x1 * s;
            d[j1] = x0 * s + x1 * c;
        }
        for (int64_t i0 = n_dims; i0 < ne00; i0++) d[i0] = *(const float *) (x + i0 * nb00);
    }
}
