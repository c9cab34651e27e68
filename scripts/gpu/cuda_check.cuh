// CK(call): a CUDA runtime call that must succeed; on failure, the file, line, call and error, then
// exit(1). Shared by the microbenchmarks in this folder (built with nvcc on the GPU machine).
#pragma once
#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                          \
    do {                                                                               \
        cudaError_t e_ = (x);                                                          \
        if (e_ != cudaSuccess) {                                                       \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)
