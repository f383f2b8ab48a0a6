// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench: device memory, random fills and graph timing helpers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "fusedstep/status.h"

namespace fusedstep::bench {

// "kStatus: detail" of a failed Result.
std::string describe(const Result& result);

// One cudaMalloc carved into 256-byte aligned pieces: a buffer set is allocated and
// freed as a whole, and allocation failure is one check.
class DeviceArena {
 public:
  DeviceArena() = default;
  ~DeviceArena() { release(); }
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  DeviceArena(DeviceArena&& other) noexcept { *this = std::move(other); }
  DeviceArena& operator=(DeviceArena&& other) noexcept {
    if (this != &other) {
      release();
      base_ = other.base_;
      capacity_ = other.capacity_;
      used_ = other.used_;
      other.base_ = nullptr;
      other.capacity_ = other.used_ = 0;
    }
    return *this;
  }

  static size_t round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

  // Allocates `bytes`; on failure `error` names the size and the CUDA error.
  bool allocate(size_t bytes, std::string* error);
  // The next `bytes` of the arena (null when it does not fit: a sizing bug).
  template <class T>
  T* take(size_t count) {
    const size_t bytes = round_up(count * sizeof(T));
    if (base_ == nullptr || used_ + bytes > capacity_) return nullptr;
    T* p = reinterpret_cast<T*>(static_cast<char*>(base_) + used_);
    used_ += bytes;
    return p;
  }
  void release();

 private:
  void* base_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
};

// Uniform random values in [lo, hi) from a counter hash of (seed, index): any size,
// on the device, in one pass. BF16 values are rounded to nearest even.
void fill_uniform_bf16(void* out, int64_t count, float lo, float hi, uint64_t seed,
                       cudaStream_t stream);
void fill_uniform_f32(float* out, int64_t count, float lo, float hi, uint64_t seed,
                      cudaStream_t stream);

// Median microseconds per launch of a CUDA graph that holds `launches` calls of
// `enqueue(i)` (i = 0..launches-1, each on its own buffer set), over `iters` timed
// replays after two warm-up replays. Every call is first run once outside the
// capture so that a failing launch reports its own Result.
struct Timing {
  bool ok = false;
  double us_per_launch = 0.0;
  std::string error;
};
Timing time_graph(cudaStream_t stream, int launches, int iters,
                  const std::function<Result(int)>& enqueue);

// Median of a non-empty list.
double median(std::vector<double> values);

}  // namespace fusedstep::bench
