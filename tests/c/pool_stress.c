/* pool_stress.c - the pool and executor driven from C, for ThreadSanitizer.
 *
 * Builds a small graph (mul_mat -> add -> soft_max -> rms_norm), then computes
 * it many times on pools of 2..4 threads under every waiting policy, with
 * random parallel/wait flags on every stage and random look-ahead, checking
 * each result bit for bit against a single-thread run. Then a pool whose worker
 * thread starts only at the end: every compute must finish without it (main
 * runs the shares it never claims) with the same bits.
 *
 *   cc -std=gnu11 -O1 -g -fsanitize=thread -Iinclude -Iggml_py/csrc -Iggml_py/csrc/quants \
 *      tests/c/pool_stress.c ggml_py/csrc/*.c -lm -lpthread -o pool_stress
 *   ./pool_stress [iterations]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_py.h"
#include "ggml_py_pool.h"

#define N_NODES 4

static struct ggml_py_tensor make_leaf(int64_t ne0, int64_t ne1, float *data) {
    struct ggml_py_tensor t;
    memset(&t, 0, sizeof(t));
    t.type = GGML_PY_TYPE_F32;
    t.ne[0] = ne0; t.ne[1] = ne1; t.ne[2] = 1; t.ne[3] = 1;
    t.nb[0] = sizeof(float); t.nb[1] = sizeof(float) * ne0;
    t.nb[2] = t.nb[1] * ne1; t.nb[3] = t.nb[2];
    t.data = data;
    return t;
}

static struct ggml_py_tensor make_node(int op, struct ggml_py_tensor *a, struct ggml_py_tensor *b,
                                       int64_t ne0, int64_t ne1, float *data, float param) {
    struct ggml_py_tensor t = make_leaf(ne0, ne1, data);
    t.op = op;
    t.src[0] = a;
    t.src[1] = b;
    memcpy(&t.op_params[0], &param, sizeof(param));
    t.profile = ggml_py_default_profile(&t);
    return t;
}

struct pool_with_threads {
    struct ggml_py_pool *pool;
    pthread_t threads[GGML_PY_MAX_THREADS];
};

static void start_pool(struct pool_with_threads *p, int n, int policy, int64_t spin_ns) {
    if (posix_memalign((void **) &p->pool, 64, sizeof(struct ggml_py_pool)) != 0) exit(2);
    if (ggml_py_pool_init(p->pool, n, policy, spin_ns) != 0) exit(2);
    for (int i = 1; i < n; i++) {
        pthread_create(&p->threads[i], NULL, ggml_py_pool_worker_main, &p->pool->workers[i]);
    }
}

static void stop_pool(struct pool_with_threads *p) {
    ggml_py_pool_stop(p->pool);
    for (int i = 1; i < p->pool->n_threads; i++) pthread_join(p->threads[i], NULL);
    ggml_py_pool_destroy(p->pool);
    free(p->pool);
}

int main(int argc, char **argv) {
    const int iterations = argc > 1 ? atoi(argv[1]) : 3000;
    enum { K = 40, N = 13, M = 5 };
    static float a_data[N * K], b_data[M * K], c_data[M * N];
    static float mm[M * N], sum[M * N], sm[M * N], out[M * N], expected[M * N];
    static unsigned char work[1 << 16];
    unsigned seed = 1;
    for (int i = 0; i < N * K; i++) a_data[i] = (float) rand_r(&seed) / RAND_MAX - 0.5f;
    for (int i = 0; i < M * K; i++) b_data[i] = (float) rand_r(&seed) / RAND_MAX - 0.5f;
    for (int i = 0; i < M * N; i++) c_data[i] = (float) rand_r(&seed) / RAND_MAX - 0.5f;

    struct ggml_py_tensor a = make_leaf(K, N, a_data), b = make_leaf(K, M, b_data);
    struct ggml_py_tensor c = make_leaf(N, M, c_data);
    struct ggml_py_tensor nodes[N_NODES] = {
        make_node(GGML_PY_OP_MUL_MAT, &a, &b, N, M, mm, 0.0f),
        make_node(GGML_PY_OP_ADD, &nodes[0], &c, N, M, sum, 0.0f),
        make_node(GGML_PY_OP_SOFT_MAX, &nodes[1], NULL, N, M, sm, 0.5f),
        make_node(GGML_PY_OP_RMS_NORM, &nodes[2], NULL, N, M, out, 1e-6f),
    };
    nodes[1].src[0] = &nodes[0];   /* the initialiser above read them before they existed */
    nodes[2].src[0] = &nodes[1];
    nodes[3].src[0] = &nodes[2];
    struct ggml_py_tensor *order[N_NODES] = { &nodes[0], &nodes[1], &nodes[2], &nodes[3] };
    struct ggml_py_cgraph graph = { .n_nodes = N_NODES, .nodes = order };
    struct ggml_py_cplan plan = { .work_size = sizeof(work), .work_data = work, .lookahead = 4 };

    if (ggml_py_graph_work_size(&graph, 4) > sizeof(work)) return 2;
    if (ggml_py_graph_compute(&graph, &plan, NULL) != GGML_PY_STATUS_OK) return 3;
    memcpy(expected, out, sizeof(out));

    struct pool_with_threads pools[4];
    start_pool(&pools[0], 2, GGML_PY_WAIT_SPIN_THEN_SLEEP, 20000);
    start_pool(&pools[1], 3, GGML_PY_WAIT_SLEEP, 0);
    start_pool(&pools[2], 4, GGML_PY_WAIT_SPIN, 0);
    start_pool(&pools[3], 2, GGML_PY_WAIT_SPIN_THEN_SLEEP, 0);

    for (int it = 0; it < iterations; it++) {
        for (int i = 0; i < N_NODES; i++) {
            for (int s = 0; s < GGML_PY_N_STAGES; s++) {
                nodes[i].profile.stages[s].parallel = rand_r(&seed) & 1;
                nodes[i].profile.stages[s].wait = rand_r(&seed) & 1;
            }
        }
        plan.lookahead = rand_r(&seed) % 6;
        memset(out, 0, sizeof(out));
        if (ggml_py_graph_compute(&graph, &plan, pools[it % 4].pool) != GGML_PY_STATUS_OK) return 3;
        if (memcmp(out, expected, sizeof(out)) != 0) {
            fprintf(stderr, "iteration %d: result differs from the single-thread run\n", it);
            return 1;
        }
    }
    for (int i = 0; i < 4; i++) stop_pool(&pools[i]);

    /* a worker that never comes: its thread is started only after the computes */
    struct ggml_py_pool *late;
    if (posix_memalign((void **) &late, 64, sizeof(*late)) != 0) return 2;
    if (ggml_py_pool_init(late, 2, GGML_PY_WAIT_SPIN_THEN_SLEEP, 20000) != 0) return 2;
    for (int i = 0; i < N_NODES; i++) {
        for (int s = 0; s < GGML_PY_N_STAGES; s++) {
            nodes[i].profile.stages[s].parallel = 1;
            nodes[i].profile.stages[s].wait = 0;
        }
    }
    for (int it = 0; it < 200; it++) {
        /* the second half: any stolen share counts as lateness, so main runs alone */
        if (it == 100) late->late_ns = 0;
        memset(out, 0, sizeof(out));
        if (ggml_py_graph_compute(&graph, &plan, late) != GGML_PY_STATUS_OK) return 3;
        if (memcmp(out, expected, sizeof(out)) != 0) {
            fprintf(stderr, "late worker, iteration %d: result differs from the single-thread run\n", it);
            return 1;
        }
    }
    if (late->n_stolen == 0 || late->n_solo_stages == 0) {
        fprintf(stderr, "late worker: main ran %lld of its shares and %lld stages alone\n",
                (long long) late->n_stolen, (long long) late->n_solo_stages);
        return 1;
    }
    pthread_t thread;
    ggml_py_pool_stop(late);
    pthread_create(&thread, NULL, ggml_py_pool_worker_main, &late->workers[1]);
    pthread_join(thread, NULL);
    ggml_py_pool_destroy(late);
    free(late);
    printf("pool_stress: %d computes OK\n", iterations);
    return 0;
}
