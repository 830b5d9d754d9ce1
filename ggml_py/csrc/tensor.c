/* tensor.c - small facts about tensors and types. */
#include "impl.h"

size_t ggml_py_row_size(int type, int64_t ne) {
    const struct ggml_py_type_traits *tt = ggml_py_get_type_traits(type);
    return tt->type_size * (size_t) (ne / tt->blck_size);
}

int64_t ggml_py_nelements(const struct ggml_py_tensor *t) {
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

size_t ggml_py_nbytes(const struct ggml_py_tensor *t) {
    const struct ggml_py_type_traits *tt = ggml_py_get_type_traits(t->type);
    for (int i = 0; i < GGML_PY_MAX_DIMS; i++) {
        if (t->ne[i] <= 0) return 0;   /* empty: (ne - 1) * nb below would wrap */
    }
    /* from the first byte to the end of the last element, whatever the strides
     * (a transposed view strides dimension 0 by a row), as ggml_nbytes counts */
    size_t nbytes;
    if (tt->blck_size == 1) {
        nbytes = tt->type_size;
        for (int i = 0; i < GGML_PY_MAX_DIMS; i++) nbytes += (size_t) (t->ne[i] - 1) * t->nb[i];
    } else {
        nbytes = (size_t) (t->ne[0] / tt->blck_size) * t->nb[0];
        for (int i = 1; i < GGML_PY_MAX_DIMS; i++) nbytes += (size_t) (t->ne[i] - 1) * t->nb[i];
    }
    return nbytes;
}

bool ggml_py_is_contiguous(const struct ggml_py_tensor *t) {
    const struct ggml_py_type_traits *tt = ggml_py_get_type_traits(t->type);
    size_t expected = tt->type_size;
    if (t->nb[0] != expected) return false;
    expected *= (size_t) (t->ne[0] / tt->blck_size);
    for (int i = 1; i < GGML_PY_MAX_DIMS; i++) {
        if (t->ne[i] != 1 && t->nb[i] != expected) return false;
        expected *= (size_t) t->ne[i];
    }
    return true;
}

const char *ggml_py_op_name(int op) {
#define GGML_PY_OP_NAME(name) #name,
    static const char *const names[] = { GGML_PY_OPS(GGML_PY_OP_NAME) };
#undef GGML_PY_OP_NAME
    _Static_assert(sizeof names / sizeof names[0] == GGML_PY_OP_COUNT, "one name per op");
    return op >= 0 && op < GGML_PY_OP_COUNT ? names[op] : NULL;
}

const char *ggml_py_type_name(int type) {
#define GGML_PY_TYPE_NAME(name, id) [id] = #name,
    static const char *const names[GGML_PY_TYPE_COUNT] = { GGML_PY_TYPES(GGML_PY_TYPE_NAME) };
#undef GGML_PY_TYPE_NAME
    return type >= 0 && type < GGML_PY_TYPE_COUNT ? names[type] : NULL;
}
