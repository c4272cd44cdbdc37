/* cuda_backend.h: what the core sees of the CUDA backend (kernels/), for
 * core/tensor.c when LOOM_HAVE_CUDA is defined. Plain C; include after
 * internal.h, or from C++ (the .cu files) as it is. */
#ifndef LOOM_CUDA_BACKEND_H
#define LOOM_CUDA_BACKEND_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
#include "../core/internal.h"

extern const lm_backend lm_cuda_backend;
/* CUDA devices visible to this process; 0 (with the reason left by
 * lm_error) when there is none or no driver. */
int lm_cuda_device_count(void);
/* 1 if device (LM_CUDA0 + k) exists, else 0 with the reason in lm_error. */
int lm_cuda_available(int device);
/* Makes device (LM_CUDA0 + k) current and returns the backend table, or
 * NULL with an error. lm_backend_of calls it, so alloc and free land on
 * the device the core asked for. */
const lm_backend *lm_cuda_backend_for(int device);

#ifdef __cplusplus
}
#endif
#endif
