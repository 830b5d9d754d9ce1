/* ops_comm.c - ALL_REDUCE: the element-wise sum of a tensor over the processes of an MPI
 * communicator, in place.
 *
 * src0: F32, contiguous; dst: the same memory (a view of src0), so the op that made src0
 *       wrote its result straight into the buffer MPI reduces (no copy on either side).
 * op_params: a struct ggml_py_comm (include/ggml_py.h): MPI_Allreduce's address and the
 *       handles it takes, found at run time from the MPI library mpi4py loaded. ggml_py is
 *       built without MPI; a process that never makes this op never touches it.
 *
 * One thread calls MPI (the profile: COMPUTE on the main thread, the workers asleep), with
 * the GIL released like every compute. Every process of the communicator must run a graph
 * with the same ALL_REDUCE nodes, in the same order, on tensors of the same size.
 */
#include <limits.h>

#include "impl.h"

_Static_assert(sizeof(struct ggml_py_comm) <= sizeof(int32_t) * GGML_PY_MAX_OP_PARAMS,
               "struct ggml_py_comm fits in op_params");

/* MPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm), its handles as the library's
 * ABI passes them: ints (MPICH and its derivatives) or pointers (Open MPI, the MPI-5 ABI). */
typedef int (*allreduce_int_fn)(const void *, void *, int, int, int, int);
typedef int (*allreduce_ptr_fn)(const void *, void *, int, void *, void *, void *);

void ggml_py_compute_all_reduce(const struct ggml_py_compute_params *params, struct ggml_py_tensor *dst) {
    /* one call per process: a profile set to run on every thread still calls MPI once */
    if (params->stage != GGML_PY_STAGE_COMPUTE || params->ith != 0) return;
    struct ggml_py_comm c;
    memcpy(&c, dst->op_params, sizeof(c));
    const int64_t n = ggml_py_nelements(dst);
    if (n == 0) return;
    if (n > INT_MAX || c.allreduce == 0) {   /* the builder refuses both */
        ggml_py_set_error(params, GGML_PY_STATUS_COMM);
        return;
    }
    void *buf = dst->data;
    int rc;
    if (c.handle_bytes == 4) {
        const allreduce_int_fn fn = (allreduce_int_fn) (intptr_t) c.allreduce;
        rc = fn((const void *) (intptr_t) c.in_place, buf, (int) n, (int) c.type_f32, (int) c.op_sum,
                (int) c.comm);
    } else {
        const allreduce_ptr_fn fn = (allreduce_ptr_fn) (intptr_t) c.allreduce;
        rc = fn((const void *) (intptr_t) c.in_place, buf, (int) n, (void *) (intptr_t) c.type_f32,
                (void *) (intptr_t) c.op_sum, (void *) (intptr_t) c.comm);
    }
    if (rc != 0) {
        c.last_error = rc;   /* for the message (read after the compute stopped) */
        memcpy(dst->op_params, &c, sizeof(c));
        ggml_py_set_error(params, GGML_PY_STATUS_COMM);
    }
}
