// SPDX-License-Identifier: Apache-2.0
// The launch configuration fusedstep kernels use: grid, block, dynamic shared memory and
// stream, plus the two launch attributes they need, a thread-block cluster and
// programmatic dependent launch, each only when asked for.
#pragma once

#include <cuda_runtime.h>

namespace fusedstep::detail {

class LaunchConfig {
 public:
  LaunchConfig(dim3 grid, dim3 block, size_t dynamic_smem, cudaStream_t stream) {
    config_.gridDim = grid;
    config_.blockDim = block;
    config_.dynamicSmemBytes = dynamic_smem;
    config_.stream = stream;
  }
  // config_.attrs points into this object.
  LaunchConfig(const LaunchConfig&) = delete;
  LaunchConfig& operator=(const LaunchConfig&) = delete;

  // Clusters of `ctas` CTAs along x.
  LaunchConfig& cluster(unsigned ctas) {
    cudaLaunchAttribute& a = add();
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = ctas;
    a.val.clusterDim.y = 1;
    a.val.clusterDim.z = 1;
    return *this;
  }
  // Programmatic dependent launch (the kernel calls griddepcontrol.wait before reading
  // its predecessor's outputs).
  LaunchConfig& pdl(bool enabled) {
    if (enabled) {
      cudaLaunchAttribute& a = add();
      a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      a.val.programmaticStreamSerializationAllowed = 1;
    }
    return *this;
  }
  const cudaLaunchConfig_t* get() const { return &config_; }

 private:
  cudaLaunchAttribute& add() {
    cudaLaunchAttribute& a = attrs_[config_.numAttrs++];
    config_.attrs = attrs_;
    return a;
  }
  cudaLaunchConfig_t config_{};
  cudaLaunchAttribute attrs_[2]{};
};

}  // namespace fusedstep::detail
