// SPDX-License-Identifier: Apache-2.0
// KDA decode / verify: the default schedule for a call, the configuration that runs it
// and the launch geometry. Pure host code: the CPU suites test every rule here.
#include "kda_decode/plan.h"

#include <algorithm>
#include <iterator>
#include <cstdio>

#include "common/internal.h"
#include "kda_decode/args.h"
#include "kda_decode/params.h"

namespace fusedstep::kda {
namespace {

// q = 1 work (heads x batch) from which C = 1 copies its state after the activations
// (early 1): from there the wave is full and the next call's CTAs cannot start early.
constexpr int64_t kLateStateCopyWork = 29 * 12;

// Defaults by the work of the call, heads x batch counted in 12-head requests
// (docs/benchmarks.md holds the H200 sweeps behind them). q = 1, 16 lanes per row,
// state rows read into registers before the PDL wait (early 1) except where noted:
// 1 request (or batch 1 of up to 48 heads) 8 CTAs per head, up to 10 requests 4 (8
// lanes at 6-7), up to 16 requests 2 (8 lanes at 11), beyond one CTA per head (state
// staged, evict-first: before the PDL wait up to 29 requests, after the activations
// from 30).
// Evict-first is chosen only when the whole schedule is left to the defaults (its
// `false` cannot mean "default").
// The FMA-tree gate keeps check()'s rule (cluster >= 4, early <= 1). Verify (q > 1,
// early <= 2; H200 sweeps of 12 heads at batch 3-16 and 24 heads at 2-8, q = 2-8): 8
// CTAs per head, 8 lanes, staged, for 1 request (batch 1 up to 48 heads); 4 (8 lanes,
// registers) for 2 requests; 4 (16 lanes) for 3-4 requests in registers and for 6-7
// staged (8 requests of 4-CTA clusters no longer run in one wave); 2 (8 lanes, staged)
// for 5 and 8-16 requests (q > 4 with 9-11 requests: 16 lanes, registers); then one CTA
// per head (16 lanes, staged in chunks). A BF16 state, whose rows take half the
// registers, keeps them in registers (16 lanes, early 1) on 4-CTA clusters for 5-7
// requests and on 2-CTA clusters for 8-10 (12 and 24 heads, q = 2-8: 2-22% faster).
KdaSchedule resolve_schedule(const KdaDecodeParams& p) {
  KdaSchedule s = p.schedule;
  const bool all_default = s.cluster == 0 && s.lanes_per_row == 0 && s.early < 0 && !s.evict_first;
  const int64_t work = int64_t(p.heads) * p.batch;  // 12 = one 12-head request
  const bool fma_gate = p.gate_mode == KdaGateMode::kFmaTree && p.raw_gate == nullptr;
  int cluster, lanes = 16, early = 1;
  bool evict = true;
  if (p.tokens > 1) {
    evict = false;
    const bool bf16 = p.state_dtype == DType::kBf16;
    if (work <= 12 || (p.batch == 1 && work <= 4 * 12)) {
      cluster = 8, lanes = 8, early = 2;
    } else if (work <= 2 * 12) {
      cluster = 4, lanes = 8, early = 1;
    } else if (work <= 4 * 12 || (bf16 && work <= 7 * 12)) {
      cluster = 4, lanes = 16, early = 1;
    } else if (work >= 6 * 12 && work <= 7 * 12) {  // staged 4-CTA clusters, still one wave
      cluster = 4, lanes = 16, early = 2;
    } else if (work <= 16 * 12) {
      // Staged (q <= 4 at <= 2 CTAs per SM: the compact variant), but q > 4 with 9-11
      // requests, and a BF16 state with 8-10, keep the state in registers.
      const bool registers =
          (p.tokens > kCompactTokens && work > 8 * 12 && work < 12 * 12) || (bf16 && work < 11 * 12);
      cluster = 2, lanes = registers ? 16 : 8, early = registers ? 1 : 2;
    } else {
      cluster = 1, lanes = 16, early = 1;
    }
  } else if (work <= 12 || (p.batch == 1 && work <= 4 * 12)) {
    cluster = 8;
  } else if (work <= 10 * 12) {
    // 8 lanes per row at batch 6-7 (12 heads: 3-7% faster); C = 4 rather than C = 2 up
    // to batch 10
    cluster = 4, lanes = work > 5 * 12 && work <= 7 * 12 ? 8 : 16;
  } else if (work <= 16 * 12) {
    cluster = 2, lanes = work <= 11 * 12 ? 8 : 16;  // batch 11: 8 lanes 10% faster
  } else {
    // The state is copied after the activations once the CTAs fill the wave (C = 1's
    // late_state_copy); with it C = 1 is 2-5% ahead of C = 2 at 129-384 requests, level
    // at 512.
    cluster = 1, early = work > kLateStateCopyWork ? 1 : 2;
  }
  if (fma_gate) {
    cluster = std::max(cluster, 4);
    early = std::min(early, 1);
  }
  if (s.cluster == 0) s.cluster = cluster;
  if (s.lanes_per_row == 0) s.lanes_per_row = lanes;
  if (s.early < 0) s.early = (early == 3 && s.cluster > 2) ? 2 : early;
  // Verify (q > 1): early <= 2 (check()).
  if (p.tokens > 1 && p.schedule.early < 0) s.early = std::min(s.early, 2);
  if (all_default && evict && is_staged(s)) s.evict_first = true;
  return s;
}

// The verify with q <= 4 on C = 2 staged rows and at most two CTAs per SM (12 heads:
// batch 5-11) runs the compact configuration (SharedVerify<4>, 22 KB instead of 40, four
// CTAs per SM), so that the next call's CTAs all find a slot and run their prologue before
// the PDL wait under this call (q = 2-4: batch 5-11 4-13% faster). With more CTAs four
// per SM is slower, so those calls keep the full configuration.
bool compact_verify(const KdaDecodeParams& p, const KdaSchedule& s, int sm_count) {
  return p.tokens > 1 && p.tokens <= kCompactTokens && s.cluster == 2 && is_staged(s) &&
         int64_t(s.cluster) * p.heads * p.batch <= 2 * int64_t(sm_count);
}

// Whether the gate warp stages its F_B fragments in shared memory: q = 1 at early 3,
// the verify at early 1 with C >= 2.
bool stages_fb(const KdaDecodeParams& p, const KdaSchedule& s) {
  if (p.raw_gate != nullptr || p.gate_mode == KdaGateMode::kFmaTree) return false;
  return p.tokens > 1 ? s.early == 1 && s.cluster >= 2 : s.early == 3;
}

template <class List>
bool built(const ConfigKey& key) {
  return std::find(std::begin(List::kKeys), std::end(List::kKeys), key) != std::end(List::kKeys);
}

// "c1 l16 staged, c2 l8 registers, ..." for an error message.
template <class List>
const char* built_list(char (&text)[512]) {
  int n = 0;
  text[0] = '\0';
  for (const ConfigKey& k : List::kKeys) {
    if (k.state_bf16) continue;  // the same list as FP32
    n += std::snprintf(text + n, sizeof(text) - n, "%s(cluster %d, lanes_per_row %d, %s%s)", n > 0 ? ", " : "",
                       k.cluster, k.lanes, k.staged ? "staged" : "registers",
                       k.tokens == kCompactTokens ? ", compact" : "");
    if (n >= int(sizeof(text))) break;
  }
  return text;
}

}  // namespace

Result plan_launch(const KdaDecodeParams& params, const DeviceInfo& device, LaunchPlan* out) noexcept {
  FS_TRY(check(params, device));
  const KdaSchedule s = resolve_schedule(params);
  {
    // The resolved schedule obeys the same rules as an explicit one.
    KdaDecodeParams resolved = params;
    resolved.schedule = s;
    FS_TRY(check(resolved, device));
  }
  if (!device.cluster_launch || device.cc_major < 9) {
    return Result::error(Status::kDeviceUnsupported,
                         "kda_decode: the fused kernel needs thread-block clusters (sm_90+), device has cc %d.%d",
                         device.cc_major, device.cc_minor);
  }
  const bool verify = params.tokens > 1;
  const bool compact = compact_verify(params, s, device.sm_count);
  const bool state_bf16 = params.state_dtype == DType::kBf16;
  ConfigKey key{verify, s.cluster, s.lanes_per_row, is_staged(s), verify ? (compact ? kCompactTokens : kMaxTokens) : 1,
                state_bf16};
  if (verify ? !built<VerifyConfigs>(key) : !built<DecodeConfigs>(key)) {
    char text[512];
    return Result::error(Status::kUnsupported,
                         "kda_decode: schedule (cluster = %d, lanes_per_row = %d, early = %d: state %s) has no "
                         "built %s kernel; built: %s",
                         s.cluster, s.lanes_per_row, s.early, key.staged ? "staged" : "in registers",
                         verify ? "verify" : "q = 1",
                         verify ? built_list<VerifyConfigs>(text) : built_list<DecodeConfigs>(text));
  }
  LaunchPlan p;
  p.schedule = s;
  p.stage_fb = stages_fb(params, s);
  p.ctas = int64_t(s.cluster) * params.heads * params.batch;
  const int64_t static_smem = !verify ? int64_t(sizeof(SharedCore))
                              : compact ? int64_t(sizeof(SharedVerify<kCompactTokens>))
                                        : int64_t(sizeof(SharedVerify<kMaxTokens>));
  const bool sm100 = device.cc_major >= 10;
  auto dynamic_smem = [&](const ConfigKey& k) {
    return verify ? verify_dynamic_smem(s.cluster, k.staged, p.stage_fb)
                  : decode_dynamic_smem(s.cluster, k.staged, p.stage_fb, state_bf16, k.four_ctas);
  };
  // Estimate: CTAs per SM bounded by shared memory, 160-thread blocks and the registers:
  // as many CTAs as the config is built for, else about 128 registers a thread (three
  // CTAs), what ptxas takes for most of these kernels.
  auto waves = [&](const ConfigKey& k) {
    const int64_t smem = int64_t(dynamic_smem(k)) + static_smem + 1024;
    const int min_ctas = verify ? MinCtasOf<VerifyConfigs>::get(k, sm100) : MinCtasOf<DecodeConfigs>::get(k, sm100);
    int64_t per_sm = std::min<int64_t>(2048 / kThreads, min_ctas > 0 ? min_ctas : 65536 / (kThreads * 128));
    if (device.max_smem_per_block_optin > 0) {
      per_sm = std::min<int64_t>(per_sm, (device.max_smem_per_block_optin + 1024) / smem);
    }
    const int64_t slots = std::max<int64_t>(int64_t(device.sm_count) * std::max<int64_t>(per_sm, 1), 1);
    return (p.ctas + slots - 1) / slots;
  };
  // q = 1, C = 1, BF16 state: the four-CTA build where it takes at most three quarters of
  // the waves of the three-CTA one. Its waves last about 1.28x as long (docs/design.md),
  // so fewer waves pay from there (12 heads: batch 40-44 25% faster, 100-128 4-8%, 256
  // 3%); at as many waves (batch 32, 48-96) it would be 3-16% slower.
  ConfigKey four = key;
  four.four_ctas = true;
  if (!verify && state_bf16 && s.cluster == 1 && built<DecodeConfigs>(four) && 4 * waves(four) <= 3 * waves(key)) {
    key = four;
  }
  p.config = key;
  p.dynamic_smem = dynamic_smem(key);
  p.waves = static_cast<int>(waves(key));
  *out = p;
  return Result::success();
}

}  // namespace fusedstep::kda

namespace fusedstep {

Result plan(const KdaDecodeParams& params, const DeviceInfo& device, KdaDecodePlan* out) noexcept {
  if (out == nullptr) return Result::error(Status::kNullPointer, "kda_decode plan: out is null");
  kda::LaunchPlan p;
  FS_TRY(kda::plan_launch(params, device, &p));
  out->schedule = p.schedule;
  out->ctas = p.ctas;
  out->waves = p.waves;
  return Result::success();
}

}  // namespace fusedstep
