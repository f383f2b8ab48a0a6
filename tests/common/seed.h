// SPDX-License-Identifier: Apache-2.0
// A fresh random seed per test case: printed, and recorded as a GoogleTest property, so
// that a failure can be replayed with FUSEDSTEP_SEED=<seed>. Shared by the CPU and GPU
// suites (no CUDA here).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

namespace fusedstep::testing {

inline uint64_t fresh_seed() {
  if (const char* env = std::getenv("FUSEDSTEP_SEED")) return std::stoull(env);
  std::random_device rd;
  const uint64_t seed = (uint64_t(rd()) << 32) ^ rd();
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::printf("[ seed     ] %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

}  // namespace fusedstep::testing
