// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench: the KDA decode / verify rows. Per shape: an exactness run (fused
// and composed from identical copies of the states, padding slots mixed in; every
// output, state and conv-state byte compared), then both paths timed as CUDA graphs
// over buffer sets of distinct "layers" (weights, activations and states), ~4x L2
// in total. Optionally a sweep of the fused schedules, and (record mode) the
// RecoverSSM commit of the verify's records.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench.h"
#include "device_util.h"
#include "kda_peer.h"
#include "report.h"

namespace fusedstep::bench {
namespace {

constexpr int kMaxBufferSets = 256;

struct Shape {
  int heads = 12;
  int batch = 1;
  int q = 1;
  bool records = false;  // RecoverSSM record mode (q > 1): records written, state only read
  bool hot_activations = false;  // every buffer set reads set 0's activations (--kda-activations hot)
  bool raw_gate = false;  // the caller's raw_g [rows, dim] instead of f_a and F_B (--kda-gate raw_g)
  bool slots_in_order = false;  // request b's slots b * q + 1 ... instead of a permutation (--kda-slots)
  DType state_dtype = DType::kFp32;  // the recurrent state's (--state-dtype)
  int64_t dim() const { return int64_t{heads} * kKdaHeadDim; }
  int64_t state_element_bytes() const { return state_dtype == DType::kBf16 ? 2 : 4; }
  int64_t state_bytes_per_head() const { return kKdaHeadDim * kKdaHeadDim * state_element_bytes(); }
  int64_t rows() const { return int64_t{batch} * q; }
  int64_t slots() const { return rows() + 1; }  // slot 0 stays unused (padding)
  int64_t taps() const { return q + 2; }
};

// Bytes of one token's records per head: FP32 correction [128] + BF16 k | raw_g [256].
constexpr int64_t kRecordBytesPerHeadToken = kKdaHeadDim * 4 + 2 * kKdaHeadDim * 2;

// Bytes that must move per call (docs/benchmarks.md, "Method"): each state read once and written
// once per written slot, at its dtype's size (record mode: the records instead), activations
// and outputs per row, the conv window (3 taps read, q + 2 written, BF16), the weights once. The
// gate input per row is f_a (F_B among the weights) or, with raw_gate, raw_g.
int64_t floor_bytes(const Shape& s) {
  const int64_t state = int64_t{s.batch} * s.heads * s.state_bytes_per_head();
  const int64_t state_writes = s.records ? s.rows() * s.heads * kRecordBytesPerHeadToken
                               : s.q == 1 ? state
                                          : state * s.q;
  const int64_t gate_input = s.raw_gate ? s.dim() * 2 : kKdaRank * 2;
  const int64_t per_row = 3 * s.dim() * 2 + s.dim() * 2 + s.dim() * 2 + gate_input + s.heads * 2;
  const int64_t conv = int64_t{s.batch} * (3 + s.taps()) * 3 * s.dim() * 2;
  const int64_t weights = (s.raw_gate ? 0 : s.dim() * kKdaRank * 2) + 3 * s.dim() * kKdaConvWidth * 4 + s.dim() * 4 +
                          s.heads * 4 + kKdaHeadDim * 4;
  const int64_t slots = s.rows() * 4 + (s.q > 1 ? s.batch * 4 : 0);
  return state + state_writes + per_row * s.rows() + conv + weights + slots;
}

// Bytes the RecoverSSM commit must move when it folds every token's records (what the
// bench's commit rows ask of it): each checkpoint state read and written once (at its
// dtype's size), the records read once, the slots, accepted counts, a_log and dt_bias.
int64_t commit_floor_bytes(const Shape& s) {
  const int64_t state = int64_t{s.batch} * s.heads * s.state_bytes_per_head();
  return 2 * state + s.rows() * s.heads * kRecordBytesPerHeadToken + s.batch * 8 + s.heads * 4 + s.dim() * 4;
}

struct SetSizes {
  int64_t x, gate_input, raw_beta, output_gate, conv_weight, f_b, a_log, dt_bias, norm_weight;
  int64_t conv_state, state, slots, accepted, output;  // elements
  int64_t state_bytes;                                 // state * the dtype's size
  int64_t record_correction, record_key_gate;         // elements; 0 without records
  int64_t commit_table;  // elements: the commit's slots [batch] and accepted [batch]; 0 without records
};

SetSizes sizes_of(const Shape& s) {
  SetSizes z;
  z.x = s.rows() * 3 * s.dim();
  z.gate_input = s.rows() * (s.raw_gate ? s.dim() : kKdaRank);  // f_a, or raw_g with raw_gate
  z.raw_beta = s.rows() * s.heads;
  z.output_gate = s.rows() * s.dim();
  z.conv_weight = 3 * s.dim() * kKdaConvWidth;
  z.f_b = s.raw_gate ? 0 : s.dim() * kKdaRank;
  z.a_log = s.heads;
  z.dt_bias = s.dim();
  z.norm_weight = kKdaHeadDim;
  z.conv_state = s.slots() * s.taps() * 3 * s.dim();
  z.state = s.slots() * s.heads * kKdaHeadDim * kKdaHeadDim;
  z.state_bytes = z.state * s.state_element_bytes();
  z.slots = s.rows();
  z.accepted = s.batch;
  z.output = s.rows() * s.dim();
  z.record_correction = s.records ? s.rows() * s.heads * kKdaHeadDim : 0;
  z.record_key_gate = s.records ? s.rows() * s.heads * 2 * kKdaHeadDim : 0;
  z.commit_table = s.records ? 2 * int64_t{s.batch} : 0;
  return z;
}

int64_t set_bytes(const SetSizes& z) {
  auto r = DeviceArena::round_up;
  return r(z.x * 2) + r(z.gate_input * 2) + r(z.raw_beta * 2) + r(z.output_gate * 2) + r(z.conv_weight * 4) +
         r(z.f_b * 2) + r(z.a_log * 4) + r(z.dt_bias * 4) + r(z.norm_weight * 4) +
         r(z.conv_state * 2) + r(z.state_bytes) + r(z.slots * 4) + r(z.accepted * 4) + r(z.output * 2) +
         r(z.record_correction * 4) + r(z.record_key_gate * 2) + r(z.commit_table * 4);
}

// Host slot tables of one set: request b owns distinct slots (a random permutation
// of 1..rows, or 1..rows in order), accepted[b] in 1..q.
void make_slots(const Shape& s, std::mt19937_64& rng, std::vector<int32_t>* slots,
                std::vector<int32_t>* accepted) {
  slots->resize(s.rows());
  std::iota(slots->begin(), slots->end(), 1);
  if (!s.slots_in_order) std::shuffle(slots->begin(), slots->end(), rng);
  accepted->resize(s.batch);
  for (auto& a : *accepted) a = 1 + static_cast<int32_t>(rng() % s.q);
}

struct KdaSet {
  KdaDecodeParams params;
  KdaCommitParams commit;  // record mode: the commit of this set's records
  std::vector<int32_t> host_slots, host_accepted;
  std::vector<int32_t> host_commit;  // the commit's slots [batch], then accepted [batch]
};

bool make_set(DeviceArena& arena, const Shape& s, bool channel_major_conv, uint64_t seed,
              cudaStream_t stream, KdaSet* set) {
  const SetSizes z = sizes_of(s);
  KdaDecodeParams& p = set->params;
  auto* x = arena.take<__nv_bfloat16>(z.x);
  auto* gate_input = arena.take<__nv_bfloat16>(z.gate_input);  // f_a or raw_g
  auto* raw_beta = arena.take<__nv_bfloat16>(z.raw_beta);
  auto* output_gate = arena.take<__nv_bfloat16>(z.output_gate);
  auto* conv_weight = arena.take<float>(z.conv_weight);
  auto* f_b = arena.take<__nv_bfloat16>(z.f_b);
  auto* a_log = arena.take<float>(z.a_log);
  auto* dt_bias = arena.take<float>(z.dt_bias);
  auto* norm_weight = arena.take<float>(z.norm_weight);
  auto* conv_state = arena.take<__nv_bfloat16>(z.conv_state);
  void* state = arena.take<char>(z.state_bytes);
  auto* slots = arena.take<int32_t>(z.slots);
  auto* accepted = arena.take<int32_t>(z.accepted);
  auto* output = arena.take<__nv_bfloat16>(z.output);
  if (output == nullptr) return false;
  if (s.records) {  // row of request b = b (record_rows null)
    p.record_correction = arena.take<float>(z.record_correction);
    p.record_key_gate = arena.take<__nv_bfloat16>(z.record_key_gate);
    p.record_slots = s.batch;
    if (p.record_key_gate == nullptr) return false;
  }
  int32_t* commit_table = s.records ? arena.take<int32_t>(z.commit_table) : nullptr;
  if (s.records && commit_table == nullptr) return false;
  fill_uniform_bf16(x, z.x, -2.0f, 2.0f, seed + 1, stream);
  fill_uniform_bf16(gate_input, z.gate_input, -1.0f, 1.0f, seed + 2, stream);
  fill_uniform_bf16(raw_beta, z.raw_beta, -3.0f, 3.0f, seed + 3, stream);
  fill_uniform_bf16(output_gate, z.output_gate, -3.0f, 3.0f, seed + 4, stream);
  fill_uniform_f32(conv_weight, z.conv_weight, -0.5f, 0.5f, seed + 5, stream);
  if (!s.raw_gate) fill_uniform_bf16(f_b, z.f_b, -0.1f, 0.1f, seed + 6, stream);
  fill_uniform_f32(a_log, z.a_log, 0.0f, 2.5f, seed + 7, stream);
  fill_uniform_f32(dt_bias, z.dt_bias, -1.0f, 1.0f, seed + 8, stream);
  fill_uniform_f32(norm_weight, z.norm_weight, 0.5f, 1.5f, seed + 9, stream);
  fill_uniform_bf16(conv_state, z.conv_state, -2.0f, 2.0f, seed + 10, stream);
  if (s.state_dtype == DType::kBf16) {
    fill_uniform_bf16(state, z.state, -0.3f, 0.3f, seed + 11, stream);
  } else {
    fill_uniform_f32(static_cast<float*>(state), z.state, -0.3f, 0.3f, seed + 11, stream);
  }
  std::mt19937_64 rng(seed + 12);
  make_slots(s, rng, &set->host_slots, &set->host_accepted);
  cudaMemcpyAsync(slots, set->host_slots.data(), z.slots * 4, cudaMemcpyHostToDevice, stream);
  cudaMemcpyAsync(accepted, set->host_accepted.data(), z.accepted * 4, cudaMemcpyHostToDevice, stream);
  if (s.records) {  // request b's checkpoint is its read slot; every token is folded
    set->host_commit.resize(2 * size_t(s.batch));
    for (int b = 0; b < s.batch; ++b) {
      set->host_commit[b] = set->host_slots[size_t(b) * s.q + set->host_accepted[b] - 1];
      set->host_commit[s.batch + b] = s.q;
    }
    cudaMemcpyAsync(commit_table, set->host_commit.data(), z.commit_table * 4, cudaMemcpyHostToDevice, stream);
  }
  // The async copies read the host vectors later: they live in `set`, which outlives
  // the synchronization at the end of set creation.

  p.batch = s.batch;
  p.heads = s.heads;
  p.tokens = s.q;
  p.x = x;
  p.x_stride = 3 * s.dim();
  if (s.raw_gate) {
    p.raw_gate = gate_input;
    p.raw_gate_stride = s.dim();
  } else {
    p.f_a = gate_input;
    p.f_a_stride = kKdaRank;
  }
  p.raw_beta = raw_beta;
  p.raw_beta_stride = s.heads;
  p.output_gate = output_gate;
  p.output_gate_stride = s.dim();
  p.conv_weight = conv_weight;  // [3 dim, 4] FP32
  p.conv_weight_dtype = DType::kFp32;
  p.conv_weight_channel_stride = kKdaConvWidth;
  p.conv_weight_tap_stride = 1;
  p.f_b_weight = s.raw_gate ? nullptr : f_b;
  p.a_log = a_log;
  p.dt_bias = dt_bias;
  p.norm_weight = norm_weight;
  p.conv_state = conv_state;
  p.conv_state_dtype = DType::kBf16;
  p.conv_state_slot_stride = s.taps() * 3 * s.dim();
  if (channel_major_conv) {  // [slot, channel, tap]
    p.conv_state_channel_stride = s.taps();
    p.conv_state_tap_stride = 1;
  } else {  // [slot, tap, channel], vLLM's default
    p.conv_state_channel_stride = 1;
    p.conv_state_tap_stride = 3 * s.dim();
  }
  p.conv_state_slots = s.slots();
  p.state = state;
  p.state_dtype = s.state_dtype;
  p.state_slot_stride = int64_t{s.heads} * kKdaHeadDim * kKdaHeadDim;
  p.state_slots = s.slots();
  p.slots = slots;
  p.slots_stride = s.q;
  p.accepted = s.q > 1 ? accepted : nullptr;
  p.output = output;
  p.output_stride = s.dim();
  if (s.records) {
    KdaCommitParams& c = set->commit;
    c.batch = s.batch;
    c.heads = s.heads;
    c.tokens = s.q;
    c.state = state;
    c.state_dtype = s.state_dtype;
    c.state_slot_stride = p.state_slot_stride;
    c.state_slots = p.state_slots;
    c.slots = commit_table;
    c.accepted = commit_table + s.batch;
    c.record_correction = p.record_correction;
    c.record_key_gate = p.record_key_gate;
    c.record_slots = p.record_slots;
    c.a_log = a_log;
    c.dt_bias = dt_bias;
    c.lower_bound = p.lower_bound;
  }
  return true;
}

std::string schedule_text(const KdaSchedule& k) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "cluster=%d lanes=%d early=%d", k.cluster, k.lanes_per_row, k.early);
  std::string text = buf;
  if (k.evict_first) text += " evict_first";
  return text;
}

}  // namespace

int64_t kda_call_bytes(int heads, int batch, int q, bool raw_gate, DType state_dtype) {
  Shape s;
  s.heads = heads;
  s.batch = batch;
  s.q = q;
  s.raw_gate = raw_gate;
  s.state_dtype = state_dtype;
  return floor_bytes(s);
}

// GCC 12 reports a false -Wrestrict (an overlap of ~2^63 bytes inside basic_string's
// _M_replace) for the std::string operator+ below at -O3.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
std::string kda_schedule_name(const KdaSchedule& k) {
  std::string name = "c" + std::to_string(k.cluster) + "l" + std::to_string(k.lanes_per_row) + "e" +
                     std::to_string(k.early);
  if (k.evict_first) name += "x";
  return name;
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

bool parse_kda_schedule(const std::string& name, KdaSchedule* out) {
  KdaSchedule k;
  size_t i = 0;
  // A decimal number after `letter` at i; false when either is missing.
  auto field = [&](char letter, int* value) {
    if (i >= name.size() || name[i] != letter) return false;
    size_t end = ++i;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end == i || end - i > 3) return false;
    *value = std::stoi(name.substr(i, end - i));
    i = end;
    return true;
  };
  if (!field('c', &k.cluster) || !field('l', &k.lanes_per_row) || !field('e', &k.early)) return false;
  if (i < name.size() && name[i] == 'x') {
    k.evict_first = true;
    ++i;
  }
  if (i != name.size()) return false;
  *out = k;
  return true;
}

namespace {

// Everything one shape's measurements share.
struct Bench {
  Shape shape;
  SetSizes sizes;
  DeviceArena arena;
  std::vector<KdaSet> sets;
  void* workspace = nullptr;
  int64_t workspace_capacity = 0;
  // Exactness: pristine copies of set 0's caches, one copy per path, outputs, and
  // a slot table with padding slots mixed in.
  void* state_init = nullptr;  // FP32 or BF16 (shape.state_dtype)
  __nv_bfloat16* conv_init = nullptr;
  void* state_fused = nullptr;
  void* state_composed = nullptr;
  __nv_bfloat16* conv_fused = nullptr;
  __nv_bfloat16* conv_composed = nullptr;
  __nv_bfloat16* out_fused = nullptr;
  __nv_bfloat16* out_composed = nullptr;
  float* correction_fused = nullptr;  // records (record mode only)
  float* correction_composed = nullptr;
  __nv_bfloat16* key_gate_fused = nullptr;
  __nv_bfloat16* key_gate_composed = nullptr;
  int32_t* exact_slots = nullptr;
  std::vector<int32_t> exact_table;  // host copy of exact_slots
  bool composed_ready = false;  // the composed exactness outputs hold a result
};

// Set 0's parameters pointed at the exactness buffers of `path` (0 fused, 1 composed).
KdaDecodeParams exact_params(const Bench& b, int path) {
  KdaDecodeParams p = b.sets[0].params;
  p.state = path == 0 ? b.state_fused : b.state_composed;
  p.conv_state = path == 0 ? b.conv_fused : b.conv_composed;
  p.output = path == 0 ? b.out_fused : b.out_composed;
  p.slots = b.exact_slots;
  if (b.shape.records) {
    p.record_correction = path == 0 ? b.correction_fused : b.correction_composed;
    p.record_key_gate = path == 0 ? b.key_gate_fused : b.key_gate_composed;
  }
  return p;
}

// Resets one path's exactness buffers: caches from the pristine copies, output poisoned.
void reset_exact(const Bench& b, int path, cudaStream_t s) {
  const KdaDecodeParams p = exact_params(b, path);
  cudaMemcpyAsync(p.state, b.state_init, b.sizes.state_bytes, cudaMemcpyDeviceToDevice, s);
  cudaMemcpyAsync(p.conv_state, b.conv_init, b.sizes.conv_state * 2, cudaMemcpyDeviceToDevice, s);
  cudaMemsetAsync(p.output, path == 0 ? 0xff : 0xfe, b.sizes.output * 2, s);
  if (b.shape.records) {
    cudaMemsetAsync(p.record_correction, path == 0 ? 0xff : 0xfe, b.sizes.record_correction * 4, s);
    cudaMemsetAsync(p.record_key_gate, path == 0 ? 0xff : 0xfe, b.sizes.record_key_gate * 2, s);
  }
}

// Compares the fused exactness buffers with the composed ones.
Exact compare_exact(Context& ctx, const Bench& b, std::string* note) {
  bool cuda_fine = true, same = true;
  same &= same_bytes("output", b.out_fused, b.out_composed, b.sizes.output * 2, 2, note, &cuda_fine);
  same &= same_bytes("state", b.state_fused, b.state_composed, b.sizes.state_bytes,
                     b.shape.state_element_bytes(), note, &cuda_fine);
  same &= same_bytes("conv_state", b.conv_fused, b.conv_composed, b.sizes.conv_state * 2, 2, note,
                     &cuda_fine);
  if (b.shape.records) {
    // Rows of padding requests stay poisoned in both runs, with different bytes:
    // compare only the rows of requests the table names.
    const int64_t row_corr = int64_t{b.shape.heads} * b.shape.q * kKdaHeadDim;
    const int64_t row_kg = 2 * row_corr;
    for (int r = 0; r < b.shape.batch; ++r) {
      if (b.exact_table[static_cast<size_t>(r) * b.shape.q] <= 0 ||
          b.exact_table[static_cast<size_t>(r) * b.shape.q] >= b.shape.slots()) {
        continue;
      }
      same &= same_bytes("record_correction", b.correction_fused + r * row_corr,
                         b.correction_composed + r * row_corr, row_corr * 4, 4, note, &cuda_fine);
      same &= same_bytes("record_key_gate", b.key_gate_fused + r * row_kg,
                         b.key_gate_composed + r * row_kg, row_kg * 2, 2, note, &cuda_fine);
      if (!same || !cuda_fine) break;
    }
  }
  if (!cuda_fine) {
    cuda_ok(ctx, cudaGetLastError(), "exactness download", note);
    return Exact::kUnknown;
  }
  return same ? Exact::kYes : Exact::kNo;
}

// Slots the exactness table never names (slot 0, the padding requests' own slots)
// must come out of the fused run byte-identical: padding reads and writes nothing.
// In record mode every state slot must.
bool unnamed_slots_untouched(const Bench& b, std::string* note, bool* cuda_fine) {
  std::vector<bool> named(b.shape.slots(), false);
  for (int32_t slot : b.exact_table) {
    if (slot > 0 && slot < b.shape.slots()) named[slot] = true;
  }
  struct Cache {
    const char* name;
    const void* after;
    const void* before;
    int64_t slot_bytes;
  };
  const Cache caches[2] = {
      {"state", b.state_fused, b.state_init, b.sizes.state_bytes / b.shape.slots()},
      {"conv_state", b.conv_fused, b.conv_init, b.sizes.conv_state * 2 / b.shape.slots()}};
  bool untouched = true;
  for (const Cache& c : caches) {
    const size_t bytes = static_cast<size_t>(c.slot_bytes * b.shape.slots());
    std::vector<unsigned char> after(bytes), before(bytes);
    if (cudaMemcpy(after.data(), c.after, bytes, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(before.data(), c.before, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
      *cuda_fine = false;
      return false;
    }
    // Record mode writes no state slot at all.
    const bool every_slot = b.shape.records && c.after == b.state_fused;
    for (int64_t slot = 0; slot < b.shape.slots(); ++slot) {
      if (named[slot] && !every_slot) continue;
      const size_t offset = static_cast<size_t>(slot * c.slot_bytes);
      if (std::memcmp(after.data() + offset, before.data() + offset, c.slot_bytes) != 0) {
        *note += (note->empty() ? "" : "; ") + std::string("fused run changed ") + c.name +
                 " of unnamed slot " + std::to_string(slot);
        untouched = false;
        break;
      }
    }
  }
  return untouched;
}

// Allocates and fills a shape's buffer sets and exactness buffers; false (with
// `note`) on failure.
bool prepare(Context& ctx, const Options& options, Bench& b, uint64_t seed, std::string* note) {
  const Shape& s = b.shape;
  b.sizes = sizes_of(s);
  const int64_t per_set = set_bytes(b.sizes);
  const int64_t target = 4 * std::max<int64_t>(ctx.device.l2_bytes, 1 << 20);
  int sets = static_cast<int>(std::clamp<int64_t>((target + per_set - 1) / per_set, 1, kMaxBufferSets));
  KdaDecodeParams probe;
  probe.batch = s.batch;
  probe.heads = s.heads;
  probe.tokens = s.q;
  probe.state_dtype = s.state_dtype;
  const int64_t workspace_bytes = std::max<int64_t>(composed::workspace_bytes(probe), 0);
  auto r = DeviceArena::round_up;
  const int64_t fixed = 3 * r(b.sizes.state_bytes) + 3 * r(b.sizes.conv_state * 2) +
                        2 * r(b.sizes.output * 2) + r(b.sizes.slots * 4) + r(workspace_bytes) +
                        2 * r(b.sizes.record_correction * 4) + 2 * r(b.sizes.record_key_gate * 2);
  std::string error;
  while (!b.arena.allocate(fixed + sets * per_set, &error)) {
    if (sets == 1) {
      *note = error;
      ++ctx.failures;
      return false;
    }
    sets = std::max(1, sets / 2);
  }
  b.workspace = workspace_bytes > 0 ? b.arena.take<char>(workspace_bytes) : nullptr;
  b.workspace_capacity = workspace_bytes;
  b.state_init = b.arena.take<char>(b.sizes.state_bytes);
  b.state_fused = b.arena.take<char>(b.sizes.state_bytes);
  b.state_composed = b.arena.take<char>(b.sizes.state_bytes);
  b.conv_init = b.arena.take<__nv_bfloat16>(b.sizes.conv_state);
  b.conv_fused = b.arena.take<__nv_bfloat16>(b.sizes.conv_state);
  b.conv_composed = b.arena.take<__nv_bfloat16>(b.sizes.conv_state);
  b.out_fused = b.arena.take<__nv_bfloat16>(b.sizes.output);
  b.out_composed = b.arena.take<__nv_bfloat16>(b.sizes.output);
  b.exact_slots = b.arena.take<int32_t>(b.sizes.slots);
  if (s.records) {
    b.correction_fused = b.arena.take<float>(b.sizes.record_correction);
    b.correction_composed = b.arena.take<float>(b.sizes.record_correction);
    b.key_gate_fused = b.arena.take<__nv_bfloat16>(b.sizes.record_key_gate);
    b.key_gate_composed = b.arena.take<__nv_bfloat16>(b.sizes.record_key_gate);
  }
  b.sets.resize(sets);
  for (int i = 0; i < sets; ++i) {
    if (!make_set(b.arena, s, options.conv_state_channel_major, seed + 1000 * static_cast<uint64_t>(i),
                  ctx.stream, &b.sets[i])) {
      *note = "bench bug: buffer set does not fit its arena";
      ++ctx.failures;
      return false;
    }
  }
  if (s.hot_activations) {
    for (auto& set : b.sets) {
      set.params.x = b.sets[0].params.x;
      set.params.f_a = b.sets[0].params.f_a;
      set.params.raw_gate = b.sets[0].params.raw_gate;
      set.params.raw_beta = b.sets[0].params.raw_beta;
      set.params.output_gate = b.sets[0].params.output_gate;
    }
  }
  // Padding mixed into the exactness run only: slot 0, a negative slot and one past
  // the last slot, each for a whole request (its read slot is then padding).
  std::vector<int32_t> exact = b.sets[0].host_slots;
  if (s.batch >= 4) {
    const int pads[3] = {0, -1, static_cast<int32_t>(s.slots())};
    const int requests[3] = {1, s.batch / 2, s.batch - 1};
    for (int k = 0; k < 3; ++k) {
      for (int t = 0; t < s.q; ++t) exact[requests[k] * s.q + t] = pads[k];
    }
  }
  b.exact_table = exact;
  const KdaDecodeParams& p0 = b.sets[0].params;
  cudaMemcpyAsync(b.exact_slots, exact.data(), exact.size() * 4, cudaMemcpyHostToDevice, ctx.stream);
  cudaMemcpyAsync(b.state_init, p0.state, b.sizes.state_bytes, cudaMemcpyDeviceToDevice, ctx.stream);
  cudaMemcpyAsync(b.conv_init, p0.conv_state, b.sizes.conv_state * 2, cudaMemcpyDeviceToDevice, ctx.stream);
  return cuda_ok(ctx, cudaStreamSynchronize(ctx.stream), "input generation", note);
}

const char* state_dtype_name(const Shape& s) { return s.state_dtype == DType::kBf16 ? "bf16" : "fp32"; }

JsonObject shape_fields(const Shape& s, bool sweep, const char* op = "kda_decode") {
  JsonObject o;
  o.add("op", op).add("heads", s.heads).add("batch", s.batch).add("q", s.q);
  o.add("state_dtype", state_dtype_name(s));
  if (s.records) o.add("records", true);
  if (s.raw_gate) o.add("gate", "raw_g");
  if (s.slots_in_order) o.add("slots", "in-order");
  if (s.hot_activations) o.add("activations", "hot");
  if (sweep) o.add("sweep", true);
  return o;
}

std::string shape_text(const Shape& s) {
  char buf[80];
  std::snprintf(buf, sizeof buf, "H=%d B=%d q=%d %s%s%s%s%s", s.heads, s.batch, s.q, state_dtype_name(s),
                s.records ? " records" : "",
                s.hot_activations ? " hot" : "", s.raw_gate ? " raw_g" : "", s.slots_in_order ? " in-order" : "");
  return buf;
}

// Measures the fused path with `schedule` (the default when all zero/-1): exactness
// against the composed result, then graph timing. Fills row.fused_us/exact/note.
void measure_fused(Context& ctx, const Options& options, Bench& b, const KdaSchedule& schedule,
                   Row* row) {
  const cudaStream_t s = ctx.stream;
  LaunchOptions launch_options;
  launch_options.pdl = options.pdl;
  launch_options.device = &ctx.device;
  for (auto& set : b.sets) set.params.schedule = schedule;

  KdaDecodePlan plan;
  const Result planned = fusedstep::plan(b.sets[0].params, ctx.device, &plan);
  if (!planned.ok()) {
    row->note = not_run("plan", planned);
    return;
  }
  row->schedule = schedule_text(plan.schedule);
  row->waves = plan.waves;

  reset_exact(b, 0, s);
  const Result fused_run = launch(exact_params(b, 0), launch_options, s);
  if (!fused_run.ok()) {
    row->note = not_run("fused launch", fused_run);
    return;
  }
  if (!cuda_ok(ctx, cudaStreamSynchronize(s), "fused exactness run", &row->note)) return;
  if (b.composed_ready) row->exact = compare_exact(ctx, b, &row->note);
  bool cuda_fine = true;
  if (!unnamed_slots_untouched(b, &row->note, &cuda_fine)) {
    if (cuda_fine) {
      ++ctx.failures;
    } else {
      cuda_ok(ctx, cudaGetLastError(), "untouched-slot download", &row->note);
    }
  }
  if (ctx.cuda_broken) return;

  const Timing fused = time_graph(s, static_cast<int>(b.sets.size()), options.iters, [&](int i) {
    return launch(b.sets[i].params, launch_options, s);
  });
  if (fused.ok) {
    row->fused_us = fused.us_per_launch;
  } else {
    row->note += (row->note.empty() ? "" : "; ") + std::string("fused timing: ") + fused.error;
    // It ran once already, so a timing failure is a real one (counted once).
    if (cuda_ok(ctx, cudaGetLastError(), "fused timing", nullptr)) ++ctx.failures;
  }
}

// A sweep over schedules of one shape: each schedule check() accepts is timed as a sweep
// row on the bench's buffers; the fastest is kept and printed.
struct Sweep {
  Sweep(Context& c, const Options& o, Bench& bench, const Row& r, const Shape& s)
      : ctx(c), options(o), b(bench), row(r), shape(s) {}
  Context& ctx;
  const Options& options;
  Bench& b;
  const Row& row;  // the default schedule's row
  const Shape& shape;
  double best_us = INFINITY;
  std::string best;

  // `listed`: the user named this schedule, so say so when plan() rejects it.
  void run(const KdaSchedule& k, bool listed = false) {
    b.sets[0].params.schedule = k;
    KdaDecodePlan planned;
    const Result valid = plan(b.sets[0].params, ctx.device, &planned);
    if (!valid.ok()) {  // not a valid or built schedule here
      if (listed)
        std::printf("  %s for %s: rejected by plan(): %s\n", kda_schedule_name(k).c_str(), row.shape.c_str(),
                    valid.detail());
      return;
    }
    Row sweep_row;
    sweep_row.op = "kda_decode";
    sweep_row.shape = row.shape;
    sweep_row.bytes = row.bytes;
    sweep_row.buffer_sets = row.buffer_sets;
    sweep_row.composed_us = row.composed_us;
    measure_fused(ctx, options, b, k, &sweep_row);
    emit_row(ctx, options, sweep_row, shape_fields(shape, true));
    if (sweep_row.fused_us < best_us) {
      best_us = sweep_row.fused_us;
      best = sweep_row.schedule;
    }
  }
  void print(const char* what) const {
    if (!std::isfinite(best_us)) return;
    std::printf("  best%s for %s: %s  %.2f us (default %.2f us)\n", what, row.shape.c_str(), best.c_str(), best_us,
                row.fused_us);
  }
};

// Record mode: the RecoverSSM commit of every set's records (written by the verify's
// timing replays) into its checkpoint states, every token folded, timed as a graph over
// the sets like the verify. There is no composed commit to compare with (exact "-").
void measure_commit(Context& ctx, const Options& options, Bench& b, const Row& verify_row) {
  Row row;
  row.op = "kda_commit";
  row.shape = verify_row.shape;
  row.schedule = std::string(1, '-');  // not = "-": GCC 12 reports a false -Wrestrict for that
  row.bytes = commit_floor_bytes(b.shape);
  row.buffer_sets = verify_row.buffer_sets;
  const Result valid = check(b.sets[0].commit, ctx.device);
  if (!valid.ok()) {
    row.note = not_run("commit check", valid);
  } else {
    LaunchOptions launch_options;
    launch_options.pdl = options.pdl;
    launch_options.device = &ctx.device;
    const Timing commit = time_graph(ctx.stream, static_cast<int>(b.sets.size()), options.iters, [&](int i) {
      return launch(b.sets[i].commit, launch_options, ctx.stream);
    });
    if (commit.ok) {
      row.fused_us = commit.us_per_launch;
    } else {
      row.note = std::string("commit timing: ") + commit.error;
      if (cuda_ok(ctx, cudaGetLastError(), "commit timing", nullptr)) ++ctx.failures;
    }
  }
  emit_row(ctx, options, row, shape_fields(b.shape, false, "kda_commit"));
}

void run_shape(Context& ctx, const Options& options, const Shape& shape, uint64_t seed) {
  Bench b;
  b.shape = shape;
  Row row;
  row.op = "kda_decode";
  row.shape = shape_text(shape);
  row.bytes = floor_bytes(shape);
  if (!prepare(ctx, options, b, seed, &row.note)) {
    emit_row(ctx, options, row, shape_fields(shape, false));
    return;
  }
  row.buffer_sets = static_cast<int>(b.sets.size());

  // The composed path first: its exactness outputs are what every fused schedule
  // is compared with.
  const cudaStream_t s = ctx.stream;
  reset_exact(b, 1, s);
  const int64_t workspace_needed = composed::workspace_bytes(b.sets[0].params);
  const Result composed_run =
      workspace_needed <= b.workspace_capacity
          ? composed::launch(exact_params(b, 1), b.workspace, s)
          : Result::error(Status::kInvalidValue, "bench: composed workspace_bytes = %lld exceeds the %lld sized from the shape",
                          static_cast<long long>(workspace_needed), static_cast<long long>(b.workspace_capacity));
  std::string composed_note;
  if (!composed_run.ok()) {
    composed_note = not_run("composed launch", composed_run);
  } else if (cuda_ok(ctx, cudaStreamSynchronize(s), "composed exactness run", &composed_note)) {
    b.composed_ready = true;
  }
  if (ctx.cuda_broken) {
    row.note = composed_note;
    emit_row(ctx, options, row, shape_fields(shape, false));
    return;
  }

  KdaSchedule default_schedule;
  measure_fused(ctx, options, b, default_schedule, &row);
  if (!composed_note.empty()) row.note += (row.note.empty() ? "" : "; ") + composed_note;
  if (b.composed_ready && !ctx.cuda_broken) {
    const Timing comp = time_graph(s, static_cast<int>(b.sets.size()), options.iters, [&](int i) {
      return composed::launch(b.sets[i].params, b.workspace, s);
    });
    if (comp.ok) {
      row.composed_us = comp.us_per_launch;
    } else {
      row.note += (row.note.empty() ? "" : "; ") + std::string("composed timing: ") + comp.error;
      if (cuda_ok(ctx, cudaGetLastError(), "composed timing", nullptr)) ++ctx.failures;
    }
  }
  JsonObject fields = shape_fields(shape, false);
  if (shape.q == 1 && std::isfinite(row.fused_us) && !ctx.cuda_broken) {  // vLLM's kernel, where built
    std::vector<KdaDecodeParams> set_params;
    for (const KdaSet& set : b.sets) set_params.push_back(set.params);
    add_kda_peer_fields(ctx, options, set_params, row.shape, &fields);
  }
  emit_row(ctx, options, row, fields);
  if (!std::isfinite(row.fused_us)) return;
  if (options.kda_commit && shape.records && !ctx.cuda_broken) measure_commit(ctx, options, b, row);
  if (!options.kda_schedules.empty()) {
    Sweep listed(ctx, options, b, row, shape);
    for (const KdaSchedule& k : options.kda_schedules) {
      if (ctx.cuda_broken) return;
      listed.run(k, true);
    }
    listed.print(" (listed)");
  }
  if (!options.sweep_schedules) return;

  // Sweep: every schedule plan() accepts (evict-first too, where it applies); the
  // fastest is marked.
  Sweep sweep(ctx, options, b, row, shape);
  for (int cluster : {1, 2, 4, 8, 16}) {
    for (int lanes : {8, 16}) {
      for (int knob = 0; knob <= 5; ++knob) {  // early 0-3, early 2 and 3 with evict-first
        if (ctx.cuda_broken) return;
        KdaSchedule k;
        k.cluster = cluster;
        k.lanes_per_row = lanes;
        k.early = knob <= 3 ? knob : knob - 2;
        k.evict_first = knob > 3;
        sweep.run(k);
      }
    }
  }
  sweep.print("");
}

}  // namespace

void run_kda(Context& ctx, const Options& options) {
  std::vector<Shape> shapes;
  const bool explicit_shapes = !options.heads.empty() || !options.batch.empty() || !options.q.empty();
  if (explicit_shapes) {
    const std::vector<int64_t> heads = options.heads.empty() ? std::vector<int64_t>{12} : options.heads;
    const std::vector<int64_t> qs = options.q.empty() ? std::vector<int64_t>{1} : options.q;
    const std::vector<int64_t> batches =
        options.batch.empty() ? std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128, 256} : options.batch;
    for (int64_t q : qs)
      for (int64_t h : heads)
        for (int64_t bt : batches) shapes.push_back({static_cast<int>(h), static_cast<int>(bt), static_cast<int>(q)});
  } else if (options.quick) {
    for (int bt : {1, 16, 128}) shapes.push_back({12, bt, 1});
    shapes.push_back({12, 16, 4});
  } else {
    for (int h : {12, 24})
      for (int bt : {1, 2, 4, 8, 16, 32, 64, 128, 256}) shapes.push_back({h, bt, 1});
    for (int q : {2, 4, 8})
      for (int bt : {1, 4, 16, 64, 128}) shapes.push_back({12, bt, q});
  }
  print_table_header("kda_decode (Kimi K3 KDA decode / verify; FP32 or BF16 state as the shape says, BF16 conv state " +
                     std::string(options.conv_state_channel_major ? "[slot, channel, tap]"
                                                                  : "[slot, tap, channel]") +
                     (options.kda_raw_gate ? ", gate from the caller's raw_g)" : ", gate from f_a)"));
  for (Shape& shape : shapes) {
    shape.records = options.records && shape.q > 1;
    shape.hot_activations = options.kda_hot_activations;
    shape.raw_gate = options.kda_raw_gate;
    shape.slots_in_order = options.kda_slots_in_order;
  }
  // Each shape with each state dtype of --state-dtype, in its order; by default FP32 and
  // BF16, but the default full run's 24-head rows FP32 only (a run within ~110 s).
  std::vector<Shape> by_dtype;
  for (const Shape& shape : shapes) {
    std::vector<DType> dtypes = options.kda_state_dtypes;
    if (dtypes.empty()) {
      dtypes = {DType::kFp32};
      if (explicit_shapes || shape.heads == 12) dtypes.push_back(DType::kBf16);
    }
    for (DType d : dtypes) {
      by_dtype.push_back(shape);
      by_dtype.back().state_dtype = d;
    }
  }
  shapes = std::move(by_dtype);
  if (options.kda_commit && std::none_of(shapes.begin(), shapes.end(), [](const Shape& s) { return s.records; })) {
    std::printf("--kda-commit: no q > 1 shape to commit (e.g. --q 8)\n");
  }
  uint64_t seed = ctx.seed * 104729 + 29;
  const int measured_before = ctx.rows_measured, not_run_before = ctx.rows_not_run;
  for (const Shape& shape : shapes) {
    if (ctx.cuda_broken) break;
    run_shape(ctx, options, shape, seed);
    seed += 1000003;
  }
  if (ctx.cuda_broken) std::printf("(a CUDA error poisoned the context: remaining rows skipped)\n");
  print_op_status(ctx, "kda_decode", measured_before, not_run_before);
}

}  // namespace fusedstep::bench
