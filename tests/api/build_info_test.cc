// SPDX-License-Identifier: Apache-2.0
// build_info() and the architecture rule get_device_info() applies: which compute
// capabilities a CMAKE_CUDA_ARCHITECTURES list holds code for, and the error for a GPU
// it holds none for. Host only.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "common/build_info.h"
#include "fusedstep/build_info.h"

namespace fusedstep {
namespace {

using detail::architectures_run_on;

TEST(BuildInfo, NamesVersionCommitToolkitAndArchitectures) {
  const BuildInfo& b = build_info();
  ASSERT_NE(b.version, nullptr);
  EXPECT_GT(std::strlen(b.version), 0u);
  EXPECT_GT(std::strlen(b.commit), 0u);
  EXPECT_EQ(std::string(b.cuda_version).rfind("13.", 0), 0u) << b.cuda_version;
  EXPECT_GT(std::strlen(b.architectures), 0u);
  EXPECT_TRUE(std::string(b.cuda_runtime) == "static" || std::string(b.cuda_runtime) == "shared");
  EXPECT_EQ(has_code_for(9, 0), architectures_run_on(b.architectures, 9, 0));
}

TEST(BuildInfo, ArchitectureSpecificCodeRunsOnExactlyItsComputeCapability) {
  EXPECT_TRUE(architectures_run_on("90a", 9, 0));
  EXPECT_FALSE(architectures_run_on("90a", 10, 0));
  EXPECT_FALSE(architectures_run_on("90a", 8, 9));
  EXPECT_FALSE(architectures_run_on("90a", 12, 0));
  EXPECT_TRUE(architectures_run_on("90a;100a", 10, 0));
  EXPECT_FALSE(architectures_run_on("90a;100a", 10, 3));  // B300: 100a does not run there
  EXPECT_FALSE(architectures_run_on("90a;100a", 12, 0));  // RTX 50xx / RTX PRO 6000
  EXPECT_TRUE(architectures_run_on("100a-real", 10, 0));
  EXPECT_FALSE(architectures_run_on("90a-virtual", 10, 0));
}

TEST(BuildInfo, FamilyPortableAndPtxEntries) {
  EXPECT_TRUE(architectures_run_on("100f", 10, 3));
  EXPECT_FALSE(architectures_run_on("100f", 12, 0));
  EXPECT_TRUE(architectures_run_on("90-real", 9, 0));
  EXPECT_FALSE(architectures_run_on("90-real", 10, 0));  // SASS stays within its major
  EXPECT_TRUE(architectures_run_on("90", 10, 0));        // "90" carries PTX as well
  EXPECT_TRUE(architectures_run_on("90-virtual", 12, 0));
  EXPECT_FALSE(architectures_run_on("90", 8, 9));
  EXPECT_TRUE(architectures_run_on("80;90a", 8, 6));  // sm_80 SASS runs on 8.6
}

TEST(BuildInfo, SeparatorsAndEntriesItCannotJudge) {
  EXPECT_TRUE(architectures_run_on("90a,100a", 10, 0));
  EXPECT_TRUE(architectures_run_on(" 90a  100a ", 10, 0));
  EXPECT_TRUE(architectures_run_on("all", 8, 0));     // unknown to the rule: not refused here
  EXPECT_TRUE(architectures_run_on("native", 12, 0));
  EXPECT_TRUE(architectures_run_on("", 9, 0));
  EXPECT_TRUE(architectures_run_on(nullptr, 9, 0));
  EXPECT_TRUE(architectures_run_on("90a;bogus", 10, 0));
}

TEST(BuildInfo, ErrorForAGpuWithoutCodeNamesItAndTheArchitectures) {
  const Result r = detail::unsupported_architecture(1, "NVIDIA GeForce RTX 5090", 12, 0, "90a;100a");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status(), Status::kDeviceUnsupported);
  const std::string detail = r.detail();
  for (const char* needle : {"device 1", "NVIDIA GeForce RTX 5090", "compute capability 12.0",
                             "90a;100a", "CMAKE_CUDA_ARCHITECTURES"}) {
    EXPECT_NE(detail.find(needle), std::string::npos) << needle << " not in: " << detail;
  }
  const std::string old = detail::unsupported_architecture(0, "NVIDIA A100-SXM4-80GB", 8, 0, "90a").detail();
  EXPECT_NE(old.find("compute capability 8.0"), std::string::npos) << old;
  EXPECT_NE(old.find("9.0 or newer"), std::string::npos) << old;
  // A long device name is cut, never overflows the message.
  const std::string long_name(300, 'x');
  const std::string cut = detail::unsupported_architecture(0, long_name.c_str(), 12, 1, "90a").detail();
  EXPECT_NE(cut.find("compute capability 12.1"), std::string::npos) << cut;
}

}  // namespace
}  // namespace fusedstep
