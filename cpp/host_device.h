// FLASHCUTE_HOST_DEVICE: functions that the kernels call and the plain C++ host API (which
// sizes workspaces) compiles too.
#pragma once

#if defined(__CUDACC__)
#define FLASHCUTE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLASHCUTE_HOST_DEVICE inline
#endif
