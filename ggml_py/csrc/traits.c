/* traits.c - one row per type: block size, bytes per block, conversions and
 * the dot product every op uses. No op switches over types. */
#include "impl.h"
#include "simd.h"
#include "vec.h"

static struct ggml_py_type_traits type_traits[GGML_PY_TYPE_COUNT] = {
    [GGML_PY_TYPE_F32] = {
        .name = "f32", .blck_size = 1, .type_size = sizeof(float),
        .to_float = ggml_py_f32_row_to_f32,
        .from_float = ggml_py_f32_to_f32_row, .from_float_ref = ggml_py_f32_to_f32_row,
        .vec_dot = ggml_py_vec_dot_f32_ref, .vec_dot_type = GGML_PY_TYPE_F32,
    },
    [GGML_PY_TYPE_F16] = {
        .name = "f16", .blck_size = 1, .type_size = sizeof(ggml_py_fp16_t),
        .to_float = ggml_py_f16_to_f32_row,
        .from_float = ggml_py_f32_to_f16_row, .from_float_ref = ggml_py_f32_to_f16_row,
        .vec_dot = ggml_py_vec_dot_f16_ref, .vec_dot_type = GGML_PY_TYPE_F16,
    },
    [GGML_PY_TYPE_BF16] = {
        .name = "bf16", .blck_size = 1, .type_size = sizeof(ggml_py_bf16_t),
        .to_float = ggml_py_bf16_to_f32_row,
        .from_float = ggml_py_f32_to_bf16_row, .from_float_ref = ggml_py_f32_to_bf16_row,
        .vec_dot = ggml_py_vec_dot_bf16_ref, .vec_dot_type = GGML_PY_TYPE_BF16,
    },
    /* quantized block formats: layouts in include/ggml_py_quants.h */
    [GGML_PY_TYPE_Q4_0] = { .name = "q4_0", .blck_size = 32,  .type_size = 18,  .is_quantized = true },
    [GGML_PY_TYPE_Q4_1] = { .name = "q4_1", .blck_size = 32,  .type_size = 20,  .is_quantized = true },
    [GGML_PY_TYPE_Q5_0] = { .name = "q5_0", .blck_size = 32,  .type_size = 22,  .is_quantized = true },
    [GGML_PY_TYPE_Q5_1] = { .name = "q5_1", .blck_size = 32,  .type_size = 24,  .is_quantized = true },
    [GGML_PY_TYPE_Q8_0] = { .name = "q8_0", .blck_size = 32,  .type_size = 34,  .is_quantized = true },
    [GGML_PY_TYPE_Q8_1] = { .name = "q8_1", .blck_size = 32,  .type_size = 36,  .is_quantized = true },
    [GGML_PY_TYPE_Q2_K] = { .name = "q2_K", .blck_size = 256, .type_size = 84,  .is_quantized = true },
    [GGML_PY_TYPE_Q3_K] = { .name = "q3_K", .blck_size = 256, .type_size = 110, .is_quantized = true },
    [GGML_PY_TYPE_Q4_K] = { .name = "q4_K", .blck_size = 256, .type_size = 144, .is_quantized = true },
    [GGML_PY_TYPE_Q5_K] = { .name = "q5_K", .blck_size = 256, .type_size = 176, .is_quantized = true },
    [GGML_PY_TYPE_Q6_K] = { .name = "q6_K", .blck_size = 256, .type_size = 210, .is_quantized = true },
    [GGML_PY_TYPE_Q8_K] = { .name = "q8_K", .blck_size = 256, .type_size = 292, .is_quantized = true },
    [GGML_PY_TYPE_I8]  = { .name = "i8",  .blck_size = 1, .type_size = 1 },
    [GGML_PY_TYPE_I16] = { .name = "i16", .blck_size = 1, .type_size = 2 },
    [GGML_PY_TYPE_I32] = { .name = "i32", .blck_size = 1, .type_size = 4 },
    [GGML_PY_TYPE_I64] = { .name = "i64", .blck_size = 1, .type_size = 8 },
    [GGML_PY_TYPE_F64] = { .name = "f64", .blck_size = 1, .type_size = 8 },
};

const struct ggml_py_type_traits *ggml_py_get_type_traits(int type) {
    if (type < 0 || type >= GGML_PY_TYPE_COUNT || type_traits[type].name == NULL) return NULL;
    return &type_traits[type];
}

/* Point the traits at the fastest kernels this build has, or (force_ref) at the
 * scalar twins. Called once at import, before any compute. Returns a short
 * description of what was picked. */
const char *ggml_py_select_kernels(int force_ref) {
    if (force_ref) {
        type_traits[GGML_PY_TYPE_F32].vec_dot = ggml_py_vec_dot_f32_ref;
        type_traits[GGML_PY_TYPE_F16].vec_dot = ggml_py_vec_dot_f16_ref;
        return "scalar reference";
    }
#if defined(GGML_PY_HAVE_AVX2)
    type_traits[GGML_PY_TYPE_F32].vec_dot = ggml_py_vec_dot_f32_avx2;
    type_traits[GGML_PY_TYPE_F16].vec_dot = ggml_py_vec_dot_f16_avx2;
    return "avx2";
#else
    return "scalar reference";
#endif
}
