// fusedstep-bench: weak stand-ins for library entry points that are not built yet.
// This archive is linked after fusedstep and fusedstep_reference, so the linker only
// pulls it for a symbol those libraries lack; any real definition wins. A stand-in
// reports kUnsupported ("not built yet") or returns no outputs, which the bench
// prints instead of a number: while the operations are being written, the main
// program still links, runs and says plainly what is missing.
#include "common/internal.h"
#include "fusedstep/fusedstep.h"
#include "fusedstep_reference/kda_decode.h"
#include "fusedstep_reference/mhc_boundary.h"

#define FS_WEAK __attribute__((weak))

namespace fusedstep {
namespace {
Result missing(const char* what) {
  return Result::error(Status::kUnsupported, "%s is not in this build of libfusedstep", what);
}
}  // namespace

FS_WEAK int64_t mhc_boundary_weight_words(int64_t, WeightRounding) noexcept { return 0; }
FS_WEAK Result prepare_mhc_boundary_weight_device(const float*, int64_t, WeightRounding, uint32_t*,
                                                  cudaStream_t) noexcept {
  return missing("prepare_mhc_boundary_weight_device");
}
FS_WEAK Result check(const MhcBoundaryParams&, const DeviceInfo&) noexcept {
  return missing("check(MhcBoundaryParams)");
}
FS_WEAK Result plan(const MhcBoundaryParams&, const DeviceInfo&, MhcBoundaryPlan*) noexcept {
  return missing("plan(MhcBoundaryParams)");
}
FS_WEAK Result launch(const MhcBoundaryParams&, const LaunchOptions&, cudaStream_t) noexcept {
  return missing("launch(MhcBoundaryParams)");
}
FS_WEAK Result check(const KdaDecodeParams&, const DeviceInfo&) noexcept {
  return missing("check(KdaDecodeParams)");
}
FS_WEAK Result plan(const KdaDecodeParams&, const DeviceInfo&, KdaDecodePlan*) noexcept {
  return missing("plan(KdaDecodeParams)");
}
FS_WEAK Result launch(const KdaDecodeParams&, const LaunchOptions&, cudaStream_t) noexcept {
  return missing("launch(KdaDecodeParams)");
}

namespace composed {
FS_WEAK int64_t workspace_bytes(const MhcBoundaryParams&) noexcept { return 0; }
FS_WEAK Result launch(const MhcBoundaryParams&, void*, cudaStream_t) noexcept {
  return missing("composed::launch(MhcBoundaryParams)");
}
FS_WEAK int64_t workspace_bytes(const KdaDecodeParams&) noexcept { return 0; }
FS_WEAK Result launch(const KdaDecodeParams&, void*, cudaStream_t) noexcept {
  return missing("composed::launch(KdaDecodeParams)");
}
}  // namespace composed

namespace detail {
FS_WEAK Result mhc_query_clusters_per_wave(int, int* clusters) noexcept {
  *clusters = 0;
  return Result::success();
}
}  // namespace detail

namespace reference {
FS_WEAK MhcBoundaryResult mhc_boundary(const MhcBoundaryProblem&, Precision) { return {}; }
FS_WEAK KdaResult kda_decode(const KdaProblem&, Precision) { return {}; }
}  // namespace reference
}  // namespace fusedstep
