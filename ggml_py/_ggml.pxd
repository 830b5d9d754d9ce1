# Declarations of the C core (include/ggml_py.h, include/ggml_py_pool.h), nogil.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t

cdef extern from "ggml_py.h" nogil:
    enum:
        GGML_PY_MAX_DIMS
        GGML_PY_MAX_SRC
        GGML_PY_MAX_OP_PARAMS
        GGML_PY_MAX_NAME
        GGML_PY_MAX_PROFILES
        GGML_PY_N_STAGES
        GGML_PY_TYPE_COUNT
        GGML_PY_TYPE_Q4_0
        GGML_PY_TYPE_Q4_K
        GGML_PY_TYPE_Q5_K
        GGML_PY_TYPE_Q6_K
        GGML_PY_OP_COUNT
        GGML_PY_STATUS_OK
        GGML_PY_STATUS_ABORTED
        GGML_PY_STATUS_BAD_INDEX
        GGML_PY_STATUS_COMM
        GGML_PY_OP_NONE
        GGML_PY_OP_GET_ROWS
        GGML_PY_OP_ATTENTION
        GGML_PY_OP_VIEW
        GGML_PY_OP_RESHAPE
        GGML_PY_OP_PERMUTE
        GGML_PY_OP_TRANSPOSE

    struct ggml_py_stage_flags:
        uint8_t valid
        uint8_t parallel
        uint8_t wait

    struct ggml_py_comm:
        int64_t allreduce
        int64_t comm
        int64_t type_f32
        int64_t op_sum
        int64_t in_place
        int32_t handle_bytes
        int32_t last_error

    struct ggml_py_task_profile:
        int32_t id
        char name[16]
        ggml_py_stage_flags stages[3]

    struct ggml_py_tensor:
        int32_t type
        int32_t op
        int64_t ne[4]
        size_t nb[4]
        int32_t op_params[16]
        ggml_py_tensor *src[6]
        void *data
        const void *rows8
        ggml_py_task_profile profile
        char name[48]

    ctypedef void (*ggml_py_to_float_fn)(const void *x, float *y, int64_t n)
    ctypedef void (*ggml_py_from_float_fn)(const float *x, void *y, int64_t n)
    ctypedef void (*ggml_py_vec_dot_fn)(int64_t n, float *s, const void *x, const void *y)

    struct ggml_py_type_traits:
        const char *name
        int64_t blck_size
        size_t type_size
        bint is_quantized
        ggml_py_to_float_fn to_float
        ggml_py_from_float_fn from_float
        ggml_py_from_float_fn from_float_ref
        ggml_py_vec_dot_fn vec_dot
        int32_t vec_dot_type

    const ggml_py_type_traits *ggml_py_get_type_traits(int type)
    size_t ggml_py_row_size(int type, int64_t ne)
    size_t ggml_py_nbytes(const ggml_py_tensor *t)
    bint ggml_py_is_contiguous(const ggml_py_tensor *t)

    int ggml_py_op_profiles(const ggml_py_tensor *node, ggml_py_task_profile *out)
    ggml_py_task_profile ggml_py_default_profile(const ggml_py_tensor *node)
    size_t ggml_py_node_work_size(const ggml_py_tensor *node, int n_threads)

    ctypedef int (*ggml_py_abort_fn)(void *data) noexcept

    struct ggml_py_cgraph:
        int32_t n_nodes
        ggml_py_tensor **nodes

    struct ggml_py_cplan:
        size_t work_size
        void *work_data
        int32_t lookahead
        ggml_py_abort_fn abort_callback
        void *abort_data
        int64_t abort_interval_ns
        int64_t *stage_ns
        int32_t *failed_node

    struct ggml_py_pool

    size_t ggml_py_graph_work_size(const ggml_py_cgraph *graph, int n_threads)
    int ggml_py_graph_compute(const ggml_py_cgraph *graph, const ggml_py_cplan *plan,
                              ggml_py_pool *pool)
    int64_t ggml_py_time_ns()
    const char *ggml_py_select_kernels(int force_ref)
    uint32_t ggml_py_build_features()
    const char *ggml_py_blas_config()
    const char *ggml_py_op_name(int op)
    const char *ggml_py_type_name(int type)

cdef extern from "ggml_py_pool.h" nogil:
    enum:
        GGML_PY_MAX_THREADS

    ctypedef void (*ggml_py_task_fn)(void *arg, int ith, int nth) noexcept

    struct ggml_py_worker:
        ggml_py_pool *pool
        int32_t ith

    struct ggml_py_pool:
        int32_t n_threads
        int32_t policy
        int64_t spin_ns
        long long n_sleeps
        long long n_wakeups
        int64_t n_solo_stages
        int64_t n_solo_spells
        int64_t n_stolen
        ggml_py_worker workers[256]

    int ggml_py_pool_init(ggml_py_pool *pool, int n_threads, int policy, int64_t spin_ns)
    void *ggml_py_pool_worker_main(void *arg)
    void ggml_py_pool_run(ggml_py_pool *pool, ggml_py_task_fn fn, void *arg, int sleep_after)
    void ggml_py_pool_wait_now(ggml_py_pool *pool)
    void ggml_py_pool_stop(ggml_py_pool *pool)
    void ggml_py_pool_destroy(ggml_py_pool *pool)

cdef extern from "ggml_py.h" nogil:
    struct ggml_py_kernel_pair:
        ggml_py_from_float_fn from_float_ref
        ggml_py_from_float_fn from_float_simd
        ggml_py_vec_dot_fn vec_dot_ref
        ggml_py_vec_dot_fn vec_dot_simd

cdef extern from "ggml_py_quants.h" nogil:
    int ggml_py_get_kernel_pair(int type, ggml_py_kernel_pair *out)
    void ggml_py_q4_0_interleave_rows8(const void *src, void *dst, int64_t n_rows, int64_t n)
    void ggml_py_q4_K_interleave_rows8(const void *src, void *dst, int64_t n_rows, int64_t n)
    void ggml_py_q5_K_interleave_rows8(const void *src, void *dst, int64_t n_rows, int64_t n)
    void ggml_py_q6_K_interleave_rows8(const void *src, void *dst, int64_t n_rows, int64_t n)


cdef extern from "vec.h" nogil:
    ctypedef double (*ggml_py_exp_sum_fn)(int64_t n, float *y, const float *x, float max)
    ctypedef void (*ggml_py_swiglu_fn)(int64_t n, float *y, const float *x, const float *g)
    ctypedef void (*ggml_py_sum_sq_fn)(int64_t n, const float *x, double *lanes)
    cdef struct ggml_py_row_kernels:
        ggml_py_exp_sum_fn exp_sum
        ggml_py_swiglu_fn swiglu
        ggml_py_sum_sq_fn sum_sq
    const ggml_py_row_kernels *ggml_py_row_kernel_set(int simd)
