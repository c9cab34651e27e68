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

// `kernel<<<grid, block, smem, s>>>(args...)`, with programmatic stream serialization when
// `programmatic` (the runtime's launches on sm_90: the kernel's blocks may be scheduled while the
// kernel ahead still runs, and wait in `griddepcontrol.wait`).
template <typename K, typename... A>
static void launch_smem(bool programmatic, K kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t s, A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = programmatic ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

// launch_smem without dynamic shared memory.
template <typename K, typename... A>
static void launch_ex(bool programmatic, K kernel, dim3 grid, dim3 block, cudaStream_t s, A... args) {
    launch_smem(programmatic, kernel, grid, block, 0, s, args...);
}
