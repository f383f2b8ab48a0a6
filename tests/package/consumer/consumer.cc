// SPDX-License-Identifier: Apache-2.0
// The installed package from a user's program (C++17, host only, no GPU): build_info(),
// then check() on parameters against a hand-made H200 DeviceInfo, valid and with one bad
// field, whose message must name it. Prints "N passed, M failed"; exits non-zero on a failure.
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "fusedstep/build_info.h"
#include "fusedstep/fusedstep.h"

namespace {

int passed = 0, failed = 0;

void expect(bool ok, const char* what, const char* detail = "") {
  std::printf("%s: %s%s%s\n", ok ? "ok" : "FAILED", what, *detail ? " -- " : "", detail);
  (ok ? passed : failed)++;
}

template <class T>
T* fake(uintptr_t slot) {  // check() never dereferences its pointers
  return reinterpret_cast<T*>(uintptr_t(0x7f0000000000) + slot * 0x100000);
}

fusedstep::MhcBoundaryParams mhc_params() {
  fusedstep::MhcBoundaryParams p;
  p.x = fake<const __nv_bfloat16>(1);
  p.residual = fake<const __nv_bfloat16>(2);
  p.post = fake<const float>(3);
  p.comb = fake<const float>(4);
  p.pre_lag = fake<const float>(5);
  p.weight = fake<const uint32_t>(6);
  p.scale = fake<const float>(7);
  p.base = fake<const float>(8);
  p.norm_weight = fake<const __nv_bfloat16>(9);
  p.residual_out = fake<__nv_bfloat16>(10);
  p.layer_input = fake<__nv_bfloat16>(11);
  p.pre_out = fake<float>(12);
  p.post_out = fake<float>(13);
  p.comb_out = fake<float>(14);
  p.tokens = 8;
  p.hidden = 5120;
  return p;
}

}  // namespace

int main() {
  const fusedstep::BuildInfo& b = fusedstep::build_info();
  std::printf("fusedstep %s (commit %s), CUDA %s, architectures %s, CUDA runtime %s\n", b.version,
              b.commit, b.cuda_version, b.architectures, b.cuda_runtime);
  expect(std::strlen(b.version) > 0 && std::strlen(b.architectures) > 0, "build_info()");

  const fusedstep::DeviceInfo device = fusedstep::hopper_device_info_for_tests();
  fusedstep::MhcBoundaryParams p = mhc_params();
  fusedstep::Result r = fusedstep::check(p, device);
  expect(r.ok(), "check() accepts valid mHC boundary parameters", r.detail());

  p.hidden = 5000;
  r = fusedstep::check(p, device);
  expect(!r.ok() && r.status() == fusedstep::Status::kInvalidShape &&
             std::strstr(r.detail(), "hidden") != nullptr,
         "check() names the bad field (hidden = 5000)", r.detail());

  fusedstep::KdaDecodeParams k;  // every pointer null: rejected, naming a field
  k.batch = 1;
  k.heads = 2;
  r = fusedstep::check(k, device);
  expect(!r.ok() && std::strstr(r.detail(), "kda_decode") != nullptr,
         "check() rejects KDA parameters without tensors", r.detail());

  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
