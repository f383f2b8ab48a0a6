// SPDX-License-Identifier: Apache-2.0
// Development trace printer (FUSEDSTEP_TRACE builds only; see trace.h).
#include "trace.h"

#if defined(FUSEDSTEP_TRACE)
#include <algorithm>
#include <cstdio>
#include <vector>

#include "trace_layout.h"

namespace fusedstep::bench {

void print_trace(int (*read)(unsigned long long*, int), int ctas, int end_event,
                 std::span<const char* const> names) {
  constexpr int kEvents = trace::kEvents, kMaxCtas = trace::kCtas;
  std::vector<unsigned long long> t(trace::kWords);
  if (read(t.data(), static_cast<int>(t.size())) == 0) {
    std::printf("    trace: read failed\n");
    return;
  }
  ctas = std::min(ctas, kMaxCtas);
  if (ctas <= 0) return;
  auto at = [&](int c, int e) { return t[c * kEvents + e]; };
  auto cycles = [&](int c, int e) { return t[(kMaxCtas + c) * kEvents + e]; };
  unsigned long long first = ~0ull;
  for (int c = 0; c < ctas; ++c) first = std::min(first, at(c, 0));
  // An event belongs to this launch when it lies within a second of the CTA's entry
  // (the buffer keeps older launches' values where this one did not record).
  auto fresh = [&](int c, int e) { return at(c, e) >= at(c, 0) && at(c, e) - at(c, 0) < 1000000000ull; };
  std::vector<int> sm_count(4096, 0);
  for (int c = 0; c < ctas; ++c) ++sm_count[at(c, kEvents - 1) & 4095];
  int sms = 0, doubled = 0;
  for (int n : sm_count) {
    sms += n > 0;
    doubled += n > 1;
  }
  std::vector<double> ghz;
  for (int c = 0; c < ctas; ++c) {
    if (!fresh(c, end_event)) continue;
    const double ns = static_cast<double>(at(c, end_event) - at(c, 0));
    if (ns > 0) ghz.push_back(static_cast<double>(cycles(c, end_event) - cycles(c, 0)) / ns);
  }
  std::sort(ghz.begin(), ghz.end());
  std::printf("    trace: %d CTAs on %d SMs (%d SMs with >1 CTA), SM clock %.2f GHz (median); ns: event "
              "CTAs rel-own(med,max) abs(med,max)\n",
              ctas, sms, doubled, ghz.empty() ? 0.0 : ghz[ghz.size() / 2]);
  for (int e = 0; e < std::min(static_cast<int>(names.size()), kEvents - 1); ++e) {
    std::vector<long long> rel, ab;
    for (int c = 0; c < ctas; ++c) {
      if (!fresh(c, e)) continue;
      rel.push_back(static_cast<long long>(at(c, e) - at(c, 0)));
      ab.push_back(static_cast<long long>(at(c, e) - first));
    }
    if (rel.empty()) continue;
    std::sort(rel.begin(), rel.end());
    std::sort(ab.begin(), ab.end());
    std::printf("    %2d %-16s %5zu %7lld %7lld   %7lld %7lld\n", e, names[e], rel.size(), rel[rel.size() / 2],
                rel.back(), ab[ab.size() / 2], ab.back());
  }
}

}  // namespace fusedstep::bench
#endif
