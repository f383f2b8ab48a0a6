// SPDX-License-Identifier: Apache-2.0
// mHC boundary: launch() runs the configuration plan() picked, through the table of
// compiled kernels (instantiations/*.cu); the one-time per-device attributes and
// cluster occupancies. No allocation, no synchronization, no device query after the
// first call on a device.
#include <cuda_runtime.h>

#include <algorithm>

#include "common/internal.h"
#include "common/kernel_variant.h"
#include "common/launch.h"
#include "fusedstep/mhc_boundary.h"
#include "mhc_boundary/check.h"
#include "mhc_boundary/config.h"
#include "mhc_boundary/kernels.h"
#include "mhc_boundary/plan.h"

namespace fusedstep {
namespace {

// All of the unified L1 as shared memory, so that two CTAs always fit.
class Table : public detail::KernelTable<mhc::BoundaryConfigs, mhc::KernelArgs> {
 public:
  Table()
      : KernelTable([]<class Cfg>() { return mhc::boundary_variant<Cfg>(); }, cudaSharedmemCarveoutMaxShared) {}
  Result prepare(int device) { return KernelTable::prepare(device, "cudaFuncSetAttribute(mhc_boundary)"); }
};

Table& boundary_table() {
  static Table table;
  return table;
}

// Grid of `clusters` 16-CTA clusters.
dim3 grid_of(int64_t clusters) { return dim3(static_cast<unsigned>(clusters * mhc::kCluster), 1, 1); }

}  // namespace

namespace detail {

Result mhc_query_clusters_per_wave(int device, int* two_cta, int* one_cta) noexcept {
  *two_cta = 0;
  *one_cta = 0;
  InitErrorScope errors;
  int previous = 0;
  FS_TRY(cuda_result(cudaGetDevice(&previous), "cudaGetDevice"));
  if (previous != device) FS_TRY(cuda_result(cudaSetDevice(device), "cudaSetDevice"));
  Table& table = boundary_table();
  Result result = table.prepare(device);
  // Per configuration, the fewest over its kernels (fragment layouts, tile variants).
  int fewest[2] = {-1, -1};  // [two CTAs per SM, one CTA per SM]; -1: none queried yet
  for (int i = 0; i < mhc::BoundaryConfigs::kSize && result.ok(); ++i) {
    const mhc::ConfigKey& k = mhc::BoundaryConfigs::kKeys[i];
    if (!table.runs(device, k)) continue;
    LaunchConfig config(grid_of(1), dim3(mhc::kThreads), mhc::smem_bytes_of(k.ctas_per_sm), nullptr);
    config.cluster(mhc::kCluster);
    int n = 0;
    result = cuda_result(cudaOccupancyMaxActiveClusters(&n, reinterpret_cast<const void*>(table.find(k)->fn), config.get()),
                         k.ctas_per_sm == 1 ? "cudaOccupancyMaxActiveClusters(mhc_boundary, one CTA per SM)"
                                            : "cudaOccupancyMaxActiveClusters(mhc_boundary, two CTAs per SM)");
    int& f = fewest[k.ctas_per_sm == 1 ? 1 : 0];
    f = f < 0 ? n : std::min(f, n);
  }
  if (previous != device) (void)cudaSetDevice(previous);
  if (result.ok()) {
    *two_cta = std::max(fewest[0], 0);
    *one_cta = std::max(fewest[1], 0);
  }
  return result;
}

}  // namespace detail

Result launch(const MhcBoundaryParams& params, const LaunchOptions& options, cudaStream_t stream) noexcept {
  const DeviceInfo* device = nullptr;
  FS_TRY(detail::resolve_device(options, &device));
  MhcBoundaryPlan p;
  FS_TRY(plan(params, *device, &p));
  if (params.tokens == 0) return Result::success();
  Table& table = boundary_table();
  FS_TRY(table.prepare(device->device));
  const mhc::ConfigKey key = mhc::select_config(params, p);
  if (!table.runs(device->device, key)) {
    return Result::error(Status::kDeviceUnsupported,
                         "mhc_boundary: the DeviceInfo of this launch (mhc_one_cta_clusters_per_wave = %d, "
                         "max_smem_per_block_optin = %d) does not describe device %d, which lacks the %d bytes "
                         "of opt-in shared memory of the one-CTA-per-SM configuration (use get_device_info)",
                         device->mhc_one_cta_clusters_per_wave, device->max_smem_per_block_optin, device->device,
                         mhc::kSmemBytesOne);
  }

  mhc::KernelArgs args{};
  args.x = params.x;
  args.residual = params.residual;
  args.post = params.post;
  args.comb = params.comb;
  args.pre_lag = params.pre_lag;
  args.weight = params.weight;
  args.scale = params.scale;
  args.base = params.base;
  args.norm_weight = params.norm_weight;
  args.residual_out = params.residual_out;
  args.layer_input = params.layer_input;
  args.pre_out = params.pre_out;
  args.post_out = params.post_out;
  args.comb_out = params.comb_out;
  args.tokens = params.tokens;
  args.hidden = params.hidden;
  args.x_stride = mhc::x_stride_of(params);
  args.residual_stride = mhc::residual_stride_of(params);
  args.residual_out_stride = mhc::residual_out_stride_of(params);
  args.layer_input_stride = mhc::layer_input_stride_of(params);
  args.tile = p.tile;
  args.norm_eps = params.norm_eps;
  args.scalars = mhc::CoefficientScalars{params.rms_eps, params.hc_pre_eps, params.sinkhorn_eps,
                                         params.post_mult, params.sinkhorn_iters};

  // The configuration plan() reported (its DeviceInfo decides where the one-CTA one runs).
  detail::LaunchConfig config(grid_of(p.clusters), dim3(mhc::kThreads), mhc::smem_bytes_of(p.ctas_per_sm),
                              stream);
  config.cluster(mhc::kCluster).pdl(options.pdl);
  return detail::launch_variant(*table.find(key), config, args, "cudaLaunchKernelEx(mhc_boundary)");
}

}  // namespace fusedstep
