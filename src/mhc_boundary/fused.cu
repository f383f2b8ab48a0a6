// placeholder: implemented by its owner
#include "common/internal.h"
namespace fusedstep::detail {
Result mhc_query_clusters_per_wave(int, int* clusters) noexcept {
  *clusters = 0;
  return Result::success();
}
}  // namespace fusedstep::detail
