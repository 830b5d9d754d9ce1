/* vec.h - row conversions and dot products of the float types. */
#ifndef GGML_PY_VEC_H
#define GGML_PY_VEC_H

#include <stdint.h>

void ggml_py_vec_dot_f32_ref(int64_t n, float *s, const void *x, const void *y);
void ggml_py_vec_dot_f16_ref(int64_t n, float *s, const void *x, const void *y);
void ggml_py_vec_dot_bf16_ref(int64_t n, float *s, const void *x, const void *y);
void ggml_py_vec_dot_f32_avx2(int64_t n, float *s, const void *x, const void *y);
void ggml_py_vec_dot_f16_avx2(int64_t n, float *s, const void *x, const void *y);

void ggml_py_f16_to_f32_row(const void *x, float *y, int64_t n);
void ggml_py_f32_to_f16_row(const float *x, void *y, int64_t n);
void ggml_py_bf16_to_f32_row(const void *x, float *y, int64_t n);
void ggml_py_f32_to_bf16_row(const float *x, void *y, int64_t n);
void ggml_py_f32_to_f32_row(const float *x, void *y, int64_t n);
void ggml_py_f32_row_to_f32(const void *x, float *y, int64_t n);

#endif /* GGML_PY_VEC_H */
