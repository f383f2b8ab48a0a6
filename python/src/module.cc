// SPDX-License-Identifier: Apache-2.0
// The module fusedstep._C: its constants, build_info, device_info and the operations' functions.
//
// fusedstep._C is the nanobind binding of the C++ API (include/fusedstep/) and of the CPU
// reference (reference/include/fusedstep_reference/). Torch-free: tensors arrive through
// DLPack as nb::ndarray (torch, numpy, cupy, ...). This layer only
//   - checks each tensor's dtype, rank, shape and innermost strides against what the
//     params struct can describe, and raises ValueError naming the tensor, its shape,
//     dtype, strides and device and what was expected;
//   - fills the params struct (strides in elements, as the C++ API takes them);
//   - runs check() (MODE_CHECK, with a hand-made H200 DeviceInfo, no GPU needed),
//     launch() (MODE_LAUNCH) or composed::launch() (MODE_COMPOSED) on the caller's stream,
//     or plan() (MODE_PLAN for the tensors' device, MODE_PLAN_H200 for the hand-made H200
//     DeviceInfo) and returns the schedule as a dict;
//   - maps a failed Result to an exception: ValueError for bad arguments (kNullPointer,
//     kMisaligned, kInvalidShape, kInvalidStride, kInvalidValue), NotImplementedError for
//     kUnsupported, RuntimeError for kDeviceUnsupported and kCudaError.
// BF16 tensors may also be given as uint16 bit patterns (numpy has no bfloat16).
// The shared checks are in binding.h, each operation's functions in mhc_binding.cc and
// kda_binding.cc.
#include <string>

#include "binding.h"
#include "fusedstep/build_info.h"

namespace fusedstep_python {
namespace {

nb::dict build_info() {
  const fusedstep::BuildInfo& b = fusedstep::build_info();
  nb::dict d;
  d["version"] = b.version;
  d["commit"] = b.commit;
  d["cuda_version"] = b.cuda_version;
  nb::list archs;
  std::string all = b.architectures;
  for (size_t start = 0; start <= all.size();) {
    size_t end = all.find(';', start);
    if (end == std::string::npos) end = all.size();
    if (end > start) archs.append(all.substr(start, end - start));
    start = end + 1;
  }
  d["architectures"] = archs;
  d["cuda_runtime"] = b.cuda_runtime;
  return d;
}

nb::dict device_info(int device) {
  fusedstep::DeviceInfo info;
  const fusedstep::Result r = fusedstep::get_device_info(device, &info);
  if (!r) raise_result(r, "");
  nb::dict d;
  d["device"] = info.device;
  d["cc_major"] = info.cc_major;
  d["cc_minor"] = info.cc_minor;
  d["sm_count"] = info.sm_count;
  d["l2_bytes"] = info.l2_bytes;
  d["max_smem_per_block_optin"] = info.max_smem_per_block_optin;
  d["cluster_launch"] = info.cluster_launch;
  d["mhc_clusters_per_wave"] = info.mhc_clusters_per_wave;
  d["mhc_one_cta_clusters_per_wave"] = info.mhc_one_cta_clusters_per_wave;
  return d;
}

}  // namespace
}  // namespace fusedstep_python

NB_MODULE(_C, m) {
  using namespace fusedstep_python;
  m.doc() = "fusedstep C++ API binding (torch-free; tensors through DLPack)";
  m.attr("MODE_LAUNCH") = kModeLaunch;
  m.attr("MODE_COMPOSED") = kModeComposed;
  m.attr("MODE_CHECK") = kModeCheck;
  m.attr("MODE_WORKSPACE") = kModeWorkspace;
  m.attr("MODE_PLAN") = kModePlan;
  m.attr("MODE_PLAN_H200") = kModePlanH200;
  m.attr("KDA_MAX_TOKENS") = fusedstep::kKdaMaxTokens;
  m.attr("KDA_MAX_BATCH") = fusedstep::kKdaMaxBatch;
  m.attr("MHC_MAX_TOKENS") = fusedstep::kMhcMaxTokens;

  register_mhc(m);
  register_kda(m);
  m.def("device_info", &device_info, nb::arg("device"));
  m.def("build_info", &build_info);
}
