// SPDX-License-Identifier: Apache-2.0
// mHC boundary: device weight preparation for fn already on the GPU. One thread per
// output word, the host path's word function (weight_prep.h), so the bits agree.
#include <cuda_runtime.h>

#include <algorithm>

#include "common/internal.h"
#include "fusedstep/mhc_boundary.h"
#include "mhc_boundary/weight_prep.h"

namespace fusedstep {
namespace {

constexpr int kPrepThreads = 256;
constexpr int64_t kPrepMaxBlocks = 1 << 16;  // a grid-stride loop covers larger weights

__global__ void __launch_bounds__(kPrepThreads)
    mhc_prepare_weight_kernel(const float* __restrict__ fn, int64_t hidden, WeightRounding rounding,
                              int64_t words, uint32_t* __restrict__ out) {
  for (int64_t index = int64_t(blockIdx.x) * kPrepThreads + threadIdx.x; index < words;
       index += int64_t(gridDim.x) * kPrepThreads) {
    out[index] = mhc::prepared_weight_word(fn, hidden, rounding, index);
  }
}

}  // namespace

Result prepare_mhc_boundary_weight_device(const float* fn, int64_t hidden,
                                          WeightRounding rounding, uint32_t* out,
                                          cudaStream_t stream) noexcept {
  FS_TRY(mhc::check_weight_prep(fn, hidden, rounding, out, "prepare_mhc_boundary_weight_device"));
  const int64_t words = mhc::weight_words(hidden, rounding);
  const int64_t blocks = std::min((words + kPrepThreads - 1) / kPrepThreads, kPrepMaxBlocks);
  mhc_prepare_weight_kernel<<<static_cast<unsigned>(blocks), kPrepThreads, 0, stream>>>(
      fn, hidden, rounding, words, out);
  return detail::cuda_result(cudaGetLastError(), "prepare_mhc_boundary_weight_device");
}

}  // namespace fusedstep
