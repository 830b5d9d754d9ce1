/* ggml_py_pool.h - the persistent worker pool.
 *
 * The pool never creates threads itself: its owner starts one thread per worker
 * on ggml_py_pool_worker_main(&pool->workers[i]) and joins them after
 * ggml_py_pool_stop(). Thread 0 is always the caller (the "main" thread).
 *
 * A parallel stage is published by bumping `generation` (seq_cst); workers spin
 * on it for a bounded time, then sleep on a condition variable. Sleeping and
 * waking use a Dekker-style pair (n_sleeping / generation, both seq_cst) so a
 * wake-up can never be lost. The main thread waits for the workers' shares the
 * same way: it spins, then sleeps on `done` (main_sleeping / n_pending).
 *
 * The shares of a stage (ith = 0 .. nth-1) are claimed, not assigned: main runs
 * share 0, and every thread, main included once its own is done, takes the next
 * unclaimed share from `claim` (the generation and the next share in one word,
 * so a late worker cannot take a share of a later stage). A worker the machine
 * has descheduled thus never holds a barrier it has not joined: main (or another
 * worker) runs its share. Which thread runs a share never changes its bits.
 *
 * Under spin-then-sleep the pool also watches for workers that come late — a
 * spinning worker that saw a stage tens of µs after it was published, or a
 * stage whose main thread ran a long share and then a worker's too: another
 * program holds their cores. Seen in one stage of LATE_SHARE or more of a window
 * of LATE_WINDOW stages, main runs the stages alone for solo_ns (the workers
 * asleep), then tries them again; the spell doubles, up to 32 times, while they
 * come late again at once. A rare late stage (a background job taking a core
 * for a moment) costs only that stage.
 * Sleepers wait on a futex where Linux has one (no lock a descheduled worker
 * could hold against main), else on condition variables.
 */
#ifndef GGML_PY_POOL_H
#define GGML_PY_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ggml_py.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GGML_PY_MAX_THREADS 256

enum ggml_py_wait_policy {
    GGML_PY_WAIT_SPIN_THEN_SLEEP = 0, /* spin up to spin_ns, then sleep        */
    GGML_PY_WAIT_SPIN            = 1, /* spin until the next task (or wait_now) */
    GGML_PY_WAIT_SLEEP           = 2, /* sleep as soon as a task is done        */
};

/* fn(arg, ith, nth) runs thread ith's share of one stage. */
typedef void (*ggml_py_task_fn)(void *arg, int ith, int nth);

struct ggml_py_worker {
    struct ggml_py_pool *pool;
    int32_t ith;
};

struct ggml_py_pool {
    int32_t n_threads;            /* including the main thread                */
    int32_t policy;               /* enum ggml_py_wait_policy                 */
    int64_t spin_ns;              /* spin budget before sleeping              */
    int32_t oversubscribed;       /* more threads than cores: spinners yield  */

    /* the published task: written by main before `generation` is bumped */
    ggml_py_task_fn task_fn;
    void   *task_arg;
    atomic_int task_sleep_after;  /* wait_on_task_done (read by late workers too) */
    atomic_int stopping;

    int64_t late_ns;              /* a spinning worker this late lost its core */
    int64_t solo_ns;              /* how long main then runs alone            */

    /* lateness (spin-then-sleep): main's own state and statistics */
    int64_t solo_until_ns;        /* run stages on main alone until then      */
    int64_t spell_ns;             /* the last spell's length (doubles while late) */
    int32_t window_stages;        /* stages of the current lateness window    */
    int32_t window_late;          /* ... in which a worker came late          */
    int64_t n_solo_stages;        /* statistics: stages run alone             */
    int64_t n_solo_spells;        /* statistics: times the pool went solo     */
    int64_t n_stolen;             /* statistics: workers' shares main ran     */

    _Alignas(GGML_PY_CACHE_LINE) atomic_int generation;
    _Alignas(GGML_PY_CACHE_LINE) _Atomic uint64_t claim;  /* generation << 32 | next share */
    atomic_llong t_publish_ns;    /* when the stage was published             */
    atomic_int n_late;            /* late workers seen since main last looked  */
    _Alignas(GGML_PY_CACHE_LINE) atomic_int n_pending;   /* shares still running */
    _Alignas(GGML_PY_CACHE_LINE) atomic_int wait_now;    /* sleep at once      */
    _Alignas(GGML_PY_CACHE_LINE) atomic_int n_sleeping;
    atomic_int main_sleeping;     /* main sleeps until the last share is done */
    atomic_llong n_sleeps;        /* statistics: times a worker went to sleep */
    atomic_llong n_wakeups;       /* statistics: wake-ups sent by main        */


    pthread_mutex_t mutex;
    pthread_cond_t  cond;         /* without futexes: workers sleep here between tasks */
    pthread_cond_t  done;         /* without futexes: main sleeps here until the last share ends */

    struct ggml_py_worker workers[GGML_PY_MAX_THREADS];
};

/* Prepare a pool for n_threads (1..GGML_PY_MAX_THREADS). Returns 0 on success. */
int  ggml_py_pool_init(struct ggml_py_pool *pool, int n_threads, int policy, int64_t spin_ns);
/* Thread entry for worker `arg` (a struct ggml_py_worker *, ith >= 1). */
void *ggml_py_pool_worker_main(void *arg);
/* Run fn on all threads (main runs ith 0) and return when every share is done.
 * sleep_after: workers sleep as soon as they finish (look-ahead found no
 * parallel work coming soon). */
void ggml_py_pool_run(struct ggml_py_pool *pool, ggml_py_task_fn fn, void *arg, int sleep_after);
/* Ask spinning workers to sleep now (a single-thread stage marked `wait`). */
void ggml_py_pool_wait_now(struct ggml_py_pool *pool);
/* Wake and release every worker; the owner then joins the threads. */
void ggml_py_pool_stop(struct ggml_py_pool *pool);
void ggml_py_pool_destroy(struct ggml_py_pool *pool);

#ifdef __cplusplus
}
#endif

#endif /* GGML_PY_POOL_H */
