/* impl.h - helpers shared by the C sources (not a public contract). */
#ifndef GGML_PY_IMPL_H
#define GGML_PY_IMPL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ggml_py.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

#define GGML_PY_UNUSED(x) (void) (x)

/* Around every graph compute: a SIGBUS meanwhile is explained on stderr (bus_error.c). */
void ggml_py_compute_begins(void);
void ggml_py_compute_ends(void);
#define GGML_PY_MIN(a, b) ((a) < (b) ? (a) : (b))
#define GGML_PY_MAX(a, b) ((a) > (b) ? (a) : (b))

typedef uint16_t ggml_py_fp16_t;
typedef uint16_t ggml_py_bf16_t;

/* IEEE half <-> float, bit-exact with ggml's scalar conversions. */
static inline float ggml_py_fp16_to_fp32(ggml_py_fp16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t w = (uint32_t) h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const uint32_t exp_offset = 0xE0u << 23;
    union { uint32_t u; float f; } exp_scale = { 0x7800000u }, o, m;
    o.u = (two_w >> 4) + exp_offset;
    const float normalized = o.f * exp_scale.f;
    m.u = (two_w >> 17) | (126u << 23);
    const float denormalized = m.f - 0.5f;
    union { uint32_t u; float f; } r;
    const uint32_t denorm_cutoff = 1u << 27;
    union { float f; uint32_t u; } n = { normalized }, d = { denormalized };
    r.u = sign | (two_w < denorm_cutoff ? d.u : n.u);
    return r.f;
#endif
}

static inline ggml_py_fp16_t ggml_py_fp32_to_fp16(float f) {
#if defined(__F16C__)
    return _cvtss_sh(f, 0);
#else
    union { float f; uint32_t u; } scale_to_inf = { .u = 0x77800000u }, scale_to_zero = { .u = 0x08800000u };
    float base = (fabsf(f) * scale_to_inf.f) * scale_to_zero.f;
    union { float f; uint32_t u; } in = { f };
    const uint32_t w = in.u;
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    union { uint32_t u; float f; } b = { (bias >> 1) + 0x07800000u };
    base = b.f + base;
    union { float f; uint32_t u; } bits = { base };
    const uint32_t exp_bits = (bits.u >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits.u & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (ggml_py_fp16_t) ((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
#endif
}

static inline float ggml_py_bf16_to_fp32(ggml_py_bf16_t h) {
    union { uint32_t u; float f; } r = { (uint32_t) h << 16 };
    return r.f;
}

/* Round to nearest even; NaN stays a (quiet) NaN, as ggml does. */
static inline ggml_py_bf16_t ggml_py_fp32_to_bf16(float f) {
    union { float f; uint32_t u; } in = { f };
    if ((in.u & 0x7fffffffu) > 0x7f800000u) return (ggml_py_bf16_t) ((in.u >> 16) | 64);
    return (ggml_py_bf16_t) ((in.u + (0x7fff + ((in.u >> 16) & 1))) >> 16);
}

static inline float ggml_py_get_op_param_f32(const struct ggml_py_tensor *t, int i) {
    float v;
    memcpy(&v, &t->op_params[i], sizeof(v));
    return v;
}

/* Report bad data from inside a kernel (any thread). */
static inline void ggml_py_set_error(const struct ggml_py_compute_params *params, int32_t status) {
    if (params->error) __atomic_store_n(params->error, status, __ATOMIC_RELEASE);
}

/* The rows [*ir0, *ir1) of nr that thread ith of nth handles. */
static inline void ggml_py_thread_rows(int64_t nr, int ith, int nth, int64_t *ir0, int64_t *ir1) {
    const int64_t dr = (nr + nth - 1) / nth;
    *ir0 = GGML_PY_MIN(dr * ith, nr);
    *ir1 = GGML_PY_MIN(*ir0 + dr, nr);
}

/* Work items of a parallel stage, taken by whichever thread is free: the
 * stage's threads take chunks in turn from one counter (params->next_item), so
 * a thread the machine slows down (another guest on its core, a slower core)
 * does fewer items instead of holding up the stage. Chunks of about
 * n_items / (CHUNKS_PER_THREAD * nth) items keep the counter cold.
 *
 *     struct ggml_py_items taken = { 0, 0 };
 *     for (int64_t i; (i = ggml_py_next_item(params, n_items, &taken)) >= 0;) ...
 */
#define GGML_PY_CHUNKS_PER_THREAD 8
struct ggml_py_items { int64_t next, end; };   /* this thread's chunk: [next, end) */

/* The next work item of n_items for this thread, or -1 when none are left. */
static inline int64_t ggml_py_next_item(const struct ggml_py_compute_params *params, int64_t n_items,
                                        struct ggml_py_items *taken) {
    if (taken->next == taken->end) {
        const int64_t chunk = GGML_PY_MAX(1, n_items / (GGML_PY_CHUNKS_PER_THREAD * params->nth));
        const int64_t first = __atomic_fetch_add(params->next_item, chunk, __ATOMIC_RELAXED);
        if (first >= n_items) return -1;
        taken->next = first;
        taken->end = GGML_PY_MIN(first + chunk, n_items);
    }
    return taken->next++;
}

/* ggml's local names for shapes and strides of src0, src1 and dst. */
#define GGML_PY_TENSOR_LOCALS_1(prefix, t)                                   \
    const int64_t prefix##0 = (t)->ne[0], prefix##1 = (t)->ne[1];           \
    const int64_t prefix##2 = (t)->ne[2], prefix##3 = (t)->ne[3];           \
    GGML_PY_UNUSED(prefix##0); GGML_PY_UNUSED(prefix##1);                   \
    GGML_PY_UNUSED(prefix##2); GGML_PY_UNUSED(prefix##3)
#define GGML_PY_STRIDE_LOCALS_1(prefix, t)                                   \
    const size_t prefix##0 = (t)->nb[0], prefix##1 = (t)->nb[1];            \
    const size_t prefix##2 = (t)->nb[2], prefix##3 = (t)->nb[3];            \
    GGML_PY_UNUSED(prefix##0); GGML_PY_UNUSED(prefix##1);                   \
    GGML_PY_UNUSED(prefix##2); GGML_PY_UNUSED(prefix##3)
#define GGML_PY_UNARY_LOCALS(src0, dst)                                      \
    GGML_PY_TENSOR_LOCALS_1(ne0, src0); GGML_PY_STRIDE_LOCALS_1(nb0, src0); \
    GGML_PY_TENSOR_LOCALS_1(ne, dst);   GGML_PY_STRIDE_LOCALS_1(nb, dst)
#define GGML_PY_BINARY_LOCALS(src0, src1, dst)                               \
    GGML_PY_UNARY_LOCALS(src0, dst);                                         \
    GGML_PY_TENSOR_LOCALS_1(ne1, src1); GGML_PY_STRIDE_LOCALS_1(nb1, src1)

/* Kernels, one per op (see ops.c for the dispatch). */
#define GGML_PY_KERNEL(name) \
    void ggml_py_compute_##name(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst)
GGML_PY_KERNEL(dup);
GGML_PY_KERNEL(binary);
GGML_PY_KERNEL(unary);
GGML_PY_KERNEL(swiglu);
GGML_PY_KERNEL(sum_rows);
GGML_PY_KERNEL(mean);
GGML_PY_KERNEL(argmax);
GGML_PY_KERNEL(norm);
GGML_PY_KERNEL(rms_norm);
GGML_PY_KERNEL(soft_max);
GGML_PY_KERNEL(mul_mat);
GGML_PY_KERNEL(get_rows);
GGML_PY_KERNEL(set_rows);
GGML_PY_KERNEL(rope);
GGML_PY_KERNEL(concat);
GGML_PY_KERNEL(attention);
GGML_PY_KERNEL(all_reduce);

size_t ggml_py_attention_work_size(const struct ggml_py_tensor *node, int n_threads);
size_t ggml_py_mul_mat_work_size(const struct ggml_py_tensor *node, int n_threads);
int ggml_py_mul_mat_profiles(const struct ggml_py_tensor *node,
                             struct ggml_py_task_profile out[GGML_PY_MAX_PROFILES]);
int ggml_py_mul_mat_default_profile_index(const struct ggml_py_tensor *node);
int ggml_py_attention_profiles(const struct ggml_py_tensor *node,
                               struct ggml_py_task_profile out[GGML_PY_MAX_PROFILES]);
int ggml_py_attention_default_profile_index(const struct ggml_py_tensor *node);

#endif /* GGML_PY_IMPL_H */
