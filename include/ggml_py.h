/* ggml_py.h - the core contract: types, ops, the tensor struct, task profiles,
 * compute parameters and the graph executor API.
 *
 * Shapes here are in ggml order: ne[0] is the fastest-moving dimension (a row's
 * length), nb[i] is the byte stride of dimension i. The Python layer speaks numpy
 * order and reverses; nothing in C knows about Python.
 */
#ifndef GGML_PY_H
#define GGML_PY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GGML_PY_MAX_DIMS      4
#define GGML_PY_MAX_SRC       6
#define GGML_PY_MAX_OP_PARAMS 16   /* int32 slots */
#define GGML_PY_MAX_NAME      48
#define GGML_PY_MAX_PROFILES  8
#define GGML_PY_CACHE_LINE    64

/* Element types, numbered exactly as ggml numbers them (GGUF stores these ids): X(NAME, id)
 * for each. This list is the only one: the enum below, the names the executor reports and
 * ggml_py.Type in Python are all made from it. */
#define GGML_PY_TYPES(X) \
    X(F32,  0)  X(F16,  1) \
    X(Q4_0, 2)  X(Q4_1, 3)  X(Q5_0, 6)  X(Q5_1, 7)  X(Q8_0, 8)  X(Q8_1, 9) \
    X(Q2_K, 10) X(Q3_K, 11) X(Q4_K, 12) X(Q5_K, 13) X(Q6_K, 14) X(Q8_K, 15) \
    X(I8,   24) X(I16,  25) X(I32,  26) X(I64,  27) X(F64,  28) X(BF16, 30)

enum ggml_py_type {
#define GGML_PY_TYPE_ENUM(name, id) GGML_PY_TYPE_##name = id,
    GGML_PY_TYPES(GGML_PY_TYPE_ENUM)
#undef GGML_PY_TYPE_ENUM
    GGML_PY_TYPE_COUNT = 31,   /* one past the largest id */
};

/* Operations, in enum order: X(NAME) for each; the enum, the names and ggml_py.Op are made
 * from this list. Building a graph only records an op and its sources; the executor
 * dispatches on it. */
#define GGML_PY_OPS(X) \
    X(NONE)          /* a leaf: data set by the user or a weight file     */ \
    /* copies */ \
    X(DUP)           /* contiguous copy, same type                        */ \
    X(CPY)           /* copy src0 into the layout/type of src1 (a view)   */ \
    X(CONT)          /* contiguous copy of a (possibly strided) view      */ \
    /* element-wise binary, src1 broadcast over src0 by repeating rows */ \
    X(ADD) X(SUB) X(MUL) X(DIV) \
    /* element-wise unary */ \
    X(SCALE)         /* op_params[0]: float scale                         */ \
    X(NEG) X(SQR) X(SQRT) X(RELU) X(GELU) X(SILU) \
    X(SWIGLU)        /* silu(src0) * src1                                 */ \
    /* reductions over rows */ \
    X(SUM_ROWS) X(MEAN) X(ARGMAX) \
    /* normalisation */ \
    X(NORM)          /* op_params[0]: float eps                           */ \
    X(RMS_NORM)      /* op_params[0]: float eps                           */ \
    X(SOFT_MAX)      /* src1: optional mask; op_params[0]: float scale    */ \
    /* matrix products and row access */ \
    X(MUL_MAT) \
    X(GET_ROWS)      /* src1: I32 row ids                                 */ \
    X(SET_ROWS)      /* src1: I32 row ids; writes src0 rows into src2 (an I8 src2:   \
                        int8 per group of op_params[0], scales into src3)  */ \
    X(ROPE)          /* src1: I32 positions, src2: optional freq factors  */ \
    X(CONCAT)        /* op_params[0]: dim                                 */ \
    X(ATTENTION)     /* src: q, k pool, v pool, I32 kv_index, k and v scales  \
                        (I8 pools); op_params[0]: scale                    */ \
    /* communication: data aliases src0 (in place) */ \
    X(ALL_REDUCE)    /* sum over an MPI communicator; op_params: struct ggml_py_comm */ \
    /* views: no compute, data aliases src0 */ \
    X(VIEW) X(RESHAPE) X(PERMUTE) X(TRANSPOSE)

enum ggml_py_op {
#define GGML_PY_OP_ENUM(name) GGML_PY_OP_##name,
    GGML_PY_OPS(GGML_PY_OP_ENUM)
#undef GGML_PY_OP_ENUM
    GGML_PY_OP_COUNT,
};

/* "MUL_MAT", "Q4_0": the names of the lists above; NULL for an id that has none. */
const char *ggml_py_op_name(int op);
const char *ggml_py_type_name(int type);

/* RoPE modes (op_params[1] of ROPE), as ggml numbers them. */
enum ggml_py_rope_mode {
    GGML_PY_ROPE_NORMAL = 0,  /* rotate adjacent pairs (x[2i], x[2i+1])          */
    GGML_PY_ROPE_NEOX   = 2,  /* rotate halves (x[i], x[i + n_dims/2])            */
};

/* ---- task profiles --------------------------------------------------------- */

enum ggml_py_stage {
    GGML_PY_STAGE_INIT     = 0,
    GGML_PY_STAGE_COMPUTE  = 1,
    GGML_PY_STAGE_FINALIZE = 2,
    GGML_PY_N_STAGES       = 3,
};

/* How one stage runs: skipped or not, on all threads or on the main thread only,
 * and (single-thread stages) whether idle workers go to sleep at once. */
struct ggml_py_stage_flags {
    uint8_t valid;
    uint8_t parallel;
    uint8_t wait;
    uint8_t pad_;
};

/* A task profile is data: which code path (id) and how each stage is threaded. */
struct ggml_py_task_profile {
    int32_t id;
    char    name[16];
    struct ggml_py_stage_flags stages[GGML_PY_N_STAGES];
};

/* MUL_MAT profile ids (the code path a profile selects). */
enum ggml_py_mul_mat_profile {
    GGML_PY_MUL_MAT_CPU        = 0,  /* INIT: src1 -> vec_dot type; COMPUTE: dots */
    GGML_PY_MUL_MAT_BLAS       = 1,  /* COMPUTE on one thread: dequant + sgemm     */
    GGML_PY_MUL_MAT_BLAS_SPLIT = 2,  /* INIT: parallel dequant; COMPUTE: sgemm     */
    GGML_PY_MUL_MAT_BLAS_MT    = 3,  /* as BLAS_SPLIT, sgemm on BLAS's own threads */
};

/* ---- communication ----------------------------------------------------------- */

/* How ALL_REDUCE reaches the MPI library the process has loaded (through mpi4py), held in
 * the node's op_params: nothing of MPI is needed to build ggml_py. Handles are stored as
 * 64-bit integers; handle_bytes says how MPI_Comm, MPI_Datatype and MPI_Op are passed:
 * 4 (MPICH's ABI: int handles) or 8 (Open MPI, the MPI-5 standard ABI: pointers). */
struct ggml_py_comm {
    int64_t allreduce;     /* the address of MPI_Allreduce                    */
    int64_t comm;          /* the communicator's handle                        */
    int64_t type_f32;      /* MPI_FLOAT                                        */
    int64_t op_sum;        /* MPI_SUM                                          */
    int64_t in_place;      /* MPI_IN_PLACE                                     */
    int32_t handle_bytes;  /* 4 or 8                                           */
    int32_t last_error;    /* out: the error code of the last failed call      */
};

/* ATTENTION profile ids: how the scores of a block of query rows are held. */
enum ggml_py_attention_profile {
    GGML_PY_ATTENTION_SLIM  = 0,   /* the whole score row-block, softmax in place, times V */
    GGML_PY_ATTENTION_FLASH = 1,   /* key tiles, online softmax (running max and sum)     */
    GGML_PY_ATTENTION_AUTO  = 2,   /* each token by its own list: slim up to op_params[1]
                                      keys (0: the built-in limit; < 0: none), flash past it */
};

/* ---- tensors --------------------------------------------------------------- */

struct ggml_py_tensor {
    int32_t type;                              /* enum ggml_py_type            */
    int32_t op;                                /* enum ggml_py_op              */
    int64_t ne[GGML_PY_MAX_DIMS];              /* elements per dimension       */
    size_t  nb[GGML_PY_MAX_DIMS];              /* bytes per step in dimension  */
    int32_t op_params[GGML_PY_MAX_OP_PARAMS];
    struct ggml_py_tensor *src[GGML_PY_MAX_SRC];
    void   *data;
    /* NULL, or (a Q4_0, Q4_K, Q5_K or Q6_K matrix of a multiple of 8 rows) the same weights
     * with their rows packed and interleaved by eight (ggml_py_q4_0_interleave_rows8 and the
     * K-quants' beside it in ggml_py_quants.h): MUL_MAT's SIMD kernels read these instead of
     * data, every other reader reads data. */
    const void *rows8;
    struct ggml_py_task_profile profile;       /* how the executor runs it     */
    char    name[GGML_PY_MAX_NAME];
};

/* What every kernel receives: which stage, which thread of how many, and the
 * shared work buffer sized by the planner. Kernels never allocate. */
struct ggml_py_compute_params {
    int32_t stage;
    int32_t ith;
    int32_t nth;
    size_t  wsize;
    void   *wdata;
    int32_t *error;   /* a kernel that meets bad data (e.g. a row id out of
                         range) stores an enum ggml_py_status here */
    int32_t n_threads;  /* threads of the compute (a single-thread stage whose
                           workers sleep may lend them to a threaded library) */
    int64_t *next_item; /* shared by the stage's threads, 0 when it starts:
                           see ggml_py_next_item (csrc/impl.h) */
};

/* ---- type traits ----------------------------------------------------------- */

typedef void (*ggml_py_to_float_fn)(const void *x, float *y, int64_t n);
typedef void (*ggml_py_from_float_fn)(const float *x, void *y, int64_t n);
/* s = dot(x[0:n], y[0:n]); x in this type, y in its vec_dot_type. */
typedef void (*ggml_py_vec_dot_fn)(int64_t n, float *s, const void *x, const void *y);

/* The scalar twin and the SIMD kernel (NULL where none is built) of the slots that have
 * both: from_float as activations are converted for vec_dot, and vec_dot. */
struct ggml_py_kernel_pair {
    ggml_py_from_float_fn from_float_ref, from_float_simd;
    ggml_py_vec_dot_fn    vec_dot_ref, vec_dot_simd;
};

struct ggml_py_type_traits {
    const char *name;
    int64_t blck_size;        /* elements per block                        */
    size_t  type_size;        /* bytes per block                           */
    bool    is_quantized;
    ggml_py_to_float_fn   to_float;
    ggml_py_from_float_fn from_float;      /* the kernel picked from `kernels` (or the reference) */
    ggml_py_from_float_fn from_float_ref;  /* deterministic reference      */
    ggml_py_vec_dot_fn    vec_dot;         /* the kernel picked from `kernels` */
    int32_t vec_dot_type;
    struct ggml_py_kernel_pair kernels;
};

/* The traits of `type`, or NULL for an id that is not a type. */
const struct ggml_py_type_traits *ggml_py_get_type_traits(int type);
size_t  ggml_py_row_size(int type, int64_t ne);
int64_t ggml_py_nelements(const struct ggml_py_tensor *t);
size_t  ggml_py_nbytes(const struct ggml_py_tensor *t);
bool    ggml_py_is_contiguous(const struct ggml_py_tensor *t);

/* ---- profiles, planning, executing ---------------------------------------- */

/* The profiles this node's op and types support, default first. Returns how many. */
int ggml_py_op_profiles(const struct ggml_py_tensor *node,
                        struct ggml_py_task_profile out[GGML_PY_MAX_PROFILES]);

/* The profile a node gets when nothing else decides (the built-in rule). */
struct ggml_py_task_profile ggml_py_default_profile(const struct ggml_py_tensor *node);

/* Work-buffer bytes this node needs under its current profile and n_threads. */
size_t ggml_py_node_work_size(const struct ggml_py_tensor *node, int n_threads);

/* Run one stage of one node on thread ith of nth. */
void ggml_py_compute_forward(const struct ggml_py_compute_params *params,
                             struct ggml_py_tensor *node);

enum ggml_py_status {
    GGML_PY_STATUS_OK        = 0,
    GGML_PY_STATUS_ABORTED   = 1,   /* the abort callback asked to stop        */
    GGML_PY_STATUS_BAD_INDEX = 2,   /* a row id (get_rows/set_rows) out of range */
    GGML_PY_STATUS_COMM      = 3,   /* an MPI call (ALL_REDUCE) returned an error  */
};

/* Called between nodes (rate-limited); a non-zero return stops the compute. */
typedef int (*ggml_py_abort_fn)(void *data);

struct ggml_py_cgraph {
    int32_t n_nodes;
    struct ggml_py_tensor **nodes;             /* topological order            */
};

struct ggml_py_cplan {
    size_t  work_size;
    void   *work_data;
    int32_t lookahead;          /* stages scanned for upcoming parallel work;
                                   0: no look-ahead, workers never sleep early */
    ggml_py_abort_fn abort_callback;
    void   *abort_data;
    int64_t abort_interval_ns;  /* least time between two abort checks         */
    int64_t *stage_ns;          /* NULL, or n_nodes * GGML_PY_N_STAGES timings */
    int32_t *failed_node;       /* out: the node that returned an error status */
};

struct ggml_py_pool;

/* Largest work size over the graph's nodes (cache-line padded). */
size_t ggml_py_graph_work_size(const struct ggml_py_cgraph *graph, int n_threads);

/* Compute the graph on the pool's threads (pool may be NULL: one thread).
 * Returns an enum ggml_py_status; on an error, *plan->failed_node says where. */
int ggml_py_graph_compute(const struct ggml_py_cgraph *graph,
                          const struct ggml_py_cplan *plan,
                          struct ggml_py_pool *pool);

int64_t ggml_py_time_ns(void);

/* Point the type traits at the fastest kernels built in, or at the scalar twins
 * (force_ref). Call once before computing; returns what was picked. */
const char *ggml_py_select_kernels(int force_ref);

/* The instruction-set features this binary was compiled for, as a bit set. */
enum ggml_py_feature {
    GGML_PY_FEATURE_SSE3        = 1 << 0,
    GGML_PY_FEATURE_AVX         = 1 << 1,
    GGML_PY_FEATURE_AVX2        = 1 << 2,
    GGML_PY_FEATURE_FMA         = 1 << 3,
    GGML_PY_FEATURE_F16C        = 1 << 4,
    GGML_PY_FEATURE_AVX512      = 1 << 5,
    GGML_PY_FEATURE_AVX512_VNNI = 1 << 6,
    GGML_PY_FEATURE_AVX512_BF16 = 1 << 7,
    GGML_PY_FEATURE_AVX_VNNI    = 1 << 8,
    GGML_PY_FEATURE_AMX_INT8    = 1 << 9,
    GGML_PY_FEATURE_BLAS        = 1 << 10,
    GGML_PY_FEATURE_TSAN        = 1 << 11,
};
uint32_t ggml_py_build_features(void);

/* The BLAS the BLAS profiles call: its vendor, version and the kernels it picked
 * for this CPU ("OpenBLAS 0.3.29 DYNAMIC_ARCH ... SkylakeX ..."), or "none". */
const char *ggml_py_blas_config(void);

#ifdef __cplusplus
}
#endif

#endif /* GGML_PY_H */
