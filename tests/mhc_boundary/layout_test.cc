// SPDX-License-Identifier: Apache-2.0
// The fused kernels' elementwise work split (mhc_boundary/layout.h): tile_task_item and
// packed_task_item give every (token, 32-wide chunk) item of a tile to exactly one lane
// group of one task, and where a slice has an even number of chunks, two lane groups
// (g and g + 4, g < 4, in whole tiles; g and g + 1, g even, packed) take chunks 2c' and
// 2c' + 1 of one token (the 128-byte row pieces the kernels' memory traffic relies on);
// that a whole tile's B-fragment stores fall on 32 banks; and the chunk sums' row pitch
// keeps the slice sums' lanes on different shared-memory banks.
#include <gtest/gtest.h>

#include <vector>

#include "mhc_boundary/layout.h"

namespace fusedstep::mhc {
namespace {

constexpr int kLaneGroups = 8;

TEST(MhcLayout, TileTasksCoverEveryItemOnceInChunkPairs) {
  for (int wide_chunks = 1; wide_chunks <= 28; ++wide_chunks) {
    for (int tp : {8, 16, 24, 32}) {
      std::vector<int> seen(tp * wide_chunks, 0);
      const int tasks = tile_tasks(tp, wide_chunks);
      for (int task = 0; task < tasks; ++task) {
        for (int g = 0; g < kLaneGroups; ++g) {
          int t = -1, c = -1;
          tile_task_item(task, g, wide_chunks, t, c);
          ASSERT_TRUE(t >= 0 && t < tp && c >= 0 && c < wide_chunks)
              << "wide_chunks " << wide_chunks << ", tp " << tp << ", task " << task << ", g " << g;
          ++seen[t * wide_chunks + c];
          if (wide_chunks % 2 == 0 && g < 4) {
            int t1 = -1, c1 = -1;
            tile_task_item(task, g + 4, wide_chunks, t1, c1);
            EXPECT_EQ(t1, t);
            EXPECT_EQ(c % 2, 0);
            EXPECT_EQ(c1, c + 1) << "wide_chunks " << wide_chunks << ", task " << task << ", g " << g;
          }
        }
      }
      for (int k = 0; k < tp * wide_chunks; ++k) {
        ASSERT_EQ(seen[k], 1) << "wide_chunks " << wide_chunks << ", tp " << tp << ", item " << k;
      }
    }
  }
}

TEST(MhcLayout, PackedTasksCoverTheValidItemsOnceInChunkPairs) {
  for (int wide_chunks = 1; wide_chunks <= 28; ++wide_chunks) {
    for (int valid = 1; valid <= 32; ++valid) {
      std::vector<int> seen(valid * wide_chunks, 0);
      const int tasks = packed_tasks(valid, wide_chunks);
      int skipped = 0;
      for (int task = 0; task < tasks; ++task) {
        for (int g = 0; g < kLaneGroups; ++g) {
          int t = -1, c = -1;
          if (!packed_task_item(task, g, valid, wide_chunks, t, c)) {
            ++skipped;
            continue;
          }
          ASSERT_TRUE(t >= 0 && t < valid && c >= 0 && c < wide_chunks)
              << "wide_chunks " << wide_chunks << ", valid " << valid << ", task " << task << ", g " << g;
          ++seen[t * wide_chunks + c];
          int t1 = -1, c1 = -1;
          if (wide_chunks % 2 == 0 && g % 2 == 0 && packed_task_item(task, g + 1, valid, wide_chunks, t1, c1)) {
            EXPECT_EQ(t1, t);
            EXPECT_EQ(c % 2, 0);
            EXPECT_EQ(c1, c + 1) << "wide_chunks " << wide_chunks << ", valid " << valid << ", task " << task;
          }
        }
      }
      EXPECT_EQ(skipped, tasks * kLaneGroups - valid * wide_chunks) << "wide_chunks " << wide_chunks;
      for (int k = 0; k < valid * wide_chunks; ++k) {
        ASSERT_EQ(seen[k], 1) << "wide_chunks " << wide_chunks << ", valid " << valid << ", item " << k;
      }
    }
  }
}

// The elementwise pass stores (and the layer input reads) a task's new-residual B
// fragments as 8-byte words, s_res[((8 c + 2 s + half) tp + t) 4 + q] (kernel.cuh,
// store_b_fragments), a half warp (lane groups 0-3 or 4-7, 128 bytes) at a time: with a
// whole tile's chunk pairs each half warp's 32 words fall on 32 different banks.
TEST(MhcLayout, TileTaskFragmentStoresFallInDifferentBanks) {
  constexpr int kBanks = 32, kGroupsPerHalfWarp = 4, kLanesPerGroup = 4;
  for (int wide_chunks = 2; wide_chunks <= 28; wide_chunks += 2) {
    for (int tp : {8, 16, 24, 32}) {
      for (int task = 0; task < tile_tasks(tp, wide_chunks); ++task) {
        for (int step_in_chunk = 0; step_in_chunk < 8; ++step_in_chunk) {  // 2 s + half
          for (int half_warp = 0; half_warp < 2; ++half_warp) {
            std::vector<int> words_on_bank(kBanks, 0);
            for (int g = half_warp * kGroupsPerHalfWarp; g < (half_warp + 1) * kGroupsPerHalfWarp; ++g) {
              int t = -1, c = -1;
              tile_task_item(task, g, wide_chunks, t, c);
              for (int q = 0; q < kLanesPerGroup; ++q) {
                const int64_t word = 2 * ((static_cast<int64_t>(8 * c + step_in_chunk) * tp + t) * 4 + q);
                ++words_on_bank[word % kBanks];
                ++words_on_bank[(word + 1) % kBanks];
              }
            }
            for (int bank = 0; bank < kBanks; ++bank) {
              ASSERT_EQ(words_on_bank[bank], 1) << "wide_chunks " << wide_chunks << ", tp " << tp << ", task " << task
                                                << ", half warp " << half_warp << ", bank " << bank;
            }
          }
        }
      }
    }
  }
}

// The slice sums read chunk k of 2 * tp rows, a row per lane: with ssq_pitch() the 32
// lanes of a warp hit 32 different shared-memory banks (4-byte words, 32 banks) for every
// supported hidden size and chunk, and the rows still hold every chunk.
TEST(MhcLayout, SliceSumRowsFallInDifferentBanks) {
  constexpr int kBanks = 32;
  for (int64_t hidden = 512; hidden <= 16384; hidden += 512) {
    if (!hidden_supported(hidden)) continue;
    const int chunks = static_cast<int>(slice_of(hidden) / 8);
    const int pitch = ssq_pitch(chunks);
    ASSERT_GE(pitch, chunks) << "hidden " << hidden;
    for (int k = 0; k < chunks; ++k) {
      std::vector<int> lanes_on_bank(kBanks, 0);
      for (int lane = 0; lane < kBanks; ++lane) ++lanes_on_bank[(lane * pitch + k) % kBanks];
      for (int bank = 0; bank < kBanks; ++bank) {
        ASSERT_EQ(lanes_on_bank[bank], 1) << "hidden " << hidden << ", chunk " << k << ", bank " << bank;
      }
    }
  }
}

}  // namespace
}  // namespace fusedstep::mhc
