// SPDX-License-Identifier: Apache-2.0
// The microbenchmarks' CUDA error check: a failing runtime call prints where and why, and
// the program exits (a microbenchmark has nothing to recover).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(x)                                                                                \
  do {                                                                                          \
    const cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)
