/* exec.c - the graph executor: for each node, for each valid stage, run the
 * kernel on the main thread alone or on every thread of the pool. */
#include "ggml_py.h"
#include "ggml_py_pool.h"
#include "impl.h"

#include <string.h>

struct stage_task {
    struct ggml_py_tensor *node;
    const struct ggml_py_cplan *plan;
    int stage;
    int32_t *error;
    int32_t n_threads;
    int64_t next_item;   /* the stage's work-item counter */
};

static void run_stage_share(void *arg, int ith, int nth) {
    struct stage_task *task = arg;
    const struct ggml_py_compute_params params = {
        .stage = task->stage,
        .ith   = ith,
        .nth   = nth,
        .wsize = task->plan->work_size,
        .wdata = task->plan->work_data,
        .error = task->error,
        .n_threads = task->n_threads,
        .next_item = &task->next_item,
    };
    ggml_py_compute_forward(&params, task->node);
}

/* Look-ahead for wait_on_task_done: does a parallel stage come within the next
 * `lookahead` valid stages, before any single-thread stage that sleeps anyway?
 * A lookahead of 0 turns the look-ahead off (workers never sleep early). */
static int parallel_stage_follows(const struct ggml_py_cgraph *graph, int i_node, int stage,
                                  int lookahead) {
    if (lookahead <= 0) return 1;
    int scanned = 0;
    for (int i = i_node; i < graph->n_nodes && scanned < lookahead; i++) {
        const struct ggml_py_tensor *node = graph->nodes[i];
        for (int s = (i == i_node ? stage + 1 : 0); s < GGML_PY_N_STAGES; s++) {
            const struct ggml_py_stage_flags f = node->profile.stages[s];
            if (!f.valid) continue;
            if (f.parallel) return 1;
            if (f.wait) return 0;
            if (++scanned >= lookahead) return 0;
        }
    }
    return 0;
}

static int compute_nodes(const struct ggml_py_cgraph *graph, const struct ggml_py_cplan *plan,
                         struct ggml_py_pool *pool) {
    const int n_threads = pool ? pool->n_threads : 1;
    int64_t t_last_check = plan->abort_callback ? ggml_py_time_ns() : 0;
    int32_t error = GGML_PY_STATUS_OK;   /* written by kernels, read after each stage */

    for (int i = 0; i < graph->n_nodes; i++) {
        struct ggml_py_tensor *node = graph->nodes[i];

        if (plan->abort_callback) {
            const int64_t now = ggml_py_time_ns();
            if (now - t_last_check >= plan->abort_interval_ns) {
                t_last_check = now;
                if (plan->abort_callback(plan->abort_data)) return GGML_PY_STATUS_ABORTED;
            }
        }

        for (int s = 0; s < GGML_PY_N_STAGES; s++) {
            const struct ggml_py_stage_flags f = node->profile.stages[s];
            if (!f.valid) continue;
            const int64_t t_start = plan->stage_ns ? ggml_py_time_ns() : 0;
            struct stage_task task = { .node = node, .plan = plan, .stage = s, .error = &error,
                                       .n_threads = n_threads };

            if (f.parallel && n_threads > 1) {
                const int sleep_after = !parallel_stage_follows(graph, i, s, plan->lookahead);
                ggml_py_pool_run(pool, run_stage_share, &task, sleep_after);
            } else {
                if (f.wait && n_threads > 1) ggml_py_pool_wait_now(pool);
                run_stage_share(&task, 0, 1);
            }
            if (plan->stage_ns) {
                plan->stage_ns[i * GGML_PY_N_STAGES + s] += ggml_py_time_ns() - t_start;
            }
            /* the pool's completion barrier orders the workers' writes before this read */
            if (__atomic_load_n(&error, __ATOMIC_ACQUIRE) != GGML_PY_STATUS_OK) {
                if (plan->failed_node) *plan->failed_node = i;
                return error;
            }
        }
    }
    return GGML_PY_STATUS_OK;
}

int ggml_py_graph_compute(const struct ggml_py_cgraph *graph, const struct ggml_py_cplan *plan,
                          struct ggml_py_pool *pool) {
    ggml_py_compute_begins();
    const int status = compute_nodes(graph, plan, pool);
    ggml_py_compute_ends();
    return status;
}

size_t ggml_py_graph_work_size(const struct ggml_py_cgraph *graph, int n_threads) {
    size_t work_size = 0;
    for (int i = 0; i < graph->n_nodes; i++) {
        const size_t size = ggml_py_node_work_size(graph->nodes[i], n_threads);
        if (size > work_size) work_size = size;
    }
    if (work_size > 0) work_size += GGML_PY_CACHE_LINE * (size_t) n_threads;
    return work_size;
}
