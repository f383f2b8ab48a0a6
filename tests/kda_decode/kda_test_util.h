// SPDX-License-Identifier: Apache-2.0
// Test data for the KDA decode / verify step and the RecoverSSM commit: realistic
// random host inputs in every supported layout (strided activation rows, both conv
// weight and conv state layouts, BF16/FP32 conv state, padding requests of every
// kind, skipped write slots, token counts, direct and deferred records), their device
// copies, and the matching KdaDecodeParams, KdaCommitParams and reference::KdaProblem.
//
// Typical use (one case):
//   KdaTestData data(KdaCaseConfig{.batch = 6, .heads = 3, .tokens = 4}, fresh_seed());
//   data.upload();                                   // inputs, caches; poisons outputs
//   FS_EXPECT_OK(fusedstep::launch(data.params(), {}, stream));
//   auto out = data.download_output();
// The host vectors are public: a test may change them before upload().
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "common/portable/float_bits.h"
#include "fusedstep/kda_decode.h"
#include "fusedstep_reference/kda_decode.h"

namespace fusedstep::testing {

// What varies between KDA test cases. Defaults: a q = 1 step with padding requests.
struct KdaCaseConfig {
  int batch = 5;
  int heads = 3;
  int tokens = 1;
  KdaGateMode gate_mode = KdaGateMode::kOneChain;
  bool raw_gate = false;                   // caller's raw_g instead of f_a + F_B
  bool conv_bias = false;
  DType conv_weight_dtype = DType::kFp32;
  bool conv_weight_channel_major = true;   // [3 dim, 4] (false: [4, 3 dim], tap-major)
  bool conv_weight_k3_layout = false;      // [3, 4, dim] (K3's decode weight; overrides the above)
  DType conv_state_dtype = DType::kBf16;
  DType state_dtype = DType::kFp32;        // BF16: the generated state values are BF16 values
  DType norm_weight_dtype = DType::kFp32;  // the norm weight's device dtype (its values are BF16 either way)
  bool conv_state_tap_major = false;       // [slot, tap, channel] (vLLM SD) vs [slot, channel, tap]
  int row_padding = 8;                     // extra elements per activation row (multiple of 8)
  int extra_slots = 3;                     // state / conv slots no request uses (canaries)
  bool padding_requests = true;            // some requests are padding, of every kind
  bool skip_some_writes = true;            // q > 1: some write slots slots[b, t] are <= 0 or >= slots
  bool token_counts = false;               // q > 1: token_counts[b] random in [1, q]
  bool records = false;                    // RecoverSSM records (q > 1)
  bool deferred_records = false;           // record_rows given (a permutation, one out of range)
  int fixed_accepted = 0;                  // q > 1: 0 = accepted random in [1, q]; else this value
  float lower_bound = -5.0f;
  KdaSchedule schedule{};
};

class KdaTestData {
 public:
  KdaTestData(const KdaCaseConfig& config, uint64_t seed) : config_(config), rng_(seed) { generate(); }
  KdaTestData(const KdaTestData&) = delete;
  KdaTestData& operator=(const KdaTestData&) = delete;

  const KdaCaseConfig& config() const { return config_; }
  int dim() const { return config_.heads * kKdaHeadDim; }
  int64_t rows() const { return int64_t(config_.batch) * config_.tokens; }
  int tokens() const { return config_.tokens; }

  // ---- host tensors (BF16 as 16-bit patterns), in the device layouts
  std::vector<uint16_t> x, f_a, raw_gate, raw_beta, output_gate, f_b_weight;
  std::vector<uint8_t> conv_weight;        // FP32 or BF16 per config, [channel, tap] by strides
  std::vector<float> conv_bias, a_log, dt_bias, norm_weight;
  std::vector<uint8_t> conv_state;         // FP32 or BF16 per config
  std::vector<float> state;                // values (BF16 values for a BF16 state)
  std::vector<int32_t> slots, accepted, token_counts, record_rows;
  // The RecoverSSM commit after this verify: checkpoint slot (slots[b, A - 1], or 0 for a
  // padding request) and the tokens accepted by sampling (in [0, n], sometimes out of range).
  std::vector<int32_t> commit_slots, commit_accepted;

  int64_t x_stride = 0, f_a_stride = 0, raw_gate_stride = 0, raw_beta_stride = 0;
  int64_t output_gate_stride = 0, output_stride = 0;
  int64_t conv_weight_channel_stride = 0, conv_weight_tap_stride = 0, conv_weight_section_stride = 0;
  int64_t conv_state_slot_stride = 0, conv_state_channel_stride = 0, conv_state_tap_stride = 0;
  int64_t conv_state_slots = 0, state_slot_stride = 0, state_slots = 0, slots_stride = 0;
  int64_t record_slots = 0;

  // ---- per-request facts the generator decided (for tests that reason about them)
  std::vector<bool> request_padding;       // the whole request is padding

  // ---- device copies
  DeviceBuffer<uint16_t> d_x, d_f_a, d_raw_gate, d_raw_beta, d_output_gate, d_f_b_weight, d_norm_weight_bf16;
  DeviceBuffer<uint8_t> d_conv_weight, d_conv_state;
  DeviceBuffer<float> d_conv_bias, d_a_log, d_dt_bias, d_norm_weight;
  DeviceBuffer<uint8_t> d_state;            // FP32 or BF16 per config
  DeviceBuffer<int32_t> d_slots, d_accepted, d_token_counts, d_record_rows;
  DeviceBuffer<int32_t> d_commit_slots, d_commit_accepted;
  DeviceBuffer<uint16_t> d_output, d_record_key_gate;
  DeviceBuffer<float> d_record_correction;

  // Copy every host tensor to the device (again); poison the output and the records
  // with 0xFF bytes (NaN in BF16 and FP32) so that unwritten elements stand out.
  void upload() {
    put(d_x, x); put(d_f_a, f_a); put(d_raw_gate, raw_gate); put(d_raw_beta, raw_beta);
    put(d_output_gate, output_gate); put(d_f_b_weight, f_b_weight);
    put(d_conv_weight, conv_weight); put(d_conv_state, conv_state);
    put(d_conv_bias, conv_bias); put(d_a_log, a_log); put(d_dt_bias, dt_bias);
    put(d_norm_weight, norm_weight); put(d_state, state_bytes(state));
    std::vector<uint16_t> norm_bf16(norm_weight.size());
    for (size_t i = 0; i < norm_weight.size(); ++i) norm_bf16[i] = bits::bf16_rne(norm_weight[i]);  // exact
    put(d_norm_weight_bf16, norm_bf16);
    put(d_slots, slots); put(d_accepted, accepted); put(d_token_counts, token_counts);
    put(d_record_rows, record_rows);
    put(d_commit_slots, commit_slots); put(d_commit_accepted, commit_accepted);
    d_output.resize(size_t(rows()) * output_stride);
    d_output.fill_bytes(0xff);
    if (config_.records) {
      const size_t record = size_t(record_slots) * config_.heads * config_.tokens;
      d_record_correction.resize(record * kKdaHeadDim);
      d_record_key_gate.resize(record * 2 * kKdaHeadDim);
      d_record_correction.fill_bytes(0xff);
      d_record_key_gate.fill_bytes(0xff);
    }
  }

  // Device parameters of the verify / decode step (schedule from the config).
  KdaDecodeParams params() const {
    KdaDecodeParams p;
    p.batch = config_.batch;
    p.heads = config_.heads;
    p.tokens = config_.tokens;
    p.x = bf16_ptr(d_x); p.x_stride = x_stride;
    if (config_.raw_gate) {
      p.raw_gate = bf16_ptr(d_raw_gate); p.raw_gate_stride = raw_gate_stride;
    } else {
      p.f_a = bf16_ptr(d_f_a); p.f_a_stride = f_a_stride;
      p.f_b_weight = bf16_ptr(d_f_b_weight);
    }
    p.raw_beta = bf16_ptr(d_raw_beta); p.raw_beta_stride = raw_beta_stride;
    p.output_gate = bf16_ptr(d_output_gate); p.output_gate_stride = output_gate_stride;
    p.conv_weight = d_conv_weight.get();
    p.conv_weight_dtype = config_.conv_weight_dtype;
    p.conv_weight_channel_stride = conv_weight_channel_stride;
    p.conv_weight_tap_stride = conv_weight_tap_stride;
    p.conv_weight_section_stride = conv_weight_section_stride;
    p.conv_bias = config_.conv_bias ? d_conv_bias.get() : nullptr;
    p.a_log = d_a_log.get();
    p.dt_bias = d_dt_bias.get();
    p.norm_weight_dtype = config_.norm_weight_dtype;
    if (config_.norm_weight_dtype == DType::kBf16) {
      p.norm_weight = d_norm_weight_bf16.get();
    } else {
      p.norm_weight = d_norm_weight.get();
    }
    p.conv_state = d_conv_state.get();
    p.conv_state_dtype = config_.conv_state_dtype;
    p.conv_state_slot_stride = conv_state_slot_stride;
    p.conv_state_channel_stride = conv_state_channel_stride;
    p.conv_state_tap_stride = conv_state_tap_stride;
    p.conv_state_slots = conv_state_slots;
    p.state = d_state.get();
    p.state_dtype = config_.state_dtype;
    p.state_slot_stride = state_slot_stride;
    p.state_slots = state_slots;
    p.slots = d_slots.get();
    if (config_.tokens > 1) {
      p.slots_stride = slots_stride;
      p.accepted = d_accepted.get();
      p.token_counts = config_.token_counts ? d_token_counts.get() : nullptr;
    }
    p.output = reinterpret_cast<__nv_bfloat16*>(d_output.get());
    p.output_stride = output_stride;
    if (config_.records) {
      p.record_correction = d_record_correction.get();
      p.record_key_gate = reinterpret_cast<__nv_bfloat16*>(d_record_key_gate.get());
      p.record_rows = config_.deferred_records ? d_record_rows.get() : nullptr;
      p.record_slots = record_slots;
    }
    p.lower_bound = config_.lower_bound;
    p.gate_mode = config_.gate_mode;
    p.schedule = config_.schedule;
    return p;
  }

  // Device parameters of the RecoverSSM commit of this verify's records.
  KdaCommitParams commit_params() const {
    KdaCommitParams p;
    p.batch = config_.batch;
    p.heads = config_.heads;
    p.tokens = config_.tokens;
    p.state = d_state.get();
    p.state_dtype = config_.state_dtype;
    p.state_slot_stride = state_slot_stride;
    p.state_slots = state_slots;
    p.slots = d_commit_slots.get();
    p.accepted = d_commit_accepted.get();
    p.record_correction = d_record_correction.get();
    p.record_key_gate = reinterpret_cast<const __nv_bfloat16*>(d_record_key_gate.get());
    p.record_rows = config_.deferred_records ? d_record_rows.get() : nullptr;
    p.record_slots = record_slots;
    p.a_log = d_a_log.get();
    p.dt_bias = d_dt_bias.get();
    p.lower_bound = config_.lower_bound;
    return p;
  }

  // The same problem for the CPU reference (host pointers into this object).
  reference::KdaProblem problem() const {
    reference::KdaProblem p;
    p.batch = config_.batch; p.heads = config_.heads; p.tokens = config_.tokens;
    p.x = x.data(); p.x_stride = x_stride;
    if (config_.raw_gate) {
      p.raw_gate = raw_gate.data(); p.raw_gate_stride = raw_gate_stride;
    } else {
      p.f_a = f_a.data(); p.f_a_stride = f_a_stride;
      p.f_b_weight = f_b_weight.data();
    }
    p.raw_beta = raw_beta.data(); p.raw_beta_stride = raw_beta_stride;
    p.output_gate = output_gate.data(); p.output_gate_stride = output_gate_stride;
    p.conv_weight = conv_weight.data();
    p.conv_weight_bf16 = config_.conv_weight_dtype == DType::kBf16;
    p.conv_weight_channel_stride = conv_weight_channel_stride;
    p.conv_weight_tap_stride = conv_weight_tap_stride;
    if (conv_weight_section_stride != 0) {  // the reference addresses c * channel + j * tap:
      const bool bf16 = config_.conv_weight_dtype == DType::kBf16;  // hand it a [3 dim, 4] copy
      const int64_t channels = 3 * int64_t(dim()), size = bf16 ? 2 : 4;
      reference_conv_weight_.assign(conv_weight.size(), 0);
      for (int64_t c = 0; c < channels; ++c) {
        for (int j = 0; j < kKdaConvWidth; ++j) {
          const int64_t from = (c / dim()) * conv_weight_section_stride + (c % dim()) * conv_weight_channel_stride +
                               j * conv_weight_tap_stride;
          std::memcpy(reference_conv_weight_.data() + (c * kKdaConvWidth + j) * size,
                      conv_weight.data() + from * size, size_t(size));
        }
      }
      p.conv_weight = reference_conv_weight_.data();
      p.conv_weight_channel_stride = kKdaConvWidth;
      p.conv_weight_tap_stride = 1;
    }
    p.conv_bias = config_.conv_bias ? conv_bias.data() : nullptr;
    p.a_log = a_log.data(); p.dt_bias = dt_bias.data(); p.norm_weight = norm_weight.data();
    p.conv_state = conv_state.data();
    p.conv_state_bf16 = config_.conv_state_dtype == DType::kBf16;
    p.conv_state_slot_stride = conv_state_slot_stride;
    p.conv_state_channel_stride = conv_state_channel_stride;
    p.conv_state_tap_stride = conv_state_tap_stride;
    p.conv_state_slots = conv_state_slots;
    p.state = reference_state(); p.state_bf16 = state_bf16();
    p.state_slot_stride = state_slot_stride; p.state_slots = state_slots;
    p.slots = slots.data();
    if (config_.tokens > 1) {
      p.slots_stride = slots_stride;
      p.accepted = accepted.data();
      p.token_counts = config_.token_counts ? token_counts.data() : nullptr;
    }
    p.records = config_.records;
    p.record_rows = config_.records && config_.deferred_records ? record_rows.data() : nullptr;
    p.record_slots = config_.records ? record_slots : 0;
    p.lower_bound = config_.lower_bound;
    p.gate_mode = static_cast<reference::KdaGateMode>(static_cast<int>(config_.gate_mode));
    return p;
  }

  // The RecoverSSM commit of `verify`'s records for the CPU reference, with this
  // case's commit slots and accepted counts (the same as commit_params()).
  reference::KdaCommitProblem commit_problem(const reference::KdaResult& verify) const {
    reference::KdaCommitProblem p;
    p.batch = config_.batch; p.heads = config_.heads; p.tokens = config_.tokens;
    p.state = reference_state(); p.state_bf16 = state_bf16();
    p.state_slot_stride = state_slot_stride; p.state_slots = state_slots;
    p.slots = commit_slots.data(); p.slots_stride = 1;
    p.accepted = commit_accepted.data();
    p.record_correction = verify.record_correction.data();
    p.record_key_gate = verify.record_key_gate.data();
    p.record_rows = config_.deferred_records ? record_rows.data() : nullptr;
    p.record_slots = record_slots;
    p.a_log = a_log.data(); p.dt_bias = dt_bias.data();
    p.lower_bound = config_.lower_bound;
    return p;
  }

  // Host copy of the verify semantics (docs/numerics.md): is request b active, and
  // its accepted count A, token count n, read slot, conv slot and record row.
  struct RequestFacts {
    bool active = false;
    int accepted = 1, count = 1;
    int32_t read_slot = 0, conv_slot = 0;
    int64_t record_row = -1;
  };
  RequestFacts request(int b, bool records) const {
    RequestFacts r;
    const int q = config_.tokens;
    if (q == 1) {
      r.read_slot = r.conv_slot = slots[b];
      r.active = slots[b] > 0 && slots[b] < state_slots && slots[b] < conv_state_slots;
      return r;
    }
    r.accepted = accepted[b];
    r.count = config_.token_counts ? token_counts[b] : q;
    if (r.accepted < 1 || r.accepted > q || r.count < 1 || r.count > q) return r;
    r.read_slot = slot(b, r.accepted - 1);
    r.conv_slot = slot(b, 0);
    if (r.read_slot <= 0 || r.read_slot >= state_slots) return r;
    if (r.conv_slot <= 0 || r.conv_slot >= conv_state_slots) return r;
    if (records) {
      r.record_row = config_.deferred_records ? record_rows[b] : b;
      if (r.record_row < 0 || r.record_row >= record_slots) return r;
    }
    r.active = true;
    return r;
  }
  // Which state slots the step writes: none with records; else q = 1: an active
  // request's slot; q > 1: slots[b, t] in (0, state_slots) for t < n.
  std::vector<bool> written_state_slots(bool records) const {
    std::vector<bool> written(size_t(state_slots), false);
    if (records) return written;
    for (int b = 0; b < config_.batch; ++b) {
      const RequestFacts r = request(b, false);
      if (!r.active) continue;
      for (int t = 0; t < r.count; ++t) {
        const int32_t s = config_.tokens == 1 ? r.read_slot : slot(b, t);
        if (s > 0 && s < state_slots) written[size_t(s)] = true;
      }
    }
    return written;
  }

  // ---- downloads
  std::vector<uint16_t> download_output() const { return d_output.download(); }
  // The state buffer's values (a BF16 state converted exactly).
  std::vector<float> download_state() const { return state_values(d_state.download()); }
  bool state_bf16() const { return config_.state_dtype == DType::kBf16; }
  int64_t state_element_bytes() const { return state_bf16() ? 2 : 4; }
  // A state buffer's bytes in this case's dtype, and back to values.
  std::vector<uint8_t> state_bytes(const std::vector<float>& values) const {
    std::vector<uint8_t> out(values.size() * size_t(state_element_bytes()));
    for (size_t i = 0; i < values.size(); ++i) {
      if (state_bf16()) {
        const uint16_t b = bits::bf16_rne(values[i]);
        std::memcpy(out.data() + 2 * i, &b, 2);
      } else {
        std::memcpy(out.data() + 4 * i, &values[i], 4);
      }
    }
    return out;
  }
  std::vector<float> state_values(const std::vector<uint8_t>& bytes) const {
    std::vector<float> out(bytes.size() / size_t(state_element_bytes()));
    for (size_t i = 0; i < out.size(); ++i) {
      if (state_bf16()) {
        uint16_t b;
        std::memcpy(&b, bytes.data() + 2 * i, 2);
        out[i] = bits::bf16_to_f32(b);
      } else {
        std::memcpy(&out[i], bytes.data() + 4 * i, 4);
      }
    }
    return out;
  }
  std::vector<uint8_t> download_conv_state() const { return d_conv_state.download(); }
  std::vector<float> download_record_correction() const { return d_record_correction.download(); }
  std::vector<uint16_t> download_record_key_gate() const { return d_record_key_gate.download(); }

  // Conv-state element `index` (elements, not bytes) of a buffer in this case's dtype.
  double conv_state_value(const std::vector<uint8_t>& buffer, int64_t index) const {
    if (config_.conv_state_dtype == DType::kBf16) {
      uint16_t b;
      std::memcpy(&b, buffer.data() + 2 * index, 2);
      return bits::bf16_to_f32(b);
    }
    float f;
    std::memcpy(&f, buffer.data() + 4 * index, 4);
    return f;
  }
  int64_t conv_state_elements() const {
    return int64_t(conv_state.size()) / (config_.conv_state_dtype == DType::kBf16 ? 2 : 4);
  }
  // Offset (elements) of tap `tap` of channel `channel` in conv slot `slot`.
  int64_t conv_state_offset(int64_t slot, int64_t channel, int64_t tap) const {
    return slot * conv_state_slot_stride + channel * conv_state_channel_stride +
           tap * conv_state_tap_stride;
  }

  // q > 1 accessors of the slot table.
  int32_t slot(int b, int t) const { return slots[size_t(b) * slots_stride + t]; }

 private:
  template <class T>
  static void put(DeviceBuffer<T>& buffer, const std::vector<T>& host) {
    buffer.resize(host.size());
    if (!host.empty()) buffer.upload(host);
  }
  static const __nv_bfloat16* bf16_ptr(const DeviceBuffer<uint16_t>& b) {
    return reinterpret_cast<const __nv_bfloat16*>(b.get());
  }

  float normal(float sigma) { return std::normal_distribution<float>(0.0f, sigma)(rng_); }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng_); }
  int uniform_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  uint16_t bf16_normal(float sigma) { return bits::bf16_rne(normal(sigma)); }

  void fill_bf16(std::vector<uint16_t>& v, int64_t rows, int64_t width, int64_t stride, float sigma) {
    // Padding elements between rows hold values too (a view must never read them).
    v.resize(size_t(rows > 0 ? (rows - 1) * stride + width : 0));
    for (auto& e : v) e = bf16_normal(sigma);
  }

  void generate() {
    const KdaCaseConfig& c = config_;
    const int q = c.tokens, dim = this->dim(), channels = 3 * dim;
    const int64_t rows = this->rows();
    const int pad = c.row_padding;

    // Activations: row-strided views (the in_proj output is [rows, wide] in vLLM).
    x_stride = channels + pad;
    f_a_stride = kKdaRank + pad;
    raw_gate_stride = dim + pad;
    raw_beta_stride = c.heads + 3;
    output_gate_stride = dim + pad;
    output_stride = dim + pad;
    fill_bf16(x, rows, channels, x_stride, 1.0f);
    fill_bf16(f_a, rows, kKdaRank, f_a_stride, 1.0f);
    fill_bf16(raw_gate, rows, dim, raw_gate_stride, 1.5f);
    fill_bf16(raw_beta, rows, c.heads, raw_beta_stride, 1.5f);
    fill_bf16(output_gate, rows, dim, output_gate_stride, 1.5f);

    // Weights. F_B ~ N(0, 1/sqrt(rank)) keeps raw_g ~ N(0, 1) like a trained gate.
    f_b_weight.resize(size_t(dim) * kKdaRank);
    for (auto& e : f_b_weight) e = bf16_normal(1.0f / std::sqrt(float(kKdaRank)));
    conv_weight_section_stride = 0;
    if (c.conv_weight_k3_layout) {
      conv_weight_section_stride = int64_t(kKdaConvWidth) * dim;
      conv_weight_channel_stride = 1;
      conv_weight_tap_stride = dim;
    } else if (c.conv_weight_channel_major) {
      conv_weight_channel_stride = kKdaConvWidth;
      conv_weight_tap_stride = 1;
    } else {
      conv_weight_channel_stride = 1;
      conv_weight_tap_stride = channels;
    }
    const size_t weights = size_t(channels) * kKdaConvWidth;
    const bool weight_bf16 = c.conv_weight_dtype == DType::kBf16;
    conv_weight.assign(weights * (weight_bf16 ? 2 : 4), 0);
    for (size_t i = 0; i < weights; ++i) {
      const float w = uniform(-0.6f, 0.6f);
      if (weight_bf16) {
        const uint16_t b = bits::bf16_rne(w);
        std::memcpy(conv_weight.data() + 2 * i, &b, 2);
      } else {
        std::memcpy(conv_weight.data() + 4 * i, &w, 4);
      }
    }
    conv_bias.resize(channels);
    for (auto& e : conv_bias) e = normal(0.2f);
    a_log.resize(c.heads);
    for (auto& e : a_log) e = std::log(uniform(1.0f, 16.0f));  // K3's A_log init range
    dt_bias.resize(dim);
    for (auto& e : dt_bias) e = normal(1.0f);
    norm_weight.resize(kKdaHeadDim);
    for (auto& e : norm_weight) e = bits::round_bf16(1.0f + normal(0.2f));  // BF16 values (K3 holds BF16)

    // Slots: every active request owns distinct state slots (q of them for a verify);
    // conv slots share the index space (slots[b, 0]); a few slots stay unused.
    const int per_request = q;
    state_slots = 1 + int64_t(c.batch) * per_request + c.extra_slots;
    conv_state_slots = state_slots + 2;
    std::vector<int32_t> pool(static_cast<size_t>(state_slots - 1));
    for (size_t i = 0; i < pool.size(); ++i) pool[i] = int32_t(i + 1);
    std::shuffle(pool.begin(), pool.end(), rng_);

    state_slot_stride = int64_t(c.heads) * kKdaHeadDim * kKdaHeadDim + 64;
    state.resize(size_t(state_slots * state_slot_stride));
    for (auto& e : state) e = c.state_dtype == DType::kBf16 ? bits::round_bf16(normal(0.3f)) : normal(0.3f);
    if (c.state_dtype == DType::kBf16) {
      state_bf16_bits_.resize(state.size());
      for (size_t i = 0; i < state.size(); ++i) state_bf16_bits_[i] = bits::bf16_rne(state[i]);  // exact
    }

    const int taps = q + 2;
    if (c.conv_state_tap_major) {  // [slot, tap, channel] with a padded tap row
      conv_state_channel_stride = 1;
      conv_state_tap_stride = channels + 8;
      conv_state_slot_stride = taps * conv_state_tap_stride + 16;
    } else {  // [slot, channel, tap] with a padded channel row
      conv_state_tap_stride = 1;
      conv_state_channel_stride = taps + 1;
      conv_state_slot_stride = channels * conv_state_channel_stride + 16;
    }
    const int64_t conv_elements = conv_state_slots * conv_state_slot_stride;
    const bool state_bf16 = c.conv_state_dtype == DType::kBf16;
    conv_state.assign(size_t(conv_elements) * (state_bf16 ? 2 : 4), 0);
    for (int64_t i = 0; i < conv_elements; ++i) {  // every tap a BF16 value
      const uint16_t b = bf16_normal(1.0f);
      if (state_bf16) {
        std::memcpy(conv_state.data() + 2 * i, &b, 2);
      } else {
        const float f = bits::bf16_to_f32(b);
        std::memcpy(conv_state.data() + 4 * i, &f, 4);
      }
    }

    // Which requests are padding, and of which kind (cycled so that a batch of 8+
    // meets every kind). Request 0 is never padding.
    request_padding.assign(c.batch, false);
    std::vector<int> padding_kind(c.batch, -1);
    int next_kind = uniform_int(0, 7);
    for (int b = 1; b < c.batch; ++b) {
      if (c.padding_requests && uniform_int(0, 2) == 0) {
        request_padding[b] = true;
        padding_kind[b] = next_kind++ % 8;
      }
    }
    if (c.padding_requests && c.batch >= 3 && std::none_of(request_padding.begin(),
                                                           request_padding.end(),
                                                           [](bool p) { return p; })) {
      request_padding[c.batch - 1] = true;
      padding_kind[c.batch - 1] = next_kind % 8;
    }

    record_slots = 0;
    if (c.records) {
      record_slots = c.deferred_records ? c.batch + 3 : c.batch;
      record_rows.resize(c.batch);
      std::vector<int32_t> perm(static_cast<size_t>(record_slots));
      for (size_t i = 0; i < perm.size(); ++i) perm[i] = int32_t(i);
      std::shuffle(perm.begin(), perm.end(), rng_);
      for (int b = 0; b < c.batch; ++b) record_rows[b] = c.deferred_records ? perm[b] : b;
    }

    size_t next_slot = 0;
    auto take_slot = [&]() { return pool[next_slot++]; };
    const int32_t out_of_range = int32_t(state_slots + uniform_int(0, 3));
    if (q == 1) {
      slots_stride = 1;
      slots.resize(c.batch);
      for (int b = 0; b < c.batch; ++b) {
        slots[b] = take_slot();
        if (request_padding[b]) {
          const int32_t kinds[4] = {0, -1, int32_t(state_slots), out_of_range};
          slots[b] = kinds[padding_kind[b] % 4];
        }
      }
      accepted.clear();
      token_counts.clear();
    } else {
      slots_stride = q + 1;
      slots.resize(size_t(c.batch) * slots_stride);
      accepted.resize(c.batch);
      token_counts.resize(c.batch);
      for (int b = 0; b < c.batch; ++b) {
        int32_t* row = slots.data() + size_t(b) * slots_stride;
        for (int t = 0; t < q; ++t) row[t] = take_slot();
        row[q] = pool[0];  // beyond the q columns: another request's slot, never to be used
        accepted[b] = c.fixed_accepted ? c.fixed_accepted : uniform_int(1, q);
        token_counts[b] = c.token_counts ? uniform_int(1, q) : q;
        const int a = accepted[b];
        if (c.skip_some_writes) {
          for (int t = 1; t < q; ++t) {
            if (t != a - 1 && uniform_int(0, 3) == 0) {
              const int32_t skipped[3] = {0, -1, int32_t(state_slots)};
              row[t] = skipped[uniform_int(0, 2)];
            }
          }
        }
        if (!request_padding[b]) continue;
        switch (padding_kind[b]) {
          case 0: row[a - 1] = 0; if (a == 1) row[0] = 0; break;   // read slot 0
          case 1: row[a - 1] = -1; break;                           // read slot -1
          case 2: row[a - 1] = out_of_range; break;                 // read slot >= state_slots
          case 3: row[0] = uniform_int(0, 1) ? 0 : int32_t(conv_state_slots); break;  // conv slot
          case 4: accepted[b] = uniform_int(0, 1) ? 0 : q + 1; break;
          case 5: accepted[b] = -3; break;
          case 6:
            if (c.token_counts) { token_counts[b] = uniform_int(0, 1) ? 0 : q + 1; break; }
            accepted[b] = q + 2;
            break;
          default:
            if (c.records && c.deferred_records) {
              record_rows[b] = uniform_int(0, 1) ? -1 : int32_t(record_slots);
              break;
            }
            row[a - 1] = 0;
            break;
        }
      }
    }

    // The commit that follows a record verify: checkpoint slot = the read slot, and
    // sampling accepts m in [0, n] tokens (occasionally written out of range: -1 -> 0,
    // or beyond q when every token was computed -> q).
    commit_slots.assign(c.batch, 0);
    commit_accepted.assign(c.batch, 0);
    if (q > 1) {
      for (int b = 0; b < c.batch; ++b) {
        if (request_padding[b]) continue;
        const int n = token_counts[b];
        commit_slots[b] = slot(b, accepted[b] - 1);
        int m = uniform_int(0, n);
        if (m == 0 && uniform_int(0, 1)) m = -1;
        if (n == q && m == q && uniform_int(0, 1)) m = q + 3;
        commit_accepted[b] = m;
      }
    }
  }

  KdaCaseConfig config_;
  std::mt19937_64 rng_;
  mutable std::vector<uint8_t> reference_conv_weight_;  // [3 dim, 4] copy for the reference
  std::vector<uint16_t> state_bf16_bits_;                // BF16 state: `state` as bits
  // The state as the CPU reference reads it: FP32 values or BF16 bits.
  const void* reference_state() const {
    return state_bf16() ? static_cast<const void*>(state_bf16_bits_.data()) : static_cast<const void*>(state.data());
  }
};

}  // namespace fusedstep::testing
