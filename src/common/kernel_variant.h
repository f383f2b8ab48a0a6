// SPDX-License-Identifier: Apache-2.0
// The one dispatch pattern of both operations: a configuration's compiled kernel as the
// host sees it (typed by its argument struct, so no kernel pointer is ever cast), a
// table of them keyed by the configuration plan() picks, per-device attribute setup once,
// and the launch. Host code.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>

#include "common/config_list.h"
#include "common/internal.h"
#include "common/launch.h"

namespace fusedstep::detail {

template <class Args>
struct KernelVariant {
  void (*fn)(Args) = nullptr;
  size_t max_dynamic_smem = 0;  // the largest dynamic shared memory any launch gives it
};

// The compiled kernels of a ConfigList, in its order: `make.template operator()<Cfg>()`
// returns configuration Cfg's variant (a templated lambda). `carveout`: the preferred
// L1 / shared-memory split of every variant (-1: the runtime's default).
template <class List, class Args>
class KernelTable {
  using Key = typename List::Key;
  static constexpr int N = List::kSize;

 public:
  template <class Make>
  explicit KernelTable(Make make, int carveout = -1) : KernelTable(List{}, make, carveout) {}
  KernelTable(const KernelTable&) = delete;
  KernelTable& operator=(const KernelTable&) = delete;

  // The variant of `key`, or nullptr where the build has none.
  const KernelVariant<Args>* find(const Key& key) const {
    for (int i = 0; i < N; ++i) {
      if (List::kKeys[i] == key) return &variants_[i];
    }
    return nullptr;
  }

  // Opt-in shared memory, non-portable cluster sizes (and the carveout) for every variant
  // the device has the shared memory for, once per device (the device must be current);
  // every later call returns the first result.
  Result prepare(int device, const char* what) {
    if (device < 0 || device >= kMaxDevices) {
      return Result::error(Status::kInvalidValue, "%s: device = %d out of [0, %d)", what, device, kMaxDevices);
    }
    std::call_once(once_[device], [&] {
      InitErrorScope errors;  // a failure is reported, never left pending
      int optin = 0;
      Result r = cuda_result(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), what);
      for (int i = 0; i < N && r.ok(); ++i) {
        if (variants_[i].max_dynamic_smem > static_cast<size_t>(optin)) continue;  // never runs here
        const void* fn = reinterpret_cast<const void*>(variants_[i].fn);
        r = cuda_result(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(variants_[i].max_dynamic_smem)),
                        what);
        if (r.ok()) r = cuda_result(cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1), what);
        if (r.ok() && carveout_ >= 0) {
          r = cuda_result(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, carveout_), what);
        }
      }
      optin_[device] = r.ok() ? optin : 0;
      prepared_[device] = r;
    });
    return prepared_[device];
  }

  // Whether `key` runs on `device` (after prepare): built, and its shared memory fits.
  bool runs(int device, const Key& key) const {
    const KernelVariant<Args>* v = find(key);
    return v != nullptr && device >= 0 && device < kMaxDevices && v->max_dynamic_smem <= static_cast<size_t>(optin_[device]);
  }

 private:
  template <class... Cfgs, class Make>
  KernelTable(ConfigList<Cfgs...>, Make make, int carveout)
      : variants_{make.template operator()<Cfgs>()...}, carveout_(carveout) {}

  static constexpr int kMaxDevices = 64;
  KernelVariant<Args> variants_[N];
  int carveout_ = -1;
  std::once_flag once_[kMaxDevices];
  Result prepared_[kMaxDevices];
  int optin_[kMaxDevices] = {};
};

template <class Args>
Result launch_variant(const KernelVariant<Args>& v, const LaunchConfig& config, const Args& args,
                      const char* what) noexcept {
  return cuda_result(cudaLaunchKernelEx(config.get(), v.fn, args), what);
}

}  // namespace fusedstep::detail
