/* traits.c - one row per type: block size, bytes per block, conversions and
 * the dot product every op uses. No op switches over types.
 *
 * A row holds both versions of the kernels that have a SIMD twin (`kernels`);
 * ggml_py_select_kernels() points vec_dot and from_float at the SIMD one (or, when
 * forced, at the scalar twin). */
#include "impl.h"
#include "simd.h"
#include "vec.h"
#include "ggml_py_quants.h"
#include "mul_mat.h"
#include "attn.h"

/* Scalar twin and SIMD kernel of a slot that has both. */
#if defined(GGML_PY_HAVE_AVX2)
#define SIMD(fn) fn##_avx2
#if defined(GGML_PY_HAVE_PANEL16)
#define SIMD_NAME "avx2+vnni+avx512"   /* and the rows8 panels on 512-bit vectors */
#elif defined(GGML_PY_HAVE_VNNI)
#define SIMD_NAME "avx2+vnni"   /* the AVX2 kernels, their byte dot products in VNNI */
#else
#define SIMD_NAME "avx2"
#endif
#else
#define SIMD(fn) NULL
#define SIMD_NAME "scalar reference"
#endif

/* the dot product of type t against its vec_dot type: twin and SIMD kernel (vec_dot
 * starts on the twin, so that a program that never selects kernels runs the twins) */
#define DOT(t) .vec_dot = ggml_py_vec_dot_##t##_ref,                                 \
    .kernels.vec_dot_ref = ggml_py_vec_dot_##t##_ref, .kernels.vec_dot_simd = SIMD(ggml_py_vec_dot_##t)
/* how activations are converted to type t (a vec_dot type): twin and SIMD kernel */
#define ACTS(t, ref) .kernels.from_float_ref = ref, .kernels.from_float_simd = SIMD(ggml_py_quantize_row_##t)

#define QUANT_ROW(t, blck, size, dot_type)                                        \
    .name = #t, .blck_size = blck, .type_size = size, .is_quantized = true,       \
    .to_float = ggml_py_dequantize_row_##t,                                       \
    .from_float = ggml_py_quantize_row_##t##_ref,                                 \
    .from_float_ref = ggml_py_quantize_row_##t##_ref, .vec_dot_type = dot_type

static struct ggml_py_type_traits type_traits[GGML_PY_TYPE_COUNT] = {
    [GGML_PY_TYPE_F32] = {
        .name = "f32", .blck_size = 1, .type_size = sizeof(float),
        .to_float = ggml_py_f32_row_to_f32,
        .from_float = ggml_py_f32_to_f32_row, .from_float_ref = ggml_py_f32_to_f32_row,
        .vec_dot_type = GGML_PY_TYPE_F32, DOT(f32),
    },
    [GGML_PY_TYPE_F16] = {
        .name = "f16", .blck_size = 1, .type_size = sizeof(ggml_py_fp16_t),
        .to_float = ggml_py_f16_to_f32_row,
        .from_float = ggml_py_f32_to_f16_row, .from_float_ref = ggml_py_f32_to_f16_row,
        .vec_dot_type = GGML_PY_TYPE_F16, DOT(f16),
    },
    [GGML_PY_TYPE_BF16] = {
        .name = "bf16", .blck_size = 1, .type_size = sizeof(ggml_py_bf16_t),
        .to_float = ggml_py_bf16_to_f32_row,
        .from_float = ggml_py_f32_to_bf16_row, .from_float_ref = ggml_py_f32_to_bf16_row,
        .vec_dot = ggml_py_vec_dot_bf16_ref, .vec_dot_type = GGML_PY_TYPE_BF16,
    },
    /* quantized block formats: layouts in include/ggml_py_quants.h */
    [GGML_PY_TYPE_Q4_0] = { QUANT_ROW(q4_0, 32, 18, GGML_PY_TYPE_Q8_0), DOT(q4_0) },
    [GGML_PY_TYPE_Q4_1] = { QUANT_ROW(q4_1, 32, 20, GGML_PY_TYPE_Q8_1), DOT(q4_1) },
    [GGML_PY_TYPE_Q5_0] = { QUANT_ROW(q5_0, 32, 22, GGML_PY_TYPE_Q8_0), DOT(q5_0) },
    [GGML_PY_TYPE_Q5_1] = { QUANT_ROW(q5_1, 32, 24, GGML_PY_TYPE_Q8_1), DOT(q5_1) },
    [GGML_PY_TYPE_Q8_0] = { QUANT_ROW(q8_0, 32, 34, GGML_PY_TYPE_Q8_0),
                            ACTS(q8_0, ggml_py_quantize_row_q8_0_act_ref), DOT(q8_0) },
    [GGML_PY_TYPE_Q8_1] = { QUANT_ROW(q8_1, 32, 36, GGML_PY_TYPE_Q8_1),
                            ACTS(q8_1, ggml_py_quantize_row_q8_1_act_ref) },
    [GGML_PY_TYPE_Q2_K] = { QUANT_ROW(q2_K, 256, 84,  GGML_PY_TYPE_Q8_K), DOT(q2_K) },
    [GGML_PY_TYPE_Q3_K] = { QUANT_ROW(q3_K, 256, 110, GGML_PY_TYPE_Q8_K), DOT(q3_K) },
    [GGML_PY_TYPE_Q4_K] = { QUANT_ROW(q4_K, 256, 144, GGML_PY_TYPE_Q8_K), DOT(q4_K) },
    [GGML_PY_TYPE_Q5_K] = { QUANT_ROW(q5_K, 256, 176, GGML_PY_TYPE_Q8_K), DOT(q5_K) },
    [GGML_PY_TYPE_Q6_K] = { QUANT_ROW(q6_K, 256, 210, GGML_PY_TYPE_Q8_K), DOT(q6_K) },
    [GGML_PY_TYPE_Q8_K] = { QUANT_ROW(q8_K, 256, 292, GGML_PY_TYPE_Q8_K),
                            ACTS(q8_K, ggml_py_quantize_row_q8_K_ref) },
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

int ggml_py_get_kernel_pair(int type, struct ggml_py_kernel_pair *out) {
    const struct ggml_py_type_traits *tt = ggml_py_get_type_traits(type);
    if (tt == NULL) return -1;
    *out = tt->kernels;
    return 0;
}

/* Point the traits at the fastest kernels this build has, or (force_ref) at the
 * scalar twins. Called once at import, before any compute. Returns a short
 * description of what was picked. */
const char *ggml_py_select_kernels(int force_ref) {
    const int simd = !force_ref;
    for (int type = 0; type < GGML_PY_TYPE_COUNT; type++) {
        struct ggml_py_type_traits *tt = &type_traits[type];
        const struct ggml_py_kernel_pair *k = &tt->kernels;
        if (k->vec_dot_ref) tt->vec_dot = simd && k->vec_dot_simd ? k->vec_dot_simd : k->vec_dot_ref;
        if (k->from_float_ref) {
            tt->from_float = simd && k->from_float_simd ? k->from_float_simd : k->from_float_ref;
        }
    }
    ggml_py_mul_mat_select(simd);
    ggml_py_row_kernels_select(simd);
    ggml_py_attn_kernels_select(simd);
    return force_ref ? "scalar reference" : SIMD_NAME;
}
