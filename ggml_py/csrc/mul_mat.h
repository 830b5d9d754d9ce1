/* mul_mat.h - the blocked CPU kernels of MUL_MAT (not a public contract). */
#ifndef GGML_PY_MUL_MAT_H
#define GGML_PY_MUL_MAT_H

#include <stddef.h>
#include <stdint.h>

/* A tile of dot products: d[j * ldd + i * dd] = dot(x + i * bx, y + j * by) for
 * i < nr0 (src0 rows, at most GGML_PY_GEMM_R0) and j < nr1 (src1 rows, at most
 * GGML_PY_GEMM_R1); x in the weight type, y in its vec_dot type, n elements.
 * The weight rows may lie any distance apart; dd is the distance between the
 * outputs of consecutive ones. Each result equals the type's vec_dot bit for bit,
 * except F16's, which sums in another order than vec_dot_f16. */
#define GGML_PY_GEMM_R0 4
#define GGML_PY_GEMM_R1 2
typedef void (*ggml_py_gemm_tile_fn)(int64_t n, int nr0, int nr1, const char *x, size_t bx,
                                     const char *y, size_t by, float *d, int64_t ldd, int64_t dd);

/* The blocked kernel for weights of `type` against m activation rows, or NULL
 * (use vec_dot per pair). */
ggml_py_gemm_tile_fn ggml_py_gemm_tile_avx2(int type, int64_t m);

/* What the Q4_0 and Q8_0 panels and rows8 kernels take of an activation row's Q8_0 block
 * besides its bytes, worked out once per product instead of once per weight row it meets:
 * minus8_sum, -8 times the sum of its 32 values (Q4_0's (q - 8) . y = q . y - 8 sum(y)),
 * and d, its scale as a float. */
struct ggml_py_q8_0_terms {
    int32_t minus8_sum;
    float d;
};

/* A panel: d[j * ldd + i] = dot(x + i * bx, y + j * by) for i < nr0 (at most
 * GGML_PY_PANEL_ROWS weight rows) and j < nr1 (at most GGML_PY_PANEL_COLS
 * activation rows), with yt + j * (n / 32) the block terms of activation row j
 * (ggml_py_q8_0_block_terms; Q4_0's and Q8_0's, NULL for the others: a Q8_K block keeps
 * its own). Equal to vec_dot bit for bit. Q4_0, Q8_0 and Q4_K - Q6_K have one,
 * used from GGML_PY_PANEL_MIN_M activation rows. */
#define GGML_PY_PANEL_ROWS 8
#define GGML_PY_PANEL_COLS 32
#define GGML_PY_PANEL_MIN_M 8
typedef void (*ggml_py_gemm_panel_fn)(int64_t n, int nr0, int nr1, const char *x, size_t bx, const char *y,
                                      size_t by, const struct ggml_py_q8_0_terms *yt, float *d, int64_t ldd);

/* The panel kernel for weights of `type` against m activation rows, or NULL. */
ggml_py_gemm_panel_fn ggml_py_gemm_panel_avx2(int type, int64_t m);

/* A wide tile: a tile (the contract above) of up to GGML_PY_WIDE_R0 weight rows
 * and GGML_PY_WIDE_R1 activation rows, equal to vec_dot bit for bit. Q4_0 and
 * Q8_0 have one, used below GGML_PY_PANEL_MIN_M activation rows. */
#define GGML_PY_WIDE_R0 8
#define GGML_PY_WIDE_R1 4
/* The wide tile for weights of `type` against m activation rows, or NULL. */
ggml_py_gemm_tile_fn ggml_py_gemm_wide_avx2(int type, int64_t m);
/* A rows8 kernel: for the eight rows of `type` interleaved by eight at x (a tensor's rows8:
 * ggml_py_q4_0_interleave_rows8 and the K-quants' beside it in ggml_py_quants.h)
 * d[j * ldd + i] = dot(row i, y + j * by) for i < 8 and j < nr1 (any number of activation
 * rows), and the same for the eight at x2 into d2 unless x2 is NULL: two groups read side
 * by side (two streams of memory in flight). yt: as a panel's. Equal to
 * vec_dot bit for bit. */
typedef void (*ggml_py_gemm_rows8_fn)(int64_t n, int nr1, const char *x, const char *x2, const char *y,
                                      size_t by, const struct ggml_py_q8_0_terms *yt, float *d, float *d2, int64_t ldd);

/* The rows8 kernel of `type`, or NULL for a type without one (all but Q4_0, Q4_K, Q5_K and Q6_K). */
ggml_py_gemm_rows8_fn ggml_py_gemm_rows8_avx2(int type);
/* terms[b] of Q8_0 block b of a row of n values. */
void ggml_py_q8_0_block_terms(const void *row, int64_t n, struct ggml_py_q8_0_terms *terms);

/* Blocked SIMD tiles on (simd) or vec_dot everywhere; set by ggml_py_select_kernels. */
void ggml_py_mul_mat_select(int simd);

#endif /* GGML_PY_MUL_MAT_H */
