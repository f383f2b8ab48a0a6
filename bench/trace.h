// SPDX-License-Identifier: Apache-2.0
// Development trace build only (-DFUSEDSTEP_TRACE, docs/design.md "Development trace"):
// the phase times a fused kernel recorded in its last launch (common/dev_trace.cuh).
#pragma once

#if defined(FUSEDSTEP_TRACE)
#include <span>

namespace fusedstep::detail {
// Copy the kernel's trace buffer (words); 0 on failure.
int mhc_read_trace(unsigned long long* host, int max_words);
int kda_read_trace(unsigned long long* host, int max_words);
}  // namespace fusedstep::detail

namespace fusedstep::bench {
// Per event: nanoseconds from each CTA's own entry (event 0) and from the earliest entry,
// median and maximum over the first `ctas` CTAs that recorded it in this launch; SMs
// used and the SM clock (entry to `end_event`). names[e] names event e.
void print_trace(int (*read)(unsigned long long*, int), int ctas, int end_event,
                 std::span<const char* const> names);
}  // namespace fusedstep::bench
#endif
