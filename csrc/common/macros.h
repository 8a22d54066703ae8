// Portability macros for code compiled both by the host compiler and by nvcc (no torch headers here).
#pragma once

#if defined(__CUDACC__)
#define FM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FM_HOST_DEVICE inline
#endif
