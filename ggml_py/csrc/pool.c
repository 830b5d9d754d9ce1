/* pool.c - spin-then-sleep worker pool with wait_now and wait_on_task_done. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   /* sched_getaffinity, CPU_COUNT */
#endif
#include "ggml_py_pool.h"

#include <sched.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void cpu_relax(void) { _mm_pause(); }
#else
static inline void cpu_relax(void) { }
#endif

/* A spinning thread yields its core only when the pool has more threads than
 * the machine has cores (then the thread it waits for may need this core):
 * otherwise sched_yield would hand the core to any runnable task, low-priority
 * ones included, for a whole time slice. A thread that has spun its budget
 * sleeps instead (workers on `cond`, the main thread on `done`). */
#define YIELD_EVERY 256

static inline void spin_once(const struct ggml_py_pool *pool, uint32_t iter) {
    if (pool->oversubscribed && iter % YIELD_EVERY == 0) {
        sched_yield();
    } else {
        cpu_relax();
    }
}

int64_t ggml_py_time_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The CPUs this process may run on (its affinity: taskset, a cpuset, an MPI rank
 * bound to cores), or every online one where that cannot be read. */
static long usable_cpus(void) {
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
#endif
    return sysconf(_SC_NPROCESSORS_ONLN);
}

int ggml_py_pool_init(struct ggml_py_pool *pool, int n_threads, int policy, int64_t spin_ns) {
    if (n_threads < 1 || n_threads > GGML_PY_MAX_THREADS) return -1;
    if (policy < GGML_PY_WAIT_SPIN_THEN_SLEEP || policy > GGML_PY_WAIT_SLEEP) return -1;
    memset(pool, 0, sizeof(*pool));
    pool->n_threads = n_threads;
    pool->policy    = policy;
    pool->spin_ns   = spin_ns;
    pool->oversubscribed = n_threads > usable_cpus();
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->n_pending, 0);
    atomic_init(&pool->wait_now, 0);
    atomic_init(&pool->n_sleeping, 0);
    atomic_init(&pool->main_sleeping, 0);
    atomic_init(&pool->n_sleeps, 0);
    atomic_init(&pool->n_wakeups, 0);
    if (pthread_mutex_init(&pool->mutex, NULL) != 0) return -1;
    if (pthread_cond_init(&pool->cond, NULL) != 0) {
        pthread_mutex_destroy(&pool->mutex);
        return -1;
    }
    if (pthread_cond_init(&pool->done, NULL) != 0) {
        pthread_cond_destroy(&pool->cond);
        pthread_mutex_destroy(&pool->mutex);
        return -1;
    }
    for (int i = 0; i < n_threads; i++) {
        pool->workers[i].pool = pool;
        pool->workers[i].ith  = i;
    }
    return 0;
}

/* Sleep until `generation` moves past `seen`. The increment of n_sleeping and the
 * re-read of generation are seq_cst, mirrored in publish(): either main sees
 * this sleeper and broadcasts under the mutex, or we see the new generation. */
static int sleep_until_new_generation(struct ggml_py_pool *pool, int seen) {
    pthread_mutex_lock(&pool->mutex);
    atomic_fetch_add_explicit(&pool->n_sleeping, 1, memory_order_seq_cst);
    atomic_fetch_add_explicit(&pool->n_sleeps, 1, memory_order_relaxed);
    int gen;
    while ((gen = atomic_load_explicit(&pool->generation, memory_order_seq_cst)) == seen) {
        pthread_cond_wait(&pool->cond, &pool->mutex);
    }
    atomic_fetch_sub_explicit(&pool->n_sleeping, 1, memory_order_seq_cst);
    pthread_mutex_unlock(&pool->mutex);
    return gen;
}

/* Wait for the next generation: spin (bounded by policy), then sleep. */
static int wait_for_task(struct ggml_py_pool *pool, int seen, int skip_spin) {
    if (!skip_spin && pool->policy != GGML_PY_WAIT_SLEEP) {
        const int64_t t_start = ggml_py_time_ns();
        for (uint32_t iter = 1;; iter++) {
            int gen = atomic_load_explicit(&pool->generation, memory_order_acquire);
            if (gen != seen) return gen;
            if (atomic_load_explicit(&pool->wait_now, memory_order_relaxed)) break;
            spin_once(pool, iter);
            if (pool->policy == GGML_PY_WAIT_SPIN_THEN_SLEEP && (iter & 255) == 0 &&
                ggml_py_time_ns() - t_start > pool->spin_ns) {
                break;
            }
        }
    }
    return sleep_until_new_generation(pool, seen);
}

void *ggml_py_pool_worker_main(void *arg) {
    struct ggml_py_worker *worker = arg;
    struct ggml_py_pool *pool = worker->pool;
    int seen = 0;  /* generation starts at 0; a task published before we run is still new */
    int skip_spin = 0;
    for (;;) {
        seen = wait_for_task(pool, seen, skip_spin);
        /* the acquire (or seq_cst) load of generation makes these visible */
        if (pool->stopping) break;
        ggml_py_task_fn fn = pool->task_fn;
        void *task_arg     = pool->task_arg;
        /* the look-ahead's advice; the spin-only policy ignores it */
        skip_spin          = pool->task_sleep_after && pool->policy != GGML_PY_WAIT_SPIN;
        fn(task_arg, worker->ith, pool->n_threads);
        if (atomic_fetch_sub_explicit(&pool->n_pending, 1, memory_order_seq_cst) == 1 &&
            atomic_load_explicit(&pool->main_sleeping, memory_order_seq_cst)) {
            /* the last share is done and main gave up spinning: wake it */
            pthread_mutex_lock(&pool->mutex);
            pthread_cond_signal(&pool->done);
            pthread_mutex_unlock(&pool->mutex);
        }
    }
    return NULL;
}

/* Main: wait until every worker has finished its share. Spin like a worker
 * would (bounded by the policy), then sleep on `done`; the same seq_cst pair
 * as for the workers (main_sleeping / n_pending) makes the wake-up safe. */
static void wait_for_workers(struct ggml_py_pool *pool, int woke_sleepers) {
    /* A worker that had to be woken may need this very core to run on: then
     * main sleeps at once instead of spinning against it. */
    if (pool->policy != GGML_PY_WAIT_SLEEP && !woke_sleepers) {
        const int64_t t_start = ggml_py_time_ns();
        for (uint32_t iter = 1;; iter++) {
            if (atomic_load_explicit(&pool->n_pending, memory_order_acquire) == 0) return;
            spin_once(pool, iter);
            if (pool->policy == GGML_PY_WAIT_SPIN_THEN_SLEEP && (iter & 255) == 0 &&
                ggml_py_time_ns() - t_start > pool->spin_ns) {
                break;
            }
        }
    }
    pthread_mutex_lock(&pool->mutex);
    atomic_store_explicit(&pool->main_sleeping, 1, memory_order_seq_cst);
    while (atomic_load_explicit(&pool->n_pending, memory_order_seq_cst) != 0) {
        pthread_cond_wait(&pool->done, &pool->mutex);
    }
    atomic_store_explicit(&pool->main_sleeping, 0, memory_order_relaxed);
    pthread_mutex_unlock(&pool->mutex);
}

/* Publish the task; returns whether sleeping workers had to be woken. */
static int publish(struct ggml_py_pool *pool) {
    atomic_store_explicit(&pool->wait_now, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&pool->n_sleeping, memory_order_seq_cst) > 0) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_broadcast(&pool->cond);
        pthread_mutex_unlock(&pool->mutex);
        atomic_fetch_add_explicit(&pool->n_wakeups, 1, memory_order_relaxed);
        return 1;
    }
    return 0;
}

void ggml_py_pool_run(struct ggml_py_pool *pool, ggml_py_task_fn fn, void *arg, int sleep_after) {
    const int nth = pool->n_threads;
    if (nth == 1) {
        fn(arg, 0, 1);
        return;
    }
    pool->task_fn          = fn;
    pool->task_arg         = arg;
    pool->task_sleep_after = sleep_after;
    atomic_store_explicit(&pool->n_pending, nth - 1, memory_order_relaxed);
    const int woke_sleepers = publish(pool);
    fn(arg, 0, nth);
    /* the workers' decrements (seq_cst, so release) make their writes visible */
    wait_for_workers(pool, woke_sleepers);
}

void ggml_py_pool_wait_now(struct ggml_py_pool *pool) {
    atomic_store_explicit(&pool->wait_now, 1, memory_order_relaxed);
}

void ggml_py_pool_stop(struct ggml_py_pool *pool) {
    pool->stopping = 1;
    publish(pool);
}

void ggml_py_pool_destroy(struct ggml_py_pool *pool) {
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->cond);
    pthread_mutex_destroy(&pool->mutex);
}
