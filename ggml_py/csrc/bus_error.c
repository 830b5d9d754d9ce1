/* bus_error.c - one line on stderr saying why, when a graph's compute dies of a bus error.
 *
 * Tensor data memory-mapped from a file (a GGUF model's weights) faults with SIGBUS
 * when the file is truncated under the mapping. The fault cannot become a Python
 * error: it lands in whichever thread reads the page, possibly a pool worker in the
 * middle of a stage, and no kernel can be left half-way safely. So the process still
 * dies of the signal, but first says what happened. The handler is installed once, by
 * the first compute; a SIGBUS while no graph computes goes on to the action that was
 * there before (Python's faulthandler, or the default). */
#include <signal.h>
#include <pthread.h>
#include <unistd.h>

#include "impl.h"

static struct sigaction previous_action;
static int graphs_computing;            /* atomic: computes running now, in any thread */
static pthread_once_t install_once = PTHREAD_ONCE_INIT;

static void on_bus_error(int signum) {
    GGML_PY_UNUSED(signum);
    if (__atomic_load_n(&graphs_computing, __ATOMIC_RELAXED) == 0) {
        /* not ours: on return the faulting access runs again, under the previous action */
        sigaction(SIGBUS, &previous_action, NULL);
        return;
    }
    /* several threads of a compute can fault at once: one line, and then the default
     * action for all of them (a handler installed before, such as Python's faulthandler,
     * is not made to run in several threads at once: it has crashed doing so) */
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) {
        static const char message[] =
            "ggml_py: bus error (SIGBUS) while computing a graph: memory-mapped tensor data "
            "(the model file) was truncated or replaced in place while in use; load the model "
            "with --no-mmap (use_mmap=False) to read it into memory\n";
        ssize_t written = write(STDERR_FILENO, message, sizeof message - 1);
        GGML_PY_UNUSED(written);
    }
    signal(SIGBUS, SIG_DFL);   /* async-signal-safe; the access faults again and ends the process */
}

static void install_handler(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_bus_error;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &previous_action);
}

void ggml_py_compute_begins(void) {
    pthread_once(&install_once, install_handler);
    __atomic_add_fetch(&graphs_computing, 1, __ATOMIC_RELAXED);
}

void ggml_py_compute_ends(void) {
    __atomic_sub_fetch(&graphs_computing, 1, __ATOMIC_RELAXED);
}
