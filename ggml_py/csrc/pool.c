/* pool.c - spin-then-sleep worker pool with wait_now and wait_on_task_done,
 * shares claimed by whichever thread comes first, and spells on the main thread
 * alone while other programs hold the workers' cores (ggml_py_pool.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   /* sched_getaffinity, CPU_COUNT */
#endif
#include "ggml_py_pool.h"

#include <sched.h>
#include <stdlib.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif
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
 * sleeps instead. */
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

/* A spinning worker sees a new stage within about a microsecond; one that saw
 * it this late had lost its core to another program. */
#define LATE_NS  50000
/* A worker woken from its sleep is late when it has not come this long after. */
#define LATE_WOKEN_NS 500000
/* Main then runs the stages alone for this long (the workers asleep), and then
 * tries the workers again; twice as long each time they are late again within
 * SOLO_NS of a spell's end (the load goes on: the tries cost less), up to
 * SOLO_MAX_NS. */
#define SOLO_NS  50000000
#define SOLO_MAX_NS 1600000000
/* ... once workers came late in one stage of LATE_SHARE or more of the last
 * LATE_WINDOW stages. A program as busy as ours takes a worker's core a third of
 * the time or more, and most stages then see it; a job in the background (a
 * niced build, a server's event loop) now and then, and going solo for it would
 * halve every stage of the spell to spare a few. */
#define LATE_WINDOW 64
#define LATE_SHARE 8

/* Sleeping threads wait on a futex where there is one: a sleeper holds no lock,
 * so a worker that loses its core just after waking cannot block the main
 * thread's next wake-up (with a mutex, main waits for it to run again). */
#if defined(__linux__)
#define HAVE_FUTEX 1
static void futex_wait(atomic_int *addr, int val) {
    syscall(SYS_futex, (int *) addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}
static void futex_wake(atomic_int *addr, int n) {
    syscall(SYS_futex, (int *) addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}
#else
#define HAVE_FUTEX 0
static void futex_wait(atomic_int *addr, int val) { (void) addr; (void) val; }
static void futex_wake(atomic_int *addr, int n) { (void) addr; (void) n; }
#endif

static int use_futex(const struct ggml_py_pool *pool) {
    (void) pool;
    return HAVE_FUTEX;
}

/* Lateness is judged under spin-then-sleep only: `spin` promises workers that
 * never sleep, and under `sleep` every worker comes late by design. */
static int adaptive(const struct ggml_py_pool *pool) {
    return pool->policy == GGML_PY_WAIT_SPIN_THEN_SLEEP;
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
    atomic_init(&pool->claim, 0);
    atomic_init(&pool->t_publish_ns, 0);
    atomic_init(&pool->n_late, 0);
    atomic_init(&pool->task_sleep_after, 0);
    atomic_init(&pool->stopping, 0);
    pool->late_ns = LATE_NS;
    pool->solo_ns = SOLO_NS;
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
 * this sleeper and wakes it (a futex wake, or a broadcast under the mutex), or
 * we see the new generation. The futex wait itself re-checks the value. */
static int sleep_until_new_generation(struct ggml_py_pool *pool, int seen) {
    if (use_futex(pool)) {
        atomic_fetch_add_explicit(&pool->n_sleeping, 1, memory_order_seq_cst);
        atomic_fetch_add_explicit(&pool->n_sleeps, 1, memory_order_relaxed);
        int gen;
        while ((gen = atomic_load_explicit(&pool->generation, memory_order_seq_cst)) == seen) {
            futex_wait(&pool->generation, seen);
        }
        atomic_fetch_sub_explicit(&pool->n_sleeping, 1, memory_order_seq_cst);
        return gen;
    }
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

/* Wait for the next generation: spin (bounded by policy), then sleep.
 * *spun: whether it came while spinning. */
static int wait_for_task(struct ggml_py_pool *pool, int seen, int skip_spin, int *spun) {
    *spun = 0;
    if (!skip_spin && pool->policy != GGML_PY_WAIT_SLEEP) {
        const int64_t t_start = ggml_py_time_ns();
        for (uint32_t iter = 1;; iter++) {
            int gen = atomic_load_explicit(&pool->generation, memory_order_acquire);
            if (gen != seen) {
                *spun = 1;
                return gen;
            }
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

/* One share done: the last one wakes main if it gave up spinning. */
static void share_done(struct ggml_py_pool *pool) {
    if (atomic_fetch_sub_explicit(&pool->n_pending, 1, memory_order_seq_cst) == 1 &&
        atomic_load_explicit(&pool->main_sleeping, memory_order_seq_cst)) {
        if (use_futex(pool)) {
            futex_wake(&pool->n_pending, 1);
            return;
        }
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_signal(&pool->done);
        pthread_mutex_unlock(&pool->mutex);
    }
}

/* Run unclaimed shares of stage `gen` until none is left; returns how many.
 * The task is read only after a claim succeeds: until that share is done main
 * cannot finish the stage, so it cannot be publishing the next one. */
static int run_claimed_shares(struct ggml_py_pool *pool, int gen) {
    const uint32_t nth = (uint32_t) pool->n_threads;
    int ran = 0;
    uint64_t c = atomic_load_explicit(&pool->claim, memory_order_acquire);
    for (;;) {
        if ((uint32_t) (c >> 32) != (uint32_t) gen || (uint32_t) c >= nth) return ran;
        if (!atomic_compare_exchange_weak_explicit(&pool->claim, &c, c + 1, memory_order_acq_rel,
                                                   memory_order_acquire)) {
            continue;
        }
        pool->task_fn(pool->task_arg, (int) (uint32_t) c, (int) nth);
        share_done(pool);
        ran++;
        c = atomic_load_explicit(&pool->claim, memory_order_acquire);
    }
}

void *ggml_py_pool_worker_main(void *arg) {
    struct ggml_py_worker *worker = arg;
    struct ggml_py_pool *pool = worker->pool;
    int seen = 0;  /* generation starts at 0; a task published before we run is still new */
    int skip_spin = 0;
    for (;;) {
        int spun;
        seen = wait_for_task(pool, seen, skip_spin, &spun);
        /* the acquire (or seq_cst) load of generation makes these visible */
        if (atomic_load_explicit(&pool->stopping, memory_order_relaxed)) break;
        /* a spinning worker sees a stage within a microsecond: one that saw it
         * this late had lost its core to another program */
        if (spun && adaptive(pool) &&
            ggml_py_time_ns() - atomic_load_explicit(&pool->t_publish_ns, memory_order_relaxed) > pool->late_ns) {
            atomic_fetch_add_explicit(&pool->n_late, 1, memory_order_relaxed);
        }
        /* the look-ahead's advice; the spin-only policy ignores it */
        skip_spin = atomic_load_explicit(&pool->task_sleep_after, memory_order_relaxed) &&
                    pool->policy != GGML_PY_WAIT_SPIN;
        run_claimed_shares(pool, seen);
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
    if (use_futex(pool)) {
        atomic_store_explicit(&pool->main_sleeping, 1, memory_order_seq_cst);
        int pending;
        while ((pending = atomic_load_explicit(&pool->n_pending, memory_order_seq_cst)) != 0) {
            futex_wait(&pool->n_pending, pending);
        }
        atomic_store_explicit(&pool->main_sleeping, 0, memory_order_relaxed);
        return;
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
        if (use_futex(pool)) {
            futex_wake(&pool->generation, INT32_MAX);
            atomic_fetch_add_explicit(&pool->n_wakeups, 1, memory_order_relaxed);
            return 1;
        }
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
    const int64_t now = ggml_py_time_ns();
    if (adaptive(pool) && now >= pool->solo_until_ns) {
        pool->window_late += atomic_exchange_explicit(&pool->n_late, 0, memory_order_relaxed) > 0;
        if (++pool->window_stages == LATE_WINDOW) {
            if (pool->window_late * LATE_SHARE >= LATE_WINDOW) {
                /* another program holds the workers' cores: go on alone for a
                 * spell, the workers asleep, then try them again */
                pool->n_solo_spells++;
                const int again = pool->solo_until_ns > 0 && now - pool->solo_until_ns < pool->solo_ns;
                pool->spell_ns = !again ? pool->solo_ns
                               : 2 * pool->spell_ns < SOLO_MAX_NS ? 2 * pool->spell_ns : SOLO_MAX_NS;
                pool->solo_until_ns = now + pool->spell_ns;
                ggml_py_pool_wait_now(pool);
            }
            pool->window_stages = pool->window_late = 0;
        }
    }
    if (now < pool->solo_until_ns) {
        /* every share on main, in order: the same bits as any split */
        for (int ith = 0; ith < nth; ith++) fn(arg, ith, nth);
        pool->n_solo_stages++;
        return;
    }
    pool->task_fn          = fn;
    pool->task_arg         = arg;
    atomic_store_explicit(&pool->task_sleep_after, sleep_after, memory_order_relaxed);
    atomic_store_explicit(&pool->n_pending, nth - 1, memory_order_relaxed);
    atomic_store_explicit(&pool->t_publish_ns, now, memory_order_relaxed);
    const int gen = atomic_load_explicit(&pool->generation, memory_order_relaxed) + 1;
    /* share 0 is main's; the release orders the task and n_pending before it */
    atomic_store_explicit(&pool->claim, ((uint64_t) (uint32_t) gen << 32) | 1u, memory_order_release);
    const int woke_sleepers = publish(pool);
    fn(arg, 0, nth);
    /* the shares no worker has claimed yet: main runs them, so that a worker
     * that lost its core holds no barrier it has not joined */
    const int stolen = run_claimed_shares(pool, gen);
    pool->n_stolen += stolen;
    /* a worker that did not come while main ran a long share of its own was late */
    if (stolen && adaptive(pool) &&
        ggml_py_time_ns() - now > (woke_sleepers ? LATE_WOKEN_NS : pool->late_ns)) {
        atomic_fetch_add_explicit(&pool->n_late, 1, memory_order_relaxed);
    }
    /* the workers' decrements (seq_cst, so release) make their writes visible */
    wait_for_workers(pool, woke_sleepers);
}

void ggml_py_pool_wait_now(struct ggml_py_pool *pool) {
    atomic_store_explicit(&pool->wait_now, 1, memory_order_relaxed);
}

void ggml_py_pool_stop(struct ggml_py_pool *pool) {
    atomic_store_explicit(&pool->stopping, 1, memory_order_relaxed);
    const int gen = atomic_load_explicit(&pool->generation, memory_order_relaxed) + 1;
    atomic_store_explicit(&pool->claim, ((uint64_t) (uint32_t) gen << 32) | (uint32_t) pool->n_threads,
                          memory_order_release);
    publish(pool);
}

void ggml_py_pool_destroy(struct ggml_py_pool *pool) {
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->cond);
    pthread_mutex_destroy(&pool->mutex);
}
