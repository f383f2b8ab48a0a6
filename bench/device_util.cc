// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench: device arena, result text and CUDA-graph timing.
#include "device_util.h"

#include <algorithm>
#include <cstdio>

namespace fusedstep::bench {

std::string describe(const Result& result) {
  std::string text = status_name(result.status());
  if (result.detail()[0] != '\0') {
    text += ": ";
    text += result.detail();
  }
  return text;
}

static std::string cuda_text(cudaError_t err, const char* what) {
  return std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
}

bool DeviceArena::allocate(size_t bytes, std::string* error) {
  release();
  cudaError_t err = cudaMalloc(&base_, bytes);
  if (err != cudaSuccess) {
    base_ = nullptr;
    (void)cudaGetLastError();  // an out-of-memory error is not sticky; clear it
    char size[64];
    std::snprintf(size, sizeof size, "cudaMalloc(%.1f MiB)", bytes / 1048576.0);
    *error = cuda_text(err, size);
    return false;
  }
  capacity_ = bytes;
  used_ = 0;
  return true;
}

void DeviceArena::release() {
  if (base_ != nullptr) cudaFree(base_);
  base_ = nullptr;
  capacity_ = used_ = 0;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

Timing time_graph(cudaStream_t stream, int launches, int iters,
                  const std::function<Result(int)>& enqueue) {
  Timing timing;
  // Uncaptured first run: a failing launch reports its Result, and one-time setup
  // (function attributes) happens outside the capture.
  for (int i = 0; i < launches; ++i) {
    Result r = enqueue(i);
    if (!r.ok()) {
      timing.error = describe(r);
      return timing;
    }
  }
  cudaError_t err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) {
    timing.error = cuda_text(err, "first run");
    return timing;
  }

  // Global capture mode: a hidden allocation or synchronization inside a launch
  // fails the capture instead of passing silently.
  err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
  if (err != cudaSuccess) {
    timing.error = cuda_text(err, "cudaStreamBeginCapture");
    return timing;
  }
  std::string capture_error;
  for (int i = 0; i < launches && capture_error.empty(); ++i) {
    Result r = enqueue(i);
    if (!r.ok()) capture_error = "launch during capture: " + describe(r);
  }
  cudaGraph_t graph = nullptr;
  err = cudaStreamEndCapture(stream, &graph);
  if (capture_error.empty() && err != cudaSuccess) capture_error = cuda_text(err, "cudaStreamEndCapture");
  if (!capture_error.empty()) {
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    timing.error = capture_error;
    return timing;
  }
  cudaGraphExec_t exec = nullptr;
  err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (err != cudaSuccess) {
    timing.error = cuda_text(err, "cudaGraphInstantiate");
    return timing;
  }

  std::vector<cudaEvent_t> events(2 * static_cast<size_t>(iters), nullptr);
  for (auto& e : events) cudaEventCreate(&e);
  for (int w = 0; w < 2 && err == cudaSuccess; ++w) err = cudaGraphLaunch(exec, stream);
  for (int r = 0; r < iters && err == cudaSuccess; ++r) {
    cudaEventRecord(events[2 * r], stream);
    err = cudaGraphLaunch(exec, stream);
    cudaEventRecord(events[2 * r + 1], stream);
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) {
    timing.error = cuda_text(err, "graph replay");
  } else {
    std::vector<double> us;
    for (int r = 0; r < iters; ++r) {
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, events[2 * r], events[2 * r + 1]);
      us.push_back(1000.0 * ms / launches);
    }
    timing.ok = true;
    timing.us_per_launch = median(us);
  }
  for (auto& e : events) cudaEventDestroy(e);
  cudaGraphExecDestroy(exec);
  return timing;
}

}  // namespace fusedstep::bench
