// SPDX-License-Identifier: Apache-2.0
// KDA decode / verify: launch() runs the configuration plan_launch() picked, through
// the table of compiled kernels (kernels.h). No allocation, no synchronization, no
// device query after the first call on a device.
#include <cuda_runtime.h>

#include "common/internal.h"
#include "common/kernel_variant.h"
#include "common/launch.h"
#include "kda_decode/kernels.h"
#include "kda_decode/params.h"
#include "kda_decode/plan.h"

namespace fusedstep::kda {
namespace {

using DecodeTable = detail::KernelTable<DecodeConfigs, FusedArgs>;
using VerifyTable = detail::KernelTable<VerifyConfigs, VerifyArgs>;

DecodeTable& decode_table() {
  static DecodeTable table([]<class Cfg>() { return decode_variant<Cfg>(); });
  return table;
}
VerifyTable& verify_table() {
  static VerifyTable table([]<class Cfg>() { return verify_variant<Cfg>(); });
  return table;
}

FusedArgs make_args(const KdaDecodeParams& p, const KdaSchedule& s) {
  FusedArgs a{};
  a.x = p.x;
  a.x_stride = p.x_stride;
  a.f_a = p.f_a;
  a.f_a_stride = p.f_a_stride;
  a.raw_gate = p.raw_gate;
  a.raw_gate_stride = p.raw_gate_stride;
  a.raw_beta = p.raw_beta;
  a.raw_beta_stride = p.raw_beta_stride;
  a.output_gate = p.output_gate;
  a.output_gate_stride = p.output_gate_stride;
  a.conv_weight = p.conv_weight;
  a.conv_weight_channel_stride = p.conv_weight_channel_stride;
  a.conv_weight_tap_stride = p.conv_weight_tap_stride;
  a.conv_weight_section_stride = kda::conv_weight_section_stride(p);
  a.conv_bias = p.conv_bias;
  a.f_b_weight = p.f_b_weight;
  a.a_log = p.a_log;
  a.dt_bias = p.dt_bias;
  a.norm_weight = p.norm_weight;
  a.conv_state = p.conv_state;
  a.conv_state_slot_stride = p.conv_state_slot_stride;
  a.conv_state_channel_stride = p.conv_state_channel_stride;
  a.conv_state_tap_stride = p.conv_state_tap_stride;
  a.conv_state_slots = p.conv_state_slots;
  a.state = p.state;
  a.state_slot_stride = p.state_slot_stride;
  a.state_slots = p.state_slots;
  a.slots = p.slots;
  a.output = p.output;
  a.output_stride = p.output_stride;
  a.lower_bound = p.lower_bound;
  a.q_scale = p.q_scale;
  a.norm_eps = p.norm_eps;
  a.heads = p.heads;
  a.gate_source = p.raw_gate != nullptr ? kGateGiven
                  : p.gate_mode == KdaGateMode::kFmaTree ? kGateFma
                                                         : kGateMma;
  a.four_chains = p.gate_mode == KdaGateMode::kFourChains;
  a.early = s.early;
  a.evict_first = s.evict_first;
  // Batch 1, q = 1: dependents are released at entry (up to 6% faster there). The verify
  // releases them after its conv at every batch: released at entry, the next launch's
  // CTAs share SMs with this one's critical chain (batch 1: 4-11% slower).
  a.trigger_at_entry = p.batch == 1 && p.tokens == 1;
  a.conv_weight_bf16 = p.conv_weight_dtype == DType::kBf16;
  a.conv_state_bf16 = p.conv_state_dtype == DType::kBf16;
  a.norm_weight_bf16 = p.norm_weight_dtype == DType::kBf16;
  return a;
}

VerifyArgs make_verify_args(const KdaDecodeParams& p, const KdaSchedule& s) {
  VerifyArgs v{};
  v.base = make_args(p, s);
  v.tokens = p.tokens;
  v.slots_stride = p.slots_stride;
  v.accepted = p.accepted;
  v.token_counts = p.token_counts;
  v.record_correction = p.record_correction;
  v.record_key_gate = p.record_key_gate;
  v.record_rows = p.record_rows;
  v.record_slots = p.record_slots;
  return v;
}

}  // namespace
}  // namespace fusedstep::kda

namespace fusedstep {

Result launch(const KdaDecodeParams& params, const LaunchOptions& options, cudaStream_t stream) noexcept {
  const DeviceInfo* device = nullptr;
  FS_TRY(detail::resolve_device(options, &device));
  kda::LaunchPlan p;
  FS_TRY(kda::plan_launch(params, *device, &p));
  if (params.batch == 0) return Result::success();
  const KdaSchedule& s = p.schedule;
  detail::LaunchConfig config(dim3(static_cast<unsigned>(s.cluster), static_cast<unsigned>(params.heads),
                                   static_cast<unsigned>(params.batch)),
                              dim3(kda::kThreads), p.dynamic_smem, stream);
  config.cluster(static_cast<unsigned>(s.cluster)).pdl(options.pdl);
  if (p.config.verify) {
    kda::VerifyTable& table = kda::verify_table();
    FS_TRY(table.prepare(device->device, "cudaFuncSetAttribute(kda verify)"));
    return detail::launch_variant(*table.find(p.config), config, kda::make_verify_args(params, s),
                                  "cudaLaunchKernelEx(kda verify)");
  }
  kda::DecodeTable& table = kda::decode_table();
  FS_TRY(table.prepare(device->device, "cudaFuncSetAttribute(kda decode)"));
  return detail::launch_variant(*table.find(p.config), config, kda::make_args(params, s),
                                "cudaLaunchKernelEx(kda decode)");
}

}  // namespace fusedstep
