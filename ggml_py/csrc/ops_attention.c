/* ops_attention.c - ATTENTION: softmax(scale * q k^T) v over a list of cache slots per token.
 *
 * q:        F32 (ne0 = D, ne1 = H, ne2 = T), rows of D contiguous
 * k, v:     the cache pools, (ne0 = n*D, ne1 = slots, ne2 = Hkv / n): n heads of a slot side
 *           by side in a row (n = Hkv: a token's heads in one row; n = 1: head-major, each
 *           head's rows one after the other, the model's caches). F32, F16, Q8_0, Q4_0, I8
 *           (int8 per head, its scales in src[4] (k) and src[5] (v): F32 (ne0 = n, ne1 =
 *           slots, ne2 = Hkv / n)), or any type with a vec_dot (k) and a to_float (v); query
 *           head h reads kv head h / (H / Hkv), head g is row part g % n of plane g / n
 * kv_index: I32, 2*T + N values: for token t the pair (start, count) at [2t, 2t+1] names
 *           the slots it attends to, index[start .. start+count), which lie in the N
 *           values after the pairs (tokens of one sequence share one list, in position order)
 * dst:      F32 (ne0 = D, ne1 = H, ne2 = T); a token with no slots gets zeros
 *
 * A work item is a kv head and a block of up to ROWS / G tokens: its rows are the G query
 * heads of that kv head for each token, and tokens with the same list (one sequence) share
 * every K and V row read (fewer tokens a block where that leaves too few items for the
 * threads: a block's size changes how the work is shared, never a row's numbers). The
 * profiles (enum ggml_py_attention_profile) differ in how the scores of an item's rows
 * are held:
 *   slim   the whole score row-block (rows x the longest list) in the thread's buffer:
 *          scores, softmax in place, times V; no correction (SlimAttention)
 *   flash  tiles of KEYS keys: scores of the tile, a running max and sum per row, the
 *          accumulated output rescaled when the max grows (online softmax)
 *   auto   each token by the length of its own list: slim up to a limit (op_params[1] > 0;
 *          < 0: none, flash for all; 0: the keys whose scores fill SLIM_MAX_SCORE_BYTES),
 *          flash past it - never by the other tokens of the step, so that a batch stays
 *          bitwise invariant
 * Each item is computed by one thread start to end, and each row's numbers by operations
 * that do not depend on the other rows of the item (attn.h): a token's result depends on its
 * own query row and slots only - not on the other tokens of the batch, the thread count or
 * which thread ran it (batches are bitwise invariant under both profiles).
 */
#include "attn.h"
#include "impl.h"

#define ROWS 64   /* query rows per work item at most (heads x tokens), G when G is larger */
#define ITEMS_PER_THREAD 4   /* fewer tokens a block rather than fewer items than this */
#define LIMIT_ROWS 32   /* the rows auto's default limit is reckoned for: a constant, so that
                           the limit never moves with the batch or the threads */
#define KEYS 64   /* keys per tile: flash's tile, and slim's passes over the keys */

/* auto's default limit: slim while a block's score buffer stays small (docs/attention.md) */
#define SLIM_MAX_SCORE_BYTES (1 << 20)

struct attn_shape {
    int64_t D, H, T, Hkv, G;
    int64_t tokens;      /* tokens per work item at most */
    int64_t rows;        /* rows per work item at most: G * tokens */
    int64_t n_slots;     /* slots in the pools */
    int64_t longest;     /* the longest list a token can have */
    int64_t slim_limit;  /* auto: slim for a token with at most this many slots */
};

static struct attn_shape shape_of(const struct ggml_py_tensor *node) {
    const struct ggml_py_tensor *q = node->src[0], *k = node->src[1], *index = node->src[3];
    struct attn_shape s;
    s.D = q->ne[0], s.H = q->ne[1], s.T = q->ne[2];
    s.Hkv = k->ne[0] / s.D * k->ne[2], s.G = s.H / s.Hkv;
    s.tokens = GGML_PY_MAX(1, ROWS / s.G);
    s.rows = s.G * s.tokens;
    s.n_slots = k->ne[1];
    s.longest = GGML_PY_MAX(0, GGML_PY_MIN(s.n_slots, index->ne[0] - 2 * s.T));
    s.slim_limit = node->op_params[1] > 0 ? node->op_params[1] : node->op_params[1] < 0 ? 0
                 : (int64_t) (SLIM_MAX_SCORE_BYTES / (sizeof(float) * s.G * GGML_PY_MAX(1, LIMIT_ROWS / s.G)));
    return s;
}

/* Per-thread scratch: the prepared query rows, the scores (slim: rows x longest; flash:
 * rows x KEYS), the output accumulators, and flash's running max and sum. */
struct attn_scratch {
    char *q;
    float *S, *acc, *max, *sum;
    int64_t lds;
};

static size_t scratch_bytes(const struct attn_shape *s, int profile, int64_t *lds) {
    const int64_t slim = profile == GGML_PY_ATTENTION_AUTO ? GGML_PY_MIN(s->longest, s->slim_limit) : s->longest;
    *lds = profile == GGML_PY_ATTENTION_FLASH ? KEYS : GGML_PY_MAX(KEYS, (slim + 7) / 8 * 8);
    return (size_t) s->rows * (ggml_py_attn_q_bytes(s->D) +
                               sizeof(float) * ((size_t) *lds + (size_t) s->D + 2));
}

static struct attn_scratch scratch_of(const struct ggml_py_compute_params *params,
                                      const struct attn_shape *s, int profile) {
    struct attn_scratch w;
    const size_t per_thread = (scratch_bytes(s, profile, &w.lds) + GGML_PY_CACHE_LINE - 1)
                              / GGML_PY_CACHE_LINE * GGML_PY_CACHE_LINE + GGML_PY_CACHE_LINE;
    char *base = (char *) params->wdata + params->ith * per_thread;
    w.q = base;
    w.S = (float *) (base + s->rows * ggml_py_attn_q_bytes(s->D));
    w.acc = w.S + s->rows * w.lds;
    w.max = w.acc + s->rows * s->D;
    w.sum = w.max + s->rows;
    return w;
}

size_t ggml_py_attention_work_size(const struct ggml_py_tensor *node, int n_threads) {
    const struct attn_shape s = shape_of(node);
    int64_t lds;
    const size_t per_thread = (scratch_bytes(&s, node->profile.id, &lds) + GGML_PY_CACHE_LINE - 1)
                              / GGML_PY_CACHE_LINE * GGML_PY_CACHE_LINE + GGML_PY_CACHE_LINE;
    return (size_t) n_threads * per_thread;
}

/* A token's slot list lies after the (start, count) pairs and holds valid slots
 * (the index is data written per step: a bad one is reported, never followed). The tokens
 * of a sequence share one list, each reading a longer part of it, so a thread remembers
 * how much of the last list it checked and, for a token of that list, checks only the
 * rest. */
struct checked_list { int32_t start, count; };

static bool index_ok(int32_t start, int32_t count, int64_t first, int64_t n_index,
                     const int32_t *index, int64_t n_slots, struct checked_list *checked) {
    if (count < 0 || count > n_slots || start < first || start + (int64_t) count > n_index) return false;
    const int32_t from = start == checked->start ? GGML_PY_MIN(count, checked->count) : 0;
    for (int32_t j = from; j < count; j++)
        if (index[start + j] < 0 || index[start + j] >= n_slots) return false;
    if (start != checked->start || count > checked->count) *checked = (struct checked_list) { start, count };
    return true;
}

/* The rows of kv head g of a pool (and its scales) over one list: part g % n of a row of
 * plane g / n, n heads a row. */
static struct ggml_py_attn_rows rows_of(const struct ggml_py_tensor *pool, const struct ggml_py_tensor *scales,
                                        int64_t g, int64_t D, const int32_t *slots, int64_t n_slots) {
    const int64_t n = pool->ne[0] / D;
    struct ggml_py_attn_rows x;
    x.base = (const char *) pool->data + g / n * pool->nb[2] + g % n * ggml_py_row_size(pool->type, D);
    x.stride = pool->nb[1];
    x.scale = scales ? (const char *) scales->data + g / n * scales->nb[2] + g % n * sizeof(float) : NULL;
    x.scale_stride = scales ? scales->nb[1] : 0;
    x.slots = slots;
    x.n_slots = n_slots;
    x.type = pool->type;
    x.row_bytes = (int32_t) ggml_py_row_size(pool->type, D);
    return x;
}

/* One run of tokens with the same list: nr rows, row r's list length count[r / G]. */
struct attn_run {
    int64_t nr, longest;
    const int32_t *count;          /* per token of the run: index[2t + 1] */
    struct ggml_py_attn_rows k, v;
};

static inline int64_t count_of(const struct attn_run *run, int64_t G, int64_t r) {
    return run->count[2 * (r / G)];
}

/* slim: every score of the run's rows, softmax in place, times V (into w->acc) */
static void run_slim(const struct attn_run *run, const struct attn_shape *s, const struct attn_scratch *w,
                     const struct ggml_py_attn_kernels *kern, float scale) {
    const ggml_py_attn_exp_sum_fn exp_sum = ggml_py_attn_exp_sum();
    const ggml_py_attn_max_fn max_of = ggml_py_attn_max();
    const size_t qb = ggml_py_attn_q_bytes(s->D);
    for (int64_t j0 = 0; j0 < run->longest; j0 += KEYS) {
        kern->scores(s->D, run->nr, w->q, qb, &run->k, j0, GGML_PY_MIN(KEYS, run->longest - j0),
                     w->S + j0, w->lds, scale);
        for (int64_t j = j0; j < GGML_PY_MIN(j0 + KEYS, run->longest); j++) ggml_py_attn_prefetch_row(&run->v, j);
    }
    for (int64_t r = 0; r < run->nr; r++) {
        float *sr = w->S + r * w->lds;
        const int64_t count = count_of(run, s->G, r);
        if (count > 0) {
            const float inv = 1.0f / exp_sum(count, sr, max_of(count, sr));
            for (int64_t j = 0; j < count; j++) sr[j] *= inv;
        }
        for (int64_t j = count; j < run->longest; j++) sr[j] = 0.0f;   /* not this row's keys */
    }
    memset(w->acc, 0, sizeof(float) * run->nr * s->D);
    kern->pv(s->D, run->nr, w->S, w->lds, &run->v, 0, run->longest, w->acc);
}

/* flash: tiles of KEYS keys with a running max and sum per row (into w->acc) */
static void run_flash(const struct attn_run *run, const struct attn_shape *s, const struct attn_scratch *w,
                      const struct ggml_py_attn_kernels *kern, float scale) {
    const ggml_py_attn_exp_sum_fn exp_sum = ggml_py_attn_exp_sum();
    const ggml_py_attn_max_fn max_of = ggml_py_attn_max();
    const size_t qb = ggml_py_attn_q_bytes(s->D);
    const int64_t D = s->D;
    for (int64_t r = 0; r < run->nr; r++) w->max[r] = -INFINITY, w->sum[r] = 0.0f;
    memset(w->acc, 0, sizeof(float) * run->nr * D);
    for (int64_t j0 = 0; j0 < run->longest; j0 += KEYS) {
        const int64_t n = GGML_PY_MIN(KEYS, run->longest - j0);
        kern->scores(D, run->nr, w->q, qb, &run->k, j0, n, w->S, w->lds, scale);
        for (int64_t r = 0; r < run->nr; r++) {
            float *sr = w->S + r * w->lds;
            const int64_t valid = GGML_PY_MAX(0, GGML_PY_MIN(n, count_of(run, s->G, r) - j0));
            const float tile_max = max_of(valid, sr);
            const float max = tile_max > w->max[r] ? tile_max : w->max[r];
            if (valid > 0) {
                /* exp(old max - new max): 0 for the first tile (-inf), 1 when it holds */
                const float corr = ggml_py_attn_exp_ref(w->max[r] - max);
                const float e = exp_sum(valid, sr, max);
                if (corr != 1.0f) {
                    float *a = w->acc + r * D;
                    for (int64_t d = 0; d < D; d++) a[d] = a[d] * corr;
                }
                w->sum[r] = w->sum[r] * corr + e;
                w->max[r] = max;
            }
            for (int64_t j = valid; j < n; j++) sr[j] = 0.0f;
        }
        kern->pv(D, run->nr, w->S, w->lds, &run->v, j0, n, w->acc);
    }
    for (int64_t r = 0; r < run->nr; r++) {
        if (w->sum[r] > 0.0f) {
            const float inv = 1.0f / w->sum[r];
            float *a = w->acc + r * D;
            for (int64_t d = 0; d < D; d++) a[d] = a[d] * inv;
        }
    }
}

void ggml_py_compute_attention(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    if (params->stage != GGML_PY_STAGE_COMPUTE) return;
    const struct ggml_py_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
    const int32_t *index = (const int32_t *) dst->src[3]->data;
    const int64_t n_index = dst->src[3]->ne[0];
    const struct attn_shape s = shape_of(dst);
    const int64_t D = s.D, G = s.G, T = s.T;
    const float scale = ggml_py_get_op_param_f32(dst, 0);
    const int profile = dst->profile.id;
    const struct attn_scratch w = scratch_of(params, &s, profile);
    struct ggml_py_attn_kernels kern;
    ggml_py_attn_kernels_for(k->type, v->type, &kern);
    const size_t qb = ggml_py_attn_q_bytes(D);

    /* a prompt's blocks of ROWS rows read each K and V row once for more query rows; a
     * step of few tokens takes smaller blocks, enough items for every thread */
    const int64_t tokens = GGML_PY_MAX(1, GGML_PY_MIN(s.tokens, T * s.Hkv / (ITEMS_PER_THREAD * params->nth)));
    const int64_t n_blocks = (T + tokens - 1) / tokens;
    struct ggml_py_items taken = { 0, 0 };
    struct checked_list checked = { -1, 0 };
    /* items of one kv head are consecutive (a thread's chunk reads the same K and V rows),
     * its last tokens first: in a prompt they have the longest lists, and the chunks taken
     * last, while the other threads run out of work, are then the shortest */
    for (int64_t item; (item = ggml_py_next_item(params, s.Hkv * n_blocks, &taken)) >= 0;) {
        const int64_t g = item / n_blocks, blk = n_blocks - 1 - item % n_blocks;
        const int64_t t_end = GGML_PY_MIN(T, (blk + 1) * tokens);
        bool ok = true;
        for (int64_t t = blk * tokens; t < t_end; t++)
            ok = ok && index_ok(index[2 * t], index[2 * t + 1], 2 * T, n_index, index, s.n_slots, &checked);
        if (!ok) {
            ggml_py_set_error(params, GGML_PY_STATUS_BAD_INDEX);
            continue;
        }
        /* runs of tokens with the same list (and, for auto, the same way) */
        for (int64_t t0 = blk * tokens, t1; t0 < t_end; t0 = t1) {
            int64_t longest = index[2 * t0 + 1];
            const int flash = profile == GGML_PY_ATTENTION_AUTO ? longest > s.slim_limit
                                                                : profile == GGML_PY_ATTENTION_FLASH;
            for (t1 = t0 + 1; t1 < t_end && index[2 * t1] == index[2 * t0] &&
                              (profile != GGML_PY_ATTENTION_AUTO || (index[2 * t1 + 1] > s.slim_limit) == flash); t1++)
                longest = GGML_PY_MAX(longest, index[2 * t1 + 1]);
            const int32_t *slots = index + index[2 * t0];
            struct attn_run run = {
                .nr = (t1 - t0) * G, .longest = longest, .count = index + 2 * t0 + 1,
                .k = rows_of(k, dst->src[4], g, D, slots, longest),
                .v = rows_of(v, dst->src[5], g, D, slots, longest),
            };
            for (int64_t r = 0; r < run.nr; r++) {
                const float *qr = (const float *) ((const char *) q->data + (g * G + r % G) * q->nb[1] +
                                                   (t0 + r / G) * q->nb[2]);
                kern.q_prep(k->type, D, qr, w.q + r * qb);
            }
            if (flash) run_flash(&run, &s, &w, &kern, scale);
            else run_slim(&run, &s, &w, &kern, scale);
            for (int64_t r = 0; r < run.nr; r++) {
                float *out = (float *) ((char *) dst->data + (g * G + r % G) * dst->nb[1] + (t0 + r / G) * dst->nb[2]);
                memcpy(out, w.acc + r * D, sizeof(float) * D);
            }
        }
    }
}

int ggml_py_attention_profiles(const struct ggml_py_tensor *node,
                               struct ggml_py_task_profile out[GGML_PY_MAX_PROFILES]) {
    GGML_PY_UNUSED(node);
    const char *names[3] = { "auto", "slim", "flash" };     /* the default first */
    const int ids[3] = { GGML_PY_ATTENTION_AUTO, GGML_PY_ATTENTION_SLIM, GGML_PY_ATTENTION_FLASH };
    for (int i = 0; i < 3; i++) {
        memset(&out[i], 0, sizeof(out[i]));
        out[i].id = ids[i];
        strncpy(out[i].name, names[i], sizeof(out[i].name) - 1);
        out[i].stages[GGML_PY_STAGE_COMPUTE] = (struct ggml_py_stage_flags) { .valid = 1, .parallel = 1 };
    }
    return 3;
}

int ggml_py_attention_default_profile_index(const struct ggml_py_tensor *node) {
    GGML_PY_UNUSED(node);
    return 0;   /* auto */
}
