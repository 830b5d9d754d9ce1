/* mul_mat.c - MUL_MAT under its task profiles.
 *
 * dst[i13][i12][i11][i01] = dot(src0 row i01 of batch (i12/r2, i13/r3), src1 row i11)
 * src0: (ne00 = K, ne01 = N, ne02, ne03), any type with a vec_dot
 * src1: (ne10 = K, ne11 = M, ne12, ne13), F32; dst: (N, M, ne12, ne13), F32
 *
 * Profiles (data; the executor reads the stage flags):
 *   cpu         INIT (parallel): src1 rows -> src0's vec_dot type, into the work
 *               buffer (and their block terms, for Q4_0's and Q8_0's panels); COMPUTE
 *               (parallel): eight neighbouring src0 rows in a panel kernel where
 *               the type has one for this M, else groups of eight far-apart rows
 *               through a wide 8 x 4 kernel below M = 8 where it has one (Q4_0, Q8_0), else of four
 *               through a blocked 4 x 2 kernel where it has one, else
 *               VEC_DOT_ROWS neighbouring rows by vec_dot, against blocks of
 *               TILE_M src1 rows; a Q4_0, Q4_K, Q5_K or Q6_K src0 that carries rows8 (its
 *               rows interleaved by eight) through one kernel over that copy at
 *               every M, two groups of eight neighbouring rows half the matrix
 *               apart an item (compute_rows8).
 *   blas        COMPUTE (one thread, workers sleep): de-quantize a src0 batch to
 *               f32 in the work buffer, then one sgemm per src1 batch.
 *   blas-split  INIT (parallel): de-quantize all of src0 into the work buffer;
 *               COMPUTE (one thread, workers sleep): the sgemms.
 *   blas-mt     as blas-split, but the sgemms run on OpenBLAS's own threads
 *               (one per core) while the pool's workers sleep.
 * BLAS needs src1 contiguous and src0's rows packed; OpenBLAS runs single-threaded except
 * inside blas-mt (the pool owns the cores).
 */
#include "impl.h"
#include "mul_mat.h"
#include "ggml_py_quants.h"

#if defined(GGML_PY_USE_BLAS)
#include <cblas.h>
#endif

#define TILE_M 32         /* src1 rows a work item runs against its weight rows */
#define VEC_DOT_ROWS 16   /* weight rows of an item where the type has no blocked kernel */
_Static_assert(TILE_M <= GGML_PY_PANEL_COLS, "a panel takes a whole block of src1 rows");

static ggml_py_gemm_tile_fn (*tile_for_type)(int type, int64_t m) = NULL;
static ggml_py_gemm_panel_fn (*panel_for_type)(int type, int64_t m) = NULL;
static ggml_py_gemm_tile_fn (*wide_for_type)(int type, int64_t m) = NULL;
static ggml_py_gemm_rows8_fn (*rows8_for_type)(int type) = NULL;

/* Called by ggml_py_select_kernels: blocked SIMD kernels, or vec_dot everywhere. */
void ggml_py_mul_mat_select(int simd) {
    tile_for_type = simd ? ggml_py_gemm_tile_avx2 : NULL;
    panel_for_type = simd ? ggml_py_gemm_panel_avx2 : NULL;
    wide_for_type = simd ? ggml_py_gemm_wide_avx2 : NULL;
    rows8_for_type = simd ? ggml_py_gemm_rows8_avx2 : NULL;
#if defined(GGML_PY_USE_BLAS)
    scipy_openblas_set_num_threads(1);
#endif
}

const char *ggml_py_blas_config(void) {
#if defined(GGML_PY_USE_BLAS)
    return scipy_openblas_get_config();
#else
    return "none";
#endif
}

static struct ggml_py_task_profile make_profile(int32_t id, const char *name) {
    struct ggml_py_task_profile p;
    memset(&p, 0, sizeof(p));
    p.id = id;
    strncpy(p.name, name, sizeof(p.name) - 1);
    return p;
}

static bool src0_is_f32(const struct ggml_py_tensor *node) {
    return node->src[0]->type == GGML_PY_TYPE_F32;
}

/* BLAS reads src1 as a packed f32 matrix, and src0 as f32 rows each packed, any distance
 * apart: de-quantized row by row into the work buffer, or an f32 src0 in place (its rows
 * nb01 apart: sgemm's lda). So src0 may be some columns of a wider matrix (one process's
 * share of a matrix split by its input columns). */
static bool blas_usable(const struct ggml_py_tensor *node) {
#if defined(GGML_PY_USE_BLAS)
    const struct ggml_py_tensor *src0 = node->src[0], *src1 = node->src[1];
    const struct ggml_py_type_traits *tt = ggml_py_get_type_traits(src0->type);
    const bool rows_packed = src0->nb[0] == tt->type_size &&
        (src0->type != GGML_PY_TYPE_F32 ||
         (src0->nb[1] % sizeof(float) == 0 && src0->nb[1] >= ggml_py_row_size(src0->type, src0->ne[0])));
    return tt->to_float != NULL && src1->type == GGML_PY_TYPE_F32 && rows_packed &&
           ggml_py_is_contiguous(src1);
#else
    GGML_PY_UNUSED(node);
    return false;
#endif
}

int ggml_py_mul_mat_profiles(const struct ggml_py_tensor *node,
                             struct ggml_py_task_profile out[GGML_PY_MAX_PROFILES]) {
    int n = 0;
    out[n] = make_profile(GGML_PY_MUL_MAT_CPU, "cpu");
    out[n].stages[GGML_PY_STAGE_INIT]    = (struct ggml_py_stage_flags) { .valid = 1, .parallel = 1 };
    out[n].stages[GGML_PY_STAGE_COMPUTE] = (struct ggml_py_stage_flags) { .valid = 1, .parallel = 1 };
    n++;
    if (!blas_usable(node)) return n;
    out[n] = make_profile(GGML_PY_MUL_MAT_BLAS, "blas");
    out[n].stages[GGML_PY_STAGE_COMPUTE] = (struct ggml_py_stage_flags) { .valid = 1, .wait = 1 };
    n++;
    if (!src0_is_f32(node)) {   /* nothing to de-quantize ahead for f32 weights */
        out[n] = make_profile(GGML_PY_MUL_MAT_BLAS_SPLIT, "blas-split");
        out[n].stages[GGML_PY_STAGE_INIT]    = (struct ggml_py_stage_flags) { .valid = 1, .parallel = 1 };
        out[n].stages[GGML_PY_STAGE_COMPUTE] = (struct ggml_py_stage_flags) { .valid = 1, .wait = 1 };
        n++;
    }
    out[n] = make_profile(GGML_PY_MUL_MAT_BLAS_MT, "blas-mt");
    out[n].stages[GGML_PY_STAGE_INIT]    = (struct ggml_py_stage_flags) { .valid = !src0_is_f32(node), .parallel = 1 };
    out[n].stages[GGML_PY_STAGE_COMPUTE] = (struct ggml_py_stage_flags) { .valid = 1, .wait = 1 };
    n++;
    return n;
}

/* The built-in rule, without tune data. ggml's: BLAS (blas-mt) once every
 * dimension is at least 32 and the sources are as BLAS reads them, the CPU
 * kernels otherwise. For the weight types with blocked SIMD kernels that rule came too
 * early: their `cpu` profile beat BLAS up to the M below (measured per type on
 * 2-vCPU AVX2 and AVX-512 VMs: docs/benchmarks.md, "The built-in rule"), and
 * past it `blas-split` (the de-quantization on the pool's threads, the sgemm on
 * one) beat `blas-mt`, whose OpenBLAS threads lose most on a busy machine. */
static int64_t cpu_below_m(int type) {
    if (!tile_for_type || !tile_for_type(type, TILE_M)) return 0;   /* scalar twins: ggml's */
    switch (type) {
        case GGML_PY_TYPE_Q4_0:
        case GGML_PY_TYPE_Q8_0:
        case GGML_PY_TYPE_Q4_K:
        case GGML_PY_TYPE_Q5_K:
        case GGML_PY_TYPE_Q6_K: return INT64_MAX;   /* the panels: `cpu` at every M */
        default:                return 0;           /* not measured (F16, Q2_K, Q3_K): ggml's */
    }
}

int ggml_py_mul_mat_default_profile_index(const struct ggml_py_tensor *node) {
    const struct ggml_py_tensor *src0 = node->src[0], *src1 = node->src[1];
    if (!blas_usable(node) || src0->ne[0] < 32 || src0->ne[1] < 32) return 0;
    const int64_t m_cpu = cpu_below_m(src0->type);
    if (m_cpu > 0) return src1->ne[1] < m_cpu ? 0 : 2;   /* cpu, blas-split */
    if (src1->ne[1] >= 32) return src0_is_f32(node) ? 2 : 3;
    return 0;
}

/* src1 is read in place when it already is packed rows of the vec_dot type. */
static bool src1_needs_conversion(const struct ggml_py_tensor *node) {
    const struct ggml_py_tensor *src0 = node->src[0], *src1 = node->src[1];
    const int vec_dot_type = ggml_py_get_type_traits(src0->type)->vec_dot_type;
    return vec_dot_type != src1->type || src1->nb[0] != sizeof(float);
}

/* The CPU profile's panel kernel for this node, or NULL: it reads the converted
 * src1 rows and their block terms from the work buffer. */
static ggml_py_gemm_panel_fn panel_for(const struct ggml_py_tensor *node) {
    if (!panel_for_type || !src1_needs_conversion(node)) return NULL;
    return panel_for_type(node->src[0]->type, node->src[1]->ne[1]);
}

/* The CPU profile's kernel over src0's rows8 (its rows interleaved by eight, read
 * instead of its data: packed rows, whatever src0's own row stride) at every M, or
 * NULL: src0 has none, or the scalar twins run. */
static ggml_py_gemm_rows8_fn rows8_for(const struct ggml_py_tensor *node) {
    const struct ggml_py_tensor *src0 = node->src[0];
    if (!src0->rows8 || !rows8_for_type || !src1_needs_conversion(node)) return NULL;
    const bool one_matrix = src0->ne[2] == 1 && src0->ne[3] == 1 && src0->ne[1] % 8 == 0;
    return one_matrix ? rows8_for_type(src0->type) : NULL;
}

/* Whether the panel or rows8 kernel reads the block terms of the converted src1 rows
 * (ggml_py_q8_0_terms: Q4_0's and Q8_0's). */
static bool kernel_takes_terms(const struct ggml_py_tensor *node) {
    const int type = node->src[0]->type;
    return (type == GGML_PY_TYPE_Q4_0 || type == GGML_PY_TYPE_Q8_0) && (panel_for(node) != NULL || rows8_for(node) != NULL);
}

/* The CPU profile's work buffer: src1's rows in the vec_dot type, then (for a
 * panel or rows8 kernel) their block terms, from the next cache line on. */
static size_t src1_rows(const struct ggml_py_tensor *node) {
    return (size_t) (node->src[1]->ne[1] * node->src[1]->ne[2] * node->src[1]->ne[3]);
}

static size_t converted_rows_size(const struct ggml_py_tensor *node) {
    const int vec_dot_type = ggml_py_get_type_traits(node->src[0]->type)->vec_dot_type;
    return ggml_py_row_size(vec_dot_type, node->src[1]->ne[0]) * src1_rows(node);
}

static size_t block_terms_offset(const struct ggml_py_tensor *node) {
    return (converted_rows_size(node) + GGML_PY_CACHE_LINE - 1) / GGML_PY_CACHE_LINE * GGML_PY_CACHE_LINE;
}

static struct ggml_py_q8_0_terms *block_terms_at(const struct ggml_py_compute_params *params,
                                                 const struct ggml_py_tensor *node) {
    return (struct ggml_py_q8_0_terms *) ((char *) params->wdata + block_terms_offset(node));
}

size_t ggml_py_mul_mat_work_size(const struct ggml_py_tensor *node, int n_threads) {
    GGML_PY_UNUSED(n_threads);
    const struct ggml_py_tensor *src0 = node->src[0], *src1 = node->src[1];
    switch (node->profile.id) {
        case GGML_PY_MUL_MAT_CPU:
            if (!src1_needs_conversion(node)) return 0;
            if (!kernel_takes_terms(node)) return converted_rows_size(node);
            return block_terms_offset(node)
                 + sizeof(struct ggml_py_q8_0_terms) * (size_t) (src1->ne[0] / GGML_PY_QK8_0) * src1_rows(node);
        case GGML_PY_MUL_MAT_BLAS:        /* one src0 batch at a time */
            return src0_is_f32(node) ? 0 : sizeof(float) * (size_t) (src0->ne[0] * src0->ne[1]);
        case GGML_PY_MUL_MAT_BLAS_SPLIT:  /* all of src0 */
        case GGML_PY_MUL_MAT_BLAS_MT:
            if (node->profile.id == GGML_PY_MUL_MAT_BLAS_MT && src0_is_f32(node)) return 0;
            return sizeof(float) * (size_t) (src0->ne[0] * src0->ne[1] * src0->ne[2] * src0->ne[3]);
        default:
            return 0;
    }
}

/* ---- CPU profile ------------------------------------------------------------- */

static void convert_src1(const struct ggml_py_compute_params *params, const struct ggml_py_tensor *dst) {
    const struct ggml_py_tensor *src1 = dst->src[1];
    GGML_PY_TENSOR_LOCALS_1(ne1, src1);
    GGML_PY_STRIDE_LOCALS_1(nb1, src1);
    const int vec_dot_type = ggml_py_get_type_traits(dst->src[0]->type)->vec_dot_type;
    const ggml_py_from_float_fn from_float = ggml_py_get_type_traits(vec_dot_type)->from_float;
    const size_t row_size = ggml_py_row_size(vec_dot_type, ne10);
    struct ggml_py_q8_0_terms *terms = kernel_takes_terms(dst) ? block_terms_at(params, dst) : NULL;
    float buf[1024];   /* gathers strided rows, a whole number of blocks at a time */
    int64_t ir0, ir1;
    ggml_py_thread_rows(ne11 * ne12 * ne13, params->ith, params->nth, &ir0, &ir1);
    for (int64_t ir = ir0; ir < ir1; ir++) {
        const int64_t i11 = ir % ne11, i12 = (ir / ne11) % ne12, i13 = ir / (ne11 * ne12);
        const char *s = (const char *) src1->data + i11 * nb11 + i12 * nb12 + i13 * nb13;
        char *d = (char *) params->wdata + ir * row_size;
        if (nb10 == sizeof(float)) {
            from_float((const float *) s, d, ne10);
        } else {
            for (int64_t i0 = 0; i0 < ne10; i0 += 1024) {
                const int64_t n = GGML_PY_MIN(1024, ne10 - i0);
                for (int64_t j = 0; j < n; j++) buf[j] = *(const float *) (s + (i0 + j) * nb10);
                from_float(buf, d + ggml_py_row_size(vec_dot_type, i0), n);
            }
        }
        if (terms) ggml_py_q8_0_block_terms(d, ne10, terms + ir * (ne10 / GGML_PY_QK8_0));
    }
}

/* Where batch (i12, i13) of a MUL_MAT lives: its src0 matrix x (broadcast), its
 * src1 rows y in the vec_dot type (by apart) and, for a panel kernel, their
 * block terms yt; its dst rows d. */
struct mul_mat_batch {
    const char *x, *y;
    size_t by;
    const struct ggml_py_q8_0_terms *yt;
    char *d;
};

static struct mul_mat_batch batch_at(const struct ggml_py_compute_params *params,
                                     const struct ggml_py_tensor *dst, int64_t batch) {
    const struct ggml_py_tensor *src0 = dst->src[0], *src1 = dst->src[1];
    GGML_PY_BINARY_LOCALS(src0, src1, dst);
    const int64_t r2 = ne12 / ne02, r3 = ne13 / ne03;   /* broadcast factors */
    const int64_t i12 = batch % ne12, i13 = batch / ne12;
    const size_t row_size = ggml_py_row_size(ggml_py_get_type_traits(src0->type)->vec_dot_type, ne10);
    struct mul_mat_batch b;
    b.x = (const char *) src0->data + (i12 / r2) * nb02 + (i13 / r3) * nb03;
    b.yt = NULL;
    if (src1_needs_conversion(dst)) {
        b.y = (const char *) params->wdata + batch * ne11 * row_size;
        b.by = row_size;
        if (kernel_takes_terms(dst)) b.yt = block_terms_at(params, dst) + batch * ne11 * (ne10 / GGML_PY_QK8_0);
    } else {
        b.y = (const char *) src1->data + i12 * nb12 + i13 * nb13;
        b.by = nb11;
    }
    b.d = (char *) dst->data + i12 * nb2 + i13 * nb3;
    return b;
}

/* The work items of the CPU profile: (batch, block of TILE_M src1 rows, r), r fastest
 * over q values (what r names is the caller's), and the batch the last one fell in. */
struct mul_mat_items {
    int64_t q, blocks_m, n_items;
    struct mul_mat_batch b;   /* where the batch of the last item placed lies */
    int64_t b_index;          /* that batch */
};

static struct mul_mat_items items_of(const struct ggml_py_tensor *dst, int64_t q) {
    const struct ggml_py_tensor *src1 = dst->src[1];
    struct mul_mat_items it = { q, (src1->ne[1] + TILE_M - 1) / TILE_M, 0, { NULL, NULL, 0, NULL }, -1 };
    it.n_items = it.q * it.blocks_m * src1->ne[2] * src1->ne[3];
    return it;
}

/* Item `item`'s r, and its src1 rows [*m0, *m_end); it->b describes its batch (found
 * again only when the batch changes). */
static int64_t place_item(const struct ggml_py_compute_params *params, const struct ggml_py_tensor *dst,
                          struct mul_mat_items *it, int64_t item, int64_t *m0, int64_t *m_end) {
    const int64_t batch = item / (it->q * it->blocks_m);
    if (batch != it->b_index) {
        it->b_index = batch;
        it->b = batch_at(params, dst, batch);
    }
    *m0 = (item / it->q) % it->blocks_m * TILE_M;
    *m_end = GGML_PY_MIN(*m0 + TILE_M, dst->src[1]->ne[1]);
    return item % it->q;
}

/* The CPU profile over src0's rows8 (a single matrix, its rows interleaved by eight):
 * work items (batch, block of TILE_M src1 rows, r), r fastest, each two groups of eight
 * rows, r and r + h (h: half the groups, rounded up; the last item's second group may
 * not exist). A thread taking consecutive items reads two sequential streams of the
 * copy, one from each half (one stream alone kept too few reads in flight). */
static void compute_rows8(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst,
                          ggml_py_gemm_rows8_fn kernel) {
    const struct ggml_py_tensor *src0 = dst->src[0], *src1 = dst->src[1];
    GGML_PY_BINARY_LOCALS(src0, src1, dst);
    /* eight interleaved rows take eight packed rows' bytes: group g starts at row 8g's */
    const size_t group_bytes = 8 * ggml_py_row_size(src0->type, ne00);
    const int64_t groups = ne01 / 8, h = (groups + 1) / 2;
    const int64_t ldd = (int64_t) (nb1 / sizeof(float));
    struct mul_mat_items it = items_of(dst, h);
    struct ggml_py_items taken = { 0, 0 };
    for (int64_t item; (item = ggml_py_next_item(params, it.n_items, &taken)) >= 0;) {
        int64_t m0, m_end;
        const int64_t r = place_item(params, dst, &it, item, &m0, &m_end);
        const struct mul_mat_batch b = it.b;
        const char *x = (const char *) src0->rows8 + r * group_bytes;
        const char *x2 = r + h < groups ? x + h * group_bytes : NULL;
        float *d = (float *) (b.d + m0 * nb1) + 8 * r;
        const struct ggml_py_q8_0_terms *yt = b.yt ? b.yt + m0 * (ne10 / GGML_PY_QK8_0) : NULL;
        kernel(ne00, (int) (m_end - m0), x, x2, b.y + m0 * b.by, b.by, yt, d, x2 ? d + 8 * h : NULL, ldd);
    }
}

/* Work items: (batch, block of TILE_M src1 rows, row group r), r fastest. With a
 * blocked kernel, group r is src0 rows r, r + q, r + 2q and r + 3q (q a quarter of
 * the rows, rounded up): a thread taking consecutive groups reads four sequential
 * streams of weights, block by block, each row fetched from memory once per block
 * of src1 rows (the kernel re-reads it from cache per pair of them), and runs
 * independent chains of fmas. (On an AMD EPYC VM four neighbouring Q4_0 rows read
 * block by block took 4.5 ms where one row at a time took 2.6 and four far-apart
 * rows 1.8; two neighbouring Q8_0 rows ran at under a third of one row's speed.)
 * vec_dot reads a whole row at a time, and there group r is VEC_DOT_ROWS
 * neighbouring rows: one stream (four far-apart rows read row by row ran at x0.45).
 * The blocked kernels run at M = 1 too (F16's tile sums in another order than
 * vec_dot_f16, and a row's result must not depend on the batch it comes in). A
 * wide tile (Q4_0, Q8_0 below M = 8) takes eight far-apart rows as a tile takes four. A
 * panel kernel (Q4_0, Q8_0, Q4_K - Q6_K from M = 8) takes group r as rows 8r .. 8r + 7
 * and all of the item's src1 rows: it interleaves the rows once per item, and they
 * are written side by side. A src0 with its rows interleaved already (rows8) goes to
 * compute_rows8. */
static void compute_cpu(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    const struct ggml_py_tensor *src0 = dst->src[0], *src1 = dst->src[1];
    GGML_PY_BINARY_LOCALS(src0, src1, dst);
    const ggml_py_vec_dot_fn vec_dot = ggml_py_get_type_traits(src0->type)->vec_dot;
    const ggml_py_gemm_panel_fn panel = panel_for(dst);
    const ggml_py_gemm_tile_fn wide = !panel && wide_for_type ? wide_for_type(src0->type, ne11) : NULL;
    const ggml_py_gemm_tile_fn tile = wide ? wide : !panel && tile_for_type ? tile_for_type(src0->type, ne11) : NULL;
    const int64_t group = panel ? GGML_PY_PANEL_ROWS : wide ? GGML_PY_WIDE_R0
                        : tile ? GGML_PY_GEMM_R0 : VEC_DOT_ROWS;     /* rows in a group */
    const int64_t cols = wide ? GGML_PY_WIDE_R1 : GGML_PY_GEMM_R1;   /* src1 rows of a tile */
    const int64_t q = (ne01 + group - 1) / group;                    /* groups */
    const int64_t step = tile ? q : 1;                               /* between their rows */
    const int64_t ldd = (int64_t) (nb1 / sizeof(float));
    struct mul_mat_items it = items_of(dst, q);
    struct ggml_py_items taken = { 0, 0 };
    for (int64_t item; (item = ggml_py_next_item(params, it.n_items, &taken)) >= 0;) {
        int64_t m0, m_end;
        const int64_t r = place_item(params, dst, &it, item, &m0, &m_end);
        const struct mul_mat_batch b = it.b;
        const int64_t first = tile ? r : r * group;
        const int nr0 = (int) GGML_PY_MIN(group, (ne01 - first + step - 1) / step);   /* rows < N */
        const char *x = b.x + first * nb01;
        const size_t bx = step * nb01;
        if (panel) {   /* neighbouring rows, all of the block of src1 rows at once */
            const struct ggml_py_q8_0_terms *yt = b.yt ? b.yt + m0 * (ne10 / GGML_PY_QK8_0) : NULL;
            panel(ne00, nr0, (int) (m_end - m0), x, nb01, b.y + m0 * b.by, b.by, yt,
                  (float *) (b.d + m0 * nb1) + first, ldd);
            continue;
        }
        if (!tile) {   /* neighbouring rows (step 1), one src1 row at a time */
            for (int64_t i11 = m0; i11 < m_end; i11++) {
                float *d = (float *) (b.d + i11 * nb1) + first;
                for (int i = 0; i < nr0; i++) vec_dot(ne00, &d[i], x + i * nb01, b.y + i11 * b.by);
            }
            continue;
        }
        for (int64_t i11 = m0; i11 < m_end; i11 += cols) {
            const int nr1 = (int) GGML_PY_MIN(cols, m_end - i11);
            tile(ne00, nr0, nr1, x, bx, b.y + i11 * b.by, b.by, (float *) (b.d + i11 * nb1) + first, ldd, step);
        }
    }
}

/* ---- BLAS profiles ------------------------------------------------------------ */

#if defined(GGML_PY_USE_BLAS)

/* De-quantize rows [ir0, ir1) of src0 (rows of all batches counted in order)
 * into f32 rows; row ir lands at out + (ir - ir_base) * ne00. */
static void dequantize_src0_rows(const struct ggml_py_tensor *src0, float *out, int64_t ir0, int64_t ir1,
                                 int64_t ir_base) {
    const ggml_py_to_float_fn to_float = ggml_py_get_type_traits(src0->type)->to_float;
    const int64_t ne00 = src0->ne[0], ne01 = src0->ne[1], ne02 = src0->ne[2];
    for (int64_t ir = ir0; ir < ir1; ir++) {
        const int64_t i01 = ir % ne01, i02 = (ir / ne01) % ne02, i03 = ir / (ne01 * ne02);
        const char *s = (const char *) src0->data + i01 * src0->nb[1] + i02 * src0->nb[2] + i03 * src0->nb[3];
        to_float(s, out + (ir - ir_base) * ne00, ne00);
    }
}

static void compute_blas(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst, bool split) {
    const struct ggml_py_tensor *src0 = dst->src[0], *src1 = dst->src[1];
    GGML_PY_BINARY_LOCALS(src0, src1, dst);
    const int64_t r2 = ne12 / ne02, r3 = ne13 / ne03;
    const bool f32 = src0->type == GGML_PY_TYPE_F32;
    int64_t have = -1;   /* the src0 batch now in the work buffer (blas) */
    for (int64_t i13 = 0; i13 < ne13; i13++) {
        for (int64_t i12 = 0; i12 < ne12; i12++) {
            const int64_t i02 = i12 / r2, i03 = i13 / r3, b0 = i03 * ne02 + i02;
            const float *a;
            blasint lda = (blasint) ne00;     /* de-quantized rows are packed */
            if (f32) {
                lda = (blasint) (nb01 / sizeof(float));
                a = (const float *) ((const char *) src0->data + i02 * nb02 + i03 * nb03);
            } else if (split) {
                a = (const float *) params->wdata + b0 * ne01 * ne00;
            } else {
                if (have != b0) {
                    dequantize_src0_rows(src0, (float *) params->wdata, b0 * ne01, (b0 + 1) * ne01, b0 * ne01);
                    have = b0;
                }
                a = (const float *) params->wdata;
            }
            const float *b = (const float *) ((const char *) src1->data + i12 * nb12 + i13 * nb13);
            float *c = (float *) ((char *) dst->data + i12 * nb2 + i13 * nb3);
            /* c (M x N) = b (M x K) * a^T (a: N x K); b is contiguous, its rows ne10 apart
             * (nb11 may be anything when M = 1: a dimension of one has no stride) */
            scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint) ne11, (blasint) ne01,
                              (blasint) ne00, 1.0f, b, (blasint) ne10, a, lda,
                              0.0f, c, (blasint) (nb1 / sizeof(float)));
        }
    }
}

static void init_blas_split(const struct ggml_py_compute_params *params, const struct ggml_py_tensor *dst) {
    const struct ggml_py_tensor *src0 = dst->src[0];
    struct ggml_py_items taken = { 0, 0 };
    const int64_t n_rows = src0->ne[1] * src0->ne[2] * src0->ne[3];
    for (int64_t ir; (ir = ggml_py_next_item(params, n_rows, &taken)) >= 0;) {
        dequantize_src0_rows(src0, (float *) params->wdata, ir, ir + 1, 0);
    }
}

#endif /* GGML_PY_USE_BLAS */

void ggml_py_compute_mul_mat(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
#if defined(GGML_PY_USE_BLAS)
    /* the BLAS COMPUTE stages are one thread's work: flagged parallel by hand,
     * the other threads have nothing to do (never a second sgemm into dst) */
    if (dst->profile.id != GGML_PY_MUL_MAT_CPU && params->stage == GGML_PY_STAGE_COMPUTE &&
        params->ith != 0) {
        return;
    }
#endif
    switch (dst->profile.id) {
#if defined(GGML_PY_USE_BLAS)
        case GGML_PY_MUL_MAT_BLAS:
            if (params->stage == GGML_PY_STAGE_COMPUTE) compute_blas(params, dst, false);
            return;
        case GGML_PY_MUL_MAT_BLAS_SPLIT:
            if (params->stage == GGML_PY_STAGE_INIT && !src0_is_f32(dst)) init_blas_split(params, dst);
            if (params->stage == GGML_PY_STAGE_COMPUTE) compute_blas(params, dst, !src0_is_f32(dst));
            return;
        case GGML_PY_MUL_MAT_BLAS_MT:
            if (params->stage == GGML_PY_STAGE_INIT && !src0_is_f32(dst)) init_blas_split(params, dst);
            if (params->stage == GGML_PY_STAGE_COMPUTE) {
                /* the pool sleeps (wait flag); lend its threads to OpenBLAS for this call */
                scipy_openblas_set_num_threads(params->n_threads > 0 ? params->n_threads : 1);
                compute_blas(params, dst, !src0_is_f32(dst));
                scipy_openblas_set_num_threads(1);
            }
            return;
#endif
        default:
            if (params->stage == GGML_PY_STAGE_INIT && src1_needs_conversion(dst)) convert_src1(params, dst);
            if (params->stage == GGML_PY_STAGE_COMPUTE) {
                const ggml_py_gemm_rows8_fn rows8 = rows8_for(dst);
                if (rows8) compute_rows8(params, dst, rows8);
                else compute_cpu(params, dst);
            }
            return;
    }
}
