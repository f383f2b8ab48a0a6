// SPDX-License-Identifier: Apache-2.0
// mHC boundary: the decomposition every path shares (host weight preparation, the
// composed reference path, the fused kernel, the tests). docs/numerics.md, "mHC".
//
// Slice r (0..15) of hidden is [r*S, (r+1)*S), S = hidden / 16; a CTA of the fused
// kernel's cluster owns one slice. The 4*S k-values of a slice (4 streams) are walked
// in k16 steps kk = 8*c + kb: chunk c covers hidden [32c, 32c+32) of the slice, stream
// j = kb / 2, half = kb % 2. In the m16n8k16 operands, k-index 2q + e (q = 0..3,
// e = 0..1) holds hidden 32c + 8q + 4*half + e and k-index 2q + 8 + e holds
// 32c + 8q + 4*half + 2 + e: a thread that owns 8 consecutive hidden elements owns
// whole fragment words. Eight MMA warps per slice take consecutive runs of
// k_steps / 8 steps (the accumulation chains of the contract).
//
// Prepared weight: uint32 words [16 slices][k_steps][m_tiles][32 lanes][4]; word i of
// (m tile mt, lane) is the lane's A-fragment register a_i of the stacked rows
// [part 0 (24 rows); part 1 (24 rows); part 2 (24 rows, FP32 mode)], zero-padded to
// m_tiles * 16 rows (3 tiles for TF32 modes, 5 for FP32). A warp loads one m tile of
// one k step as 512 contiguous bytes.
#pragma once

#include <cstdint>

#include "float_bits.h"
#include "fusedstep/weight_rounding.h"

namespace fusedstep::mhc {

inline constexpr int kCluster = 16;
inline constexpr int kStreams = 4;
inline constexpr int kMixes = 24;
inline constexpr int kMmaWarps = 8;

FS_HD int64_t slice_of(int64_t hidden) { return hidden / kCluster; }
FS_HD int64_t k_steps(int64_t hidden) { return kStreams * slice_of(hidden) / 16; }
FS_HD int64_t steps_per_warp(int64_t hidden) { return k_steps(hidden) / kMmaWarps; }
FS_HD int parts_of(WeightRounding r) { return bits::weight_parts(r); }
FS_HD int m_tiles(WeightRounding r) { return parts_of(r) == 2 ? 3 : 5; }
FS_HD int64_t weight_words(int64_t hidden, WeightRounding r) {
  return int64_t(kCluster) * k_steps(hidden) * m_tiles(r) * 32 * 4;
}
// Word offset of (slice, step, m tile, lane, register).
FS_HD int64_t weight_word_index(int64_t hidden, WeightRounding r, int slice, int64_t step,
                                int mt, int lane, int reg) {
  return (((int64_t(slice) * k_steps(hidden) + step) * m_tiles(r) + mt) * 32 + lane) * 4 + reg;
}

// Stream and hidden index (within the slice) of k-index `k` (0..15) of step `step`.
struct KCoord {
  int stream;
  int64_t hidden_in_slice;
};
FS_HD KCoord k_coord(int64_t step, int k) {
  const int64_t c = step / 8;
  const int kb = static_cast<int>(step % 8);
  const int q = (k % 8) / 2, e = k % 2, upper = k / 8;
  return KCoord{kb / 2, 32 * c + 8 * q + 4 * (kb % 2) + 2 * upper + e};
}

// Row of the stacked weight held by A-fragment register `reg` of `lane` in tile mt,
// and the k-index of its low half (the high half is k + 1).
FS_HD int a_row(int mt, int lane, int reg) { return 16 * mt + lane / 4 + 8 * (reg & 1); }
FS_HD int a_k(int lane, int reg) { return 2 * (lane % 4) + 8 * (reg >> 1); }

// The fused kernels' elementwise pass: which (tile token t, 32-wide chunk c) item lane
// group g (of eight) of warp task `task` takes; lane q of the group takes 8-wide chunk
// 4c + q. A token's chunks go in pairs (2c', 2c' + 1) on two lane groups of one warp
// instruction, so that every row piece of a token's slice (x, the residual streams, the
// new residual, layer_input) is a whole 128-byte line; single chunks (64 bytes) where a
// slice has an odd number of them (64-byte pieces are 6-17% slower at T >= 64).
FS_HD int chunk_pair_log2(int wide_chunks) { return wide_chunks % 2 == 0 ? 1 : 0; }
// Whole tiles pair lane groups g and g + 4 (g < 4): a half warp (lane groups 0-3 or
// 4-7) then takes four tokens of one chunk, whose B fragments in shared memory are 32
// consecutive words, so the elementwise pass's stores and the layer input's reads of them
// are conflict-free (pairs on g and g ^ 1 put two chunks' fragments on the same banks,
// two-way: under 1% slower at T >= 128). Packed items keep g and g ^ 1: there the remap
// costs 24-32 instructions and is slower at T = 1-4. item_slot: lane group g's
// place among a whole-tile task's eight items (items 2k and 2k + 1, a pair, go to lane
// groups k and k + 4).
FS_HD int item_slot(int g, int log2) { return log2 != 0 ? ((g & 3) << 1) | (g >> 2) : g; }
// Whole tiles of tp tokens (a multiple of 8): tile_tasks tasks; task `task` takes token
// 4 * (task / pairs) + g % 4 and chunk 2 * (task % pairs) + g / 4 (with single chunks:
// 8 tokens of chunk task % wide_chunks).
FS_HD int tile_tasks(int tp, int wide_chunks) { return tp / 8 * wide_chunks; }
FS_HD void tile_task_item(int task, int g, int wide_chunks, int& t, int& c) {
  const int log2 = chunk_pair_log2(wide_chunks), pairs = wide_chunks >> log2;
  const int slot = item_slot(g, log2);
  t = (task / pairs) * (8 >> log2) + (slot >> log2);
  c = ((task % pairs) << log2) + (slot & ((1 << log2) - 1));
}
// Only the `valid` tokens' items, packed into packed_tasks tasks: item 8 * task + g,
// pair by pair (lane groups g and g ^ 1), the pair's tokens in order. False past the
// last item.
FS_HD int packed_tasks(int valid, int wide_chunks) { return (valid * wide_chunks + 7) / 8; }
FS_HD bool packed_task_item(int task, int g, int valid, int wide_chunks, int& t, int& c) {
  const int log2 = chunk_pair_log2(wide_chunks);
  const int i = task * 8 + g;
  const int span = valid << log2;  // the items of one chunk pair
  const int p = i / span, r = i - p * span;
  t = r >> log2;
  c = (p << log2) + (r & ((1 << log2) - 1));
  return c < wide_chunks;
}

// Row pitch, in floats, of the fused kernels' chunk sums of squares in shared memory
// ([residual, li][tp][pitch], `chunks` = the slice's 8-wide chunks): one more than the
// chunks, an odd number, so that the slice sums' lanes, a row each, read 32 different
// banks. A pitch of `chunks` puts all 32 lanes on one bank at hidden 4096 (32 chunks) and
// eight on each at 5120 and 7168 (40, 56): up to 9% slower.
FS_HD int ssq_pitch(int chunks) { return chunks + 1; }

// The hidden sizes the kernel supports: a multiple of 512 (16 slices of whole 32-wide
// chunks) whose k steps split evenly over the eight MMA warps.
FS_HD bool hidden_supported(int64_t hidden) {
  return hidden > 0 && hidden % 512 == 0 && k_steps(hidden) % kMmaWarps == 0;
}

}  // namespace fusedstep::mhc
