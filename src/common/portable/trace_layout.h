// SPDX-License-Identifier: Apache-2.0
// Layout of the development trace buffer (FUSEDSTEP_TRACE builds, docs/design.md
// "Development trace"), shared by the kernels' recorder (common/dev_trace.cuh) and
// fusedstep-bench's printer (bench/trace.cc): [globaltimer | clock64][kCtas][kEvents]
// 64-bit words, the last event slot of a CTA holding its SM id.
#pragma once

namespace fusedstep::trace {

inline constexpr int kCtas = 1024;   // CTAs recorded (linear block index)
inline constexpr int kEvents = 24;   // per CTA; the last slot holds the SM id
inline constexpr int kWords = 2 * kCtas * kEvents;

}  // namespace fusedstep::trace
