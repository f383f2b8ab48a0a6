// SPDX-License-Identifier: Apache-2.0
// KDA decode / verify: the compile-time configurations of the fused kernels and the list
// of those the library builds. A configuration is the kernel's single template
// parameter; plan() maps a resolved schedule to one of them (ConfigKey), launch() runs
// the kernel compiled for it (instantiations/*.cu). Host and device code.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "float_bits.h"  // FS_HD
#include "common/config_list.h"
#include "fusedstep/kda_decode.h"

namespace fusedstep::kda {

inline constexpr int kHead = kKdaHeadDim;   // keys = values = inputs of F_B per head
inline constexpr int kMainThreads = 128;    // thread i = element i of the head's q and k
inline constexpr int kThreads = kMainThreads + 32;  // + the gate warp
inline constexpr int kWavePasses = 4;       // q = 1, staged state: passes updated per wave
inline constexpr int kVerifyChunkRows = 32; // verify, staged: rows per chunk (two 16 KB buffers)
inline constexpr int kMaxTokens = kKdaMaxTokens;
inline constexpr int kCompactTokens = 4;    // the compact verify's per-token arrays

// ptxas register bounds differ per target: sm_100a spills under some of sm_90a's.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
inline constexpr bool kSm100 = true;
#else
inline constexpr bool kSm100 = false;
#endif

// m16 tiles of F_B rows a CTA of a C-CTA cluster projects (C = 16: half of one used).
FS_HD constexpr int fb_tiles(int cluster) { return kHead / cluster >= 16 ? kHead / cluster / 16 : 1; }

// Staged F_B fragments: [tile][chunk][half][lane] pieces of 8 bytes.
FS_HD constexpr size_t fb_fragment_bytes(int cluster) { return size_t(fb_tiles(cluster)) * 8 * 2 * 32 * 8; }

// Bytes of a state element: FP32 or BF16.
FS_HD constexpr size_t state_bytes(bool bf16) { return bf16 ? 2 : 4; }

// Dynamic shared memory of the q = 1 kernel: the CTA's staged state rows, then the
// staged F_B fragments (stage_fb: early 3; otherwise, in the four-CTA build, the gate
// warp's first tile pair: decode_kernel.cuh, gate_warp).
FS_HD constexpr size_t decode_dynamic_smem(int cluster, bool staged, bool stage_fb, bool bf16, bool four_ctas = false) {
  return (staged ? size_t(kHead / cluster) * kHead * state_bytes(bf16) : 0) +
         (stage_fb    ? fb_fragment_bytes(cluster)
          : four_ctas ? 2 * fb_fragment_bytes(cluster) / fb_tiles(cluster)
                      : 0);
}

// Verify with staged state (C = 1, or early 2): the CTA's rows in chunks of up to
// kVerifyChunkRows, at most two chunk buffers in shared memory.
FS_HD constexpr int verify_chunk_rows(int cluster) {
  return kHead / cluster < kVerifyChunkRows ? kHead / cluster : kVerifyChunkRows;
}
FS_HD constexpr int verify_chunk_buffers(int cluster) {
  return kHead / cluster / verify_chunk_rows(cluster) >= 2 ? 2 : 1;
}
// A chunk buffer holds a chunk's rows in FP32 size for either state type: C <= 2 stages
// F_B fragments in the second buffer before it holds rows (16 KB of them).
FS_HD constexpr size_t verify_chunk_buffer_bytes(int cluster) {
  return size_t(verify_chunk_rows(cluster)) * kHead * sizeof(float);
}
// Dynamic shared memory of the verify: staged state takes its chunk buffers, state in
// registers (C >= 2) the staged F_B fragments (stage_fb: early 1).
FS_HD constexpr size_t verify_dynamic_smem(int cluster, bool staged, bool stage_fb) {
  return staged ? size_t(verify_chunk_buffers(cluster)) * verify_chunk_buffer_bytes(cluster)
                : (stage_fb ? fb_fragment_bytes(cluster) : 0);
}

// A configuration as plan() names it at run time.
struct ConfigKey {
  bool verify = false;
  int cluster = 0;
  int lanes = 0;
  bool staged = false;
  int tokens = 1;  // verify: the per-token arrays' capacity
  bool state_bf16 = false;
  bool four_ctas = false;  // q = 1, C = 1, BF16 state: the build for four CTAs per SM
  friend constexpr bool operator==(const ConfigKey&, const ConfigKey&) = default;
};

// The q = 1 kernel: kCluster CTAs per head (128 / kCluster state rows each), kLanes lanes
// per state row, state rows staged in shared memory (kStaged) or held in registers, the
// state stored as State (float or __nv_bfloat16; the recurrence runs in FP32 either way).
// FourCtas (C = 1, BF16): built for four CTAs per SM (96 registers), its gate warp's first
// F_B tile pair staged in shared memory instead of held in registers across the PDL wait.
template <int Cluster, int Lanes, bool Staged, class StateT = float, bool FourCtas = false>
struct DecodeConfig {
  static constexpr int kCluster = Cluster;
  static constexpr int kLanes = Lanes;
  static constexpr bool kStaged = Staged;
  using State = StateT;
  static constexpr bool kStateBf16 = std::is_same_v<State, __nv_bfloat16>;
  static_assert(kStateBf16 || std::is_same_v<State, float>, "FP32 or BF16 state");
  static_assert(kStaged || kCluster > 1, "one CTA per head stages its 128 rows");
  static constexpr bool kFourCtas = FourCtas;
  static_assert(!kFourCtas || (kCluster == 1 && kStateBf16), "the four-CTA build: C = 1, BF16 state");
  // Minimum CTAs per SM (0: ptxas's own choice), for both state dtypes. <4, 16,
  // registers> is held to four on sm_90a (<= 102 registers): at three, batch 8's 96
  // four-CTA clusters (12 heads) no longer run in one wave (38% slower). <2, 16,
  // registers>, and <4, 8, registers> on sm_100a, are built for three (<= 136 registers):
  // ptxas's own choice spills 4 bytes.
  static constexpr int min_ctas(bool sm100) {
    return kFourCtas                                  ? 4
           : kStaged                                  ? 0
           : kCluster == 4 && kLanes == 16 && !sm100 ? 4
           : kCluster == 2 && kLanes == 16            ? 3
           : kCluster == 4 && kLanes == 8 && sm100    ? 3
                                                      : 0;
  }
  static constexpr int kMinCtas = min_ctas(kSm100);
  static constexpr size_t kMaxDynamicSmem = decode_dynamic_smem(kCluster, kStaged, true, kStateBf16);
  static constexpr ConfigKey key() { return {false, kCluster, kLanes, kStaged, 1, kStateBf16, kFourCtas}; }
};

// The verify kernel (q = 2..8, token counts, records): as DecodeConfig, with per-token
// shared arrays for up to kTokens tokens.
template <int Cluster, int Lanes, bool Staged, int Tokens = kMaxTokens, class StateT = float>
struct VerifyConfig {
  static constexpr int kCluster = Cluster;
  static constexpr int kLanes = Lanes;
  static constexpr bool kStaged = Staged;
  static constexpr int kTokens = Tokens;
  using State = StateT;
  static constexpr bool kStateBf16 = std::is_same_v<State, __nv_bfloat16>;
  static_assert(kStateBf16 || std::is_same_v<State, float>, "FP32 or BF16 state");
  static_assert(kCluster <= 8, "the verify runs whole m16 gate tiles per CTA");
  static_assert(kStaged || kCluster > 1, "one CTA per head stages its rows");
  // Minimum CTAs per SM (0: ptxas's own choice). C = 1 (the large batches) is built for
  // three (up to 136 registers): left alone, ptxas stops at 128 and spills 8 bytes in the
  // 16-lane variant. The compact variants (kTokens < kMaxTokens) are built for four on
  // sm_90a only: on sm_100a that bound spills 20 bytes in the 8-lane one. sm_100a builds
  // C = 2 with staged rows for three: at ptxas's own 96 registers its 16-lane variant
  // spills 16 bytes, which fails the FUSEDSTEP_BLACKWELL build (spills are errors).
  // BF16 state: the compact variant at four spills 8 bytes; ptxas's choice (128) it is.
  static constexpr int min_ctas(bool sm100) {
    return sm100 ? (kCluster == 1 || (kCluster == 2 && kStaged) ? 3 : 0)
                 : (kCluster == 1 ? 3 : kTokens < kMaxTokens ? (kStateBf16 ? 0 : 4) : 0);
  }
  static constexpr int kMinCtas = min_ctas(kSm100);
  static constexpr size_t kMaxDynamicSmem = verify_dynamic_smem(kCluster, kStaged, !kStaged);
  static constexpr ConfigKey key() { return {true, kCluster, kLanes, kStaged, kTokens, kStateBf16}; }
};

// The configurations the default schedules select (plan.cc), and only those, for each
// state type: an explicit schedule must name one of them. Each list is instantiated by
// instantiations/*.cu.
template <class S>
using DecodeConfigsOf = ConfigList<DecodeConfig<1, 16, true, S>, DecodeConfig<2, 8, false, S>, DecodeConfig<2, 16, false, S>,
                                   DecodeConfig<4, 8, false, S>, DecodeConfig<4, 16, false, S>, DecodeConfig<8, 16, false, S>>;
template <class S>
using VerifyConfigsOf =
    ConfigList<VerifyConfig<1, 16, true, kMaxTokens, S>, VerifyConfig<2, 8, true, kMaxTokens, S>,
               VerifyConfig<2, 8, true, kCompactTokens, S>, VerifyConfig<2, 16, false, kMaxTokens, S>,
               VerifyConfig<4, 8, false, kMaxTokens, S>, VerifyConfig<4, 16, false, kMaxTokens, S>,
               VerifyConfig<4, 16, true, kMaxTokens, S>, VerifyConfig<8, 8, true, kMaxTokens, S>>;
// A BF16 state at C = 1 also has the four-CTA build (plan.cc: the larger calls).
using DecodeConfigs =
    ConcatConfigs<ConcatConfigs<DecodeConfigsOf<float>, DecodeConfigsOf<__nv_bfloat16>>::type,
                  ConfigList<DecodeConfig<1, 16, true, __nv_bfloat16, true>>>::type;
using VerifyConfigs = ConcatConfigs<VerifyConfigsOf<float>, VerifyConfigsOf<__nv_bfloat16>>::type;

// The minimum CTAs per SM that the config of `key` in List is built for on sm_100a or
// sm_90a (0: ptxas's own choice; -1: no such config), for plan()'s wave estimate.
template <class List>
struct MinCtasOf;
template <class... Cfgs>
struct MinCtasOf<ConfigList<Cfgs...>> {
  static constexpr int get(const ConfigKey& key, bool sm100) {
    int found = -1;
    ((Cfgs::key() == key ? (found = Cfgs::min_ctas(sm100), 0) : 0), ...);
    return found;
  }
};

}  // namespace fusedstep::kda
