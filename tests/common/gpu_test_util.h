// SPDX-License-Identifier: Apache-2.0
// Helpers for the GPU suites: skip without a device, device buffers, fresh random
// inputs per case (seed printed), poison, and bitwise comparison that names the
// first differing element.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/seed.h"
#include "fusedstep/device.h"

namespace fusedstep::testing {

// GTEST_SKIP() with a reason unless a GPU of compute capability >= 9.0 is present.
#define FS_REQUIRE_GPU()                                                              \
  do {                                                                                \
    int fs_count_ = 0;                                                                \
    if (cudaGetDeviceCount(&fs_count_) != cudaSuccess || fs_count_ == 0) {            \
      (void)cudaGetLastError();                                                       \
      GTEST_SKIP() << "no CUDA device: GPU test not run";                             \
    }                                                                                 \
    cudaDeviceProp fs_prop_{};                                                        \
    cudaGetDeviceProperties(&fs_prop_, 0);                                            \
    if (fs_prop_.major < 9) GTEST_SKIP() << "needs compute capability >= 9.0, have " \
                                         << fs_prop_.major << "." << fs_prop_.minor; \
  } while (0)

#define FS_CUDA_OK(expr)                                                     \
  do {                                                                       \
    cudaError_t fs_err_ = (expr);                                            \
    ASSERT_EQ(fs_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(fs_err_); \
  } while (0)

#define FS_EXPECT_OK(result_expr)                                           \
  do {                                                                      \
    ::fusedstep::Result fs_r_ = (result_expr);                             \
    ASSERT_TRUE(fs_r_.ok()) << ::fusedstep::status_name(fs_r_.status()) << ": " << fs_r_.detail(); \
  } while (0)

// A device buffer of T, freed on destruction.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) { resize(count); }
  ~DeviceBuffer() { if (ptr_) cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void resize(size_t count) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    count_ = count;
    if (count) cudaMalloc(&ptr_, count * sizeof(T));
  }
  T* get() const { return ptr_; }
  size_t size() const { return count_; }
  void upload(const std::vector<T>& host) {
    cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }
  // Fill every byte with `byte` (poison before a run, canary for untouched state).
  void fill_bytes(int byte) { cudaMemset(ptr_, byte, count_ * sizeof(T)); }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

// Index of the first element whose bytes differ, or -1.
template <class T>
int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

// A CUDA graph captured from one call on a stream and instantiated for replays;
// destroyed with the object.
//   CapturedGraph graph;
//   ASSERT_TRUE(graph.capture(stream, [&] { return launch(params, options, stream); }));
//   FS_CUDA_OK(graph.replay(stream));
class CapturedGraph {
 public:
  CapturedGraph() = default;
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
  }
  // Captures once: `call` enqueues the work and returns its fusedstep::Result; a failed
  // launch fails the capture (reported before a capture error it may have caused).
  template <class Call>
  ::testing::AssertionResult capture(cudaStream_t stream, Call&& call,
                                     cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal) {
    if (graph_ != nullptr) return ::testing::AssertionFailure() << "CapturedGraph::capture called twice";
    cudaError_t err = cudaStreamBeginCapture(stream, mode);
    if (err != cudaSuccess) return ::testing::AssertionFailure() << "begin capture: " << cudaGetErrorString(err);
    const ::fusedstep::Result launched = call();
    err = cudaStreamEndCapture(stream, &graph_);
    if (!launched.ok()) {
      return ::testing::AssertionFailure() << "captured launch: " << ::fusedstep::status_name(launched.status())
                                           << ": " << launched.detail();
    }
    if (err != cudaSuccess) return ::testing::AssertionFailure() << "end capture: " << cudaGetErrorString(err);
    cudaGraphExec_t exec = nullptr;
    err = cudaGraphInstantiate(&exec, graph_, 0);
    if (err != cudaSuccess) return ::testing::AssertionFailure() << "instantiate: " << cudaGetErrorString(err);
    exec_ = exec;
    return ::testing::AssertionSuccess();
  }
  cudaError_t replay(cudaStream_t stream) const { return cudaGraphLaunch(exec_, stream); }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace fusedstep::testing
