/* ggml_py_quants.h - quantized block formats, byte-identical to ggml's, and
 * the row kernels of each type.
 *
 * A row of n elements of a quantized type is n / blck_size blocks laid end to
 * end. Scales are IEEE half (ggml_py_half) unless noted. Every struct size is
 * pinned: GGUF files are used in place, so a padding change would be a file
 * format change.
 *
 * Kernel families (all on raw pointers, n a multiple of the block size):
 *   ggml_py_quantize_row_<t>_ref   deterministic scalar quantizer (ggml's *_ref)
 *   ggml_py_quantize_row_<t>_avx2  same bytes, faster (activation types only)
 *   ggml_py_dequantize_row_<t>     blocks -> float
 *   ggml_py_vec_dot_<t>_ref        scalar dot product with the vec_dot type
 *   ggml_py_vec_dot_<t>_avx2       the same sums in the same order (bitwise)
 */
#ifndef GGML_PY_QUANTS_H
#define GGML_PY_QUANTS_H

#include <stdint.h>

#include "ggml_py.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t ggml_py_half;

#define GGML_PY_QK4_0 32
#define GGML_PY_QK4_1 32
#define GGML_PY_QK5_0 32
#define GGML_PY_QK5_1 32
#define GGML_PY_QK8_0 32
#define GGML_PY_QK8_1 32
#define GGML_PY_QK_K  256
#define GGML_PY_K_SCALE_SIZE 12

/* ---- legacy formats: 32 elements per block ------------------------------- */

typedef struct {
    ggml_py_half d;                      /* scale: x = (q - 8) * d             */
    uint8_t qs[GGML_PY_QK4_0 / 2];       /* nibbles: low = 0..15, high = 16..31 */
} ggml_py_block_q4_0;
_Static_assert(sizeof(ggml_py_block_q4_0) == 18, "q4_0 block size");

typedef struct {
    ggml_py_half d;                      /* x = q * d + m                      */
    ggml_py_half m;
    uint8_t qs[GGML_PY_QK4_1 / 2];
} ggml_py_block_q4_1;
_Static_assert(sizeof(ggml_py_block_q4_1) == 20, "q4_1 block size");

typedef struct {
    ggml_py_half d;                      /* x = (q - 16) * d                   */
    uint8_t qh[4];                       /* fifth bit of element j at bit j    */
    uint8_t qs[GGML_PY_QK5_0 / 2];
} ggml_py_block_q5_0;
_Static_assert(sizeof(ggml_py_block_q5_0) == 22, "q5_0 block size");

typedef struct {
    ggml_py_half d;                      /* x = q * d + m                      */
    ggml_py_half m;
    uint8_t qh[4];
    uint8_t qs[GGML_PY_QK5_1 / 2];
} ggml_py_block_q5_1;
_Static_assert(sizeof(ggml_py_block_q5_1) == 24, "q5_1 block size");

typedef struct {
    ggml_py_half d;                      /* x = q * d                          */
    int8_t qs[GGML_PY_QK8_0];
} ggml_py_block_q8_0;
_Static_assert(sizeof(ggml_py_block_q8_0) == 34, "q8_0 block size");

typedef struct {
    ggml_py_half d;                      /* x = q * d                          */
    ggml_py_half s;                      /* d * sum(qs)                        */
    int8_t qs[GGML_PY_QK8_1];
} ggml_py_block_q8_1;
_Static_assert(sizeof(ggml_py_block_q8_1) == 36, "q8_1 block size");

/* ---- K-quants: super-blocks of 256 ---------------------------------------- */

typedef struct {
    uint8_t scales[GGML_PY_QK_K / 16];   /* per 16: low nibble scale, high min */
    uint8_t qs[GGML_PY_QK_K / 4];        /* 2-bit quants                       */
    ggml_py_half d;                      /* super-block scale of the scales    */
    ggml_py_half dmin;                   /* super-block scale of the mins      */
} ggml_py_block_q2_K;
_Static_assert(sizeof(ggml_py_block_q2_K) == 84, "q2_K block size");

typedef struct {
    uint8_t hmask[GGML_PY_QK_K / 8];     /* high bit of each quant             */
    uint8_t qs[GGML_PY_QK_K / 4];        /* low 2 bits                         */
    uint8_t scales[12];                  /* 16 scales of 6 bits                */
    ggml_py_half d;
} ggml_py_block_q3_K;
_Static_assert(sizeof(ggml_py_block_q3_K) == 110, "q3_K block size");

typedef struct {
    ggml_py_half d;
    ggml_py_half dmin;
    uint8_t scales[GGML_PY_K_SCALE_SIZE]; /* 8 scales + 8 mins of 6 bits       */
    uint8_t qs[GGML_PY_QK_K / 2];
} ggml_py_block_q4_K;
_Static_assert(sizeof(ggml_py_block_q4_K) == 144, "q4_K block size");

typedef struct {
    ggml_py_half d;
    ggml_py_half dmin;
    uint8_t scales[GGML_PY_K_SCALE_SIZE];
    uint8_t qh[GGML_PY_QK_K / 8];        /* fifth bits                         */
    uint8_t qs[GGML_PY_QK_K / 2];
} ggml_py_block_q5_K;
_Static_assert(sizeof(ggml_py_block_q5_K) == 176, "q5_K block size");

typedef struct {
    uint8_t ql[GGML_PY_QK_K / 2];        /* low 4 bits                         */
    uint8_t qh[GGML_PY_QK_K / 4];        /* high 2 bits                        */
    int8_t scales[GGML_PY_QK_K / 16];    /* 8-bit scale per 16                 */
    ggml_py_half d;
} ggml_py_block_q6_K;
_Static_assert(sizeof(ggml_py_block_q6_K) == 210, "q6_K block size");

typedef struct {
    float d;                             /* a float, not a half                */
    int8_t qs[GGML_PY_QK_K];
    int16_t bsums[GGML_PY_QK_K / 16];    /* sum of qs per 16                   */
} ggml_py_block_q8_K;
_Static_assert(sizeof(ggml_py_block_q8_K) == 292, "q8_K block size");

/* ---- kernels ---------------------------------------------------------------- */

#define GGML_PY_QUANT_TYPES(X) X(q4_0) X(q4_1) X(q5_0) X(q5_1) X(q8_0) X(q8_1) \
    X(q2_K) X(q3_K) X(q4_K) X(q5_K) X(q6_K) X(q8_K)
#define GGML_PY_DECLARE_ROW_KERNELS(t)                                              \
    void ggml_py_quantize_row_##t##_ref(const float *x, void *y, int64_t n);        \
    void ggml_py_dequantize_row_##t(const void *x, float *y, int64_t n);
GGML_PY_QUANT_TYPES(GGML_PY_DECLARE_ROW_KERNELS)
#undef GGML_PY_DECLARE_ROW_KERNELS

/* dot products: x in the named type, y in its vec_dot type */
#define GGML_PY_DOT_TYPES(X) X(q4_0) X(q4_1) X(q5_0) X(q5_1) X(q8_0) \
    X(q2_K) X(q3_K) X(q4_K) X(q5_K) X(q6_K)
#define GGML_PY_DECLARE_DOT(t) \
    void ggml_py_vec_dot_##t##_ref(int64_t n, float *s, const void *x, const void *y);
GGML_PY_DOT_TYPES(GGML_PY_DECLARE_DOT)
#undef GGML_PY_DECLARE_DOT

/* Q4_0 rows interleaved by eight, for MUL_MAT's SIMD kernels (the tensor's rows8): rows
 * 8g .. 8g + 7 keep the bytes of those eight rows, block by block; block b of group g
 * (n / 32 blocks a row) is 144 bytes at (g * n / 32 + b) * 144: the eight rows' scales
 * d (row r's at byte 2r), then for j = 0 .. 3 the eight rows' packed bytes qs[4j ..
 * 4j + 3] (row r's at byte 16 + 32j + 4r). One 32-byte load then holds four values of
 * each row in its 32-bit lane (low nibbles: values 4j .. 4j + 3, high nibbles: 16 + 4j
 * ..), and the eight scales are one 16-byte load. dst: as many bytes as src; n_rows a
 * multiple of 8, n of 32. */
void ggml_py_q4_0_interleave_rows8(const void *src, void *dst, int64_t n_rows, int64_t n);
/* Q4_K the same way, per super-block (1152 bytes for eight rows): the rows' d (row r's at
 * byte 2r), their dmin (16 + 2r), for k = 0 .. 2 their 32-bit words k of the packed scales
 * and mins (32 + 32k + 4r), then for j = 0 .. 31 their bytes qs[4j .. 4j + 3] (128 + 32j +
 * 4r): low nibbles values 4(j % 8) .. of sub-block 2(j / 8), high nibbles of the next one.
 * The scales' unpacking is then the same 32-bit lane operations for the eight rows.
 * Q5_K (1408 bytes) as Q4_K with its qh words between: qh[4k .. 4k + 3] at 128 + 32k + 4r
 * (k = 0 .. 7: the fifth bits of qs word j with j % 8 = k), qs at 384 + 32j + 4r.
 * Q6_K (1680 bytes) in the order its kernels read it: the rows' scales[4k .. 4k + 3] at
 * 32k + 4r (k = 0 .. 3), their d (128 + 2r), then per half h = 0, 1 and j = 0 .. 7 the
 * three words of values 4j .. 4j + 3 of each 32 in that half, 96 bytes at 144 + 96 (8h + j):
 * ql[64h + 4j ..] (4r), ql[64h + 32 + 4j ..] (32 + 4r), qh[32h + 4j ..] (64 + 4r). */
void ggml_py_q4_K_interleave_rows8(const void *src, void *dst, int64_t n_rows, int64_t n);
void ggml_py_q5_K_interleave_rows8(const void *src, void *dst, int64_t n_rows, int64_t n);
void ggml_py_q6_K_interleave_rows8(const void *src, void *dst, int64_t n_rows, int64_t n);

/* activation quantizers: llama.cpp's x86 rounding (see quants_legacy.c) */
void ggml_py_quantize_row_q8_0_act_ref(const float *x, void *y, int64_t n);
void ggml_py_quantize_row_q8_1_act_ref(const float *x, void *y, int64_t n);

/* AVX2 versions (built when the compiler targets AVX2 + FMA + F16C) */
void ggml_py_quantize_row_q8_0_avx2(const float *x, void *y, int64_t n);
void ggml_py_quantize_row_q8_1_avx2(const float *x, void *y, int64_t n);
void ggml_py_quantize_row_q8_K_avx2(const float *x, void *y, int64_t n);
void ggml_py_vec_dot_q4_0_avx2(int64_t n, float *s, const void *x, const void *y);
void ggml_py_vec_dot_q4_1_avx2(int64_t n, float *s, const void *x, const void *y);
void ggml_py_vec_dot_q5_0_avx2(int64_t n, float *s, const void *x, const void *y);
void ggml_py_vec_dot_q5_1_avx2(int64_t n, float *s, const void *x, const void *y);
void ggml_py_vec_dot_q8_0_avx2(int64_t n, float *s, const void *x, const void *y);
void ggml_py_vec_dot_q2_K_avx2(int64_t n, float *s, const void *x, const void *y);
void ggml_py_vec_dot_q3_K_avx2(int64_t n, float *s, const void *x, const void *y);
void ggml_py_vec_dot_q4_K_avx2(int64_t n, float *s, const void *x, const void *y);
void ggml_py_vec_dot_q5_K_avx2(int64_t n, float *s, const void *x, const void *y);
void ggml_py_vec_dot_q6_K_avx2(int64_t n, float *s, const void *x, const void *y);

/* Both versions of a type's kernels (struct ggml_py_kernel_pair, in its traits row), for
 * tests that hold them against each other. */
/* Returns 0, or -1 for an id that is not a type. */
int ggml_py_get_kernel_pair(int type, struct ggml_py_kernel_pair *out);

#ifdef __cplusplus
}
#endif

#endif /* GGML_PY_QUANTS_H */
