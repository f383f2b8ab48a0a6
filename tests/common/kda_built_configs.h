// SPDX-License-Identifier: Apache-2.0
// The KDA fused kernel configurations the library builds (src/kda_decode/config.h):
// every one a default plan selects. The tests run every schedule of these and check
// that plan() accepts exactly them.
#pragma once

#include <vector>

#include "fusedstep/kda_decode.h"

namespace fusedstep::testing {

// (cluster, lanes per row, staged): state in registers (early 0 / 1) unless staged
// (early 2 / 3; one CTA per head always stages).
struct BuiltConfig {
  int cluster, lanes;
  bool staged;
};
inline constexpr BuiltConfig kBuiltDecode[] = {{1, 16, true}, {2, 8, false}, {2, 16, false},
                                               {4, 8, false}, {4, 16, false}, {8, 16, false}};
inline constexpr BuiltConfig kBuiltVerify[] = {{1, 16, true},  {2, 8, true},  {2, 16, false}, {4, 8, false},
                                               {4, 16, false}, {4, 16, true}, {8, 8, true}};

// Whether a resolved schedule (cluster, lanes, early) names a built configuration.
inline bool is_built(bool verify, int cluster, int lanes, int early) {
  const bool staged = early >= 2 || cluster == 1;
  auto in = [&](const auto& list) {
    for (const BuiltConfig& c : list) {
      if (c.cluster == cluster && c.lanes == lanes && c.staged == staged) return true;
    }
    return false;
  };
  return verify ? in(kBuiltVerify) : in(kBuiltDecode);
}

// Every verify schedule of the built configurations: early 0 / 1 in registers, early 2
// staged in chunks (C = 1 always stages: early 0 / 1).
inline std::vector<KdaSchedule> verify_schedules() {
  std::vector<KdaSchedule> out;
  for (const BuiltConfig& c : kBuiltVerify) {
    for (int early : {0, 1, 2}) {
      if (c.cluster == 1 ? early == 2 : c.staged != (early == 2)) continue;
      KdaSchedule s;
      s.cluster = c.cluster;
      s.lanes_per_row = c.lanes;
      s.early = early;
      out.push_back(s);
    }
  }
  return out;
}

}  // namespace fusedstep::testing
