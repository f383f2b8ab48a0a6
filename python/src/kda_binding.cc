// SPDX-License-Identifier: Apache-2.0
// The KDA functions of fusedstep._C: decode / verify, commit, plan, CPU reference.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "binding.h"
#include "fusedstep_reference/kda_decode.h"

namespace fusedstep_python {

namespace ref = fusedstep::reference;

namespace {

struct KdaArrays {
  Array x;
  OptArray f_a, raw_gate;
  Array raw_beta, output_gate, conv_weight;
  OptArray conv_bias, f_b_weight;
  Array a_log, dt_bias, norm_weight, conv_state, state, slots;
  OptArray accepted, token_counts;
  Array output;
  OptArray record_correction, record_key_gate, record_rows;
};

// The tensors that come as BF16 or FP32 (conv weight, norm weight, conv state, state):
// placed, and their DType (ValueError naming the tensor and both dtypes otherwise).
fusedstep::DType bf16_or_f32(Call& c, const char* name, const Array& t) {
  c.place(name, t);
  if (is_bf16(t)) return fusedstep::DType::kBf16;
  if (!is_f32(t)) bad_tensor(c.op, name, t, "dtype bfloat16 or float32");
  return fusedstep::DType::kFp32;
}

// A host copy of an FP32 or BF16 array as the reference reads it: FP32 values or BF16
// bit patterns (the caches, whose dtype the reference keeps).
struct HostCache {
  bool bf16 = false;
  std::vector<uint16_t> bits;
  std::vector<float> values;
  const void* data() const {
    return bf16 ? static_cast<const void*>(bits.data()) : static_cast<const void*>(values.data());
  }
};

HostCache gather_cache(Call& c, const char* name, const Array& a) {
  HostCache h;
  h.bf16 = is_bf16(a);
  if (h.bf16) h.bits = gather<uint16_t>(c, name, a);
  else h.values = gather<float>(c, name, a);
  return h;
}

// Fills every pointer, size and stride of `p` from the arrays (all shapes checked).
void kda_fill(Call& c, KdaArrays& a, int tokens, fusedstep::KdaDecodeParams& p) {
  const int q = tokens;
  if (q < 1 || q > fusedstep::kKdaMaxTokens) {
    throw nb::value_error((std::string(c.op) + ": tokens = " + std::to_string(q) +
                           " must be in [1, 8] (tokens per request)")
                              .c_str());
  }
  c.place("a_log", a.a_log);
  c.dtype("a_log", a.a_log, Dt::kF32);
  if (a.a_log.ndim() != 1) bad_tensor(c.op, "a_log", a.a_log, "shape [heads]");
  c.contiguous("a_log", a.a_log);
  const int64_t heads = a.a_log.shape(0), dim = heads * 128;
  const std::string H = std::to_string(heads), D = std::to_string(dim),
                    D3 = std::to_string(3 * dim);

  c.place("slots", a.slots);
  c.dtype("slots", a.slots, Dt::kI32);
  int64_t batch = 0;
  if (q == 1) {
    if (a.slots.ndim() != 1) bad_tensor(c.op, "slots", a.slots, "shape [batch] with tokens = 1");
    c.contiguous("slots", a.slots);
    batch = a.slots.shape(0);
    p.slots_stride = 1;
  } else {
    if (a.slots.ndim() != 2 || int64_t(a.slots.shape(1)) < q) {
      bad_tensor(c.op, "slots", a.slots,
                 "shape [batch, >= tokens] with tokens = " + std::to_string(q));
    }
    batch = a.slots.shape(0);
    if (a.slots.stride(1) != 1) bad_tensor(c.op, "slots", a.slots, "unit stride in the last dimension");
    p.slots_stride = batch <= 1 ? int64_t(a.slots.shape(1)) : int64_t(a.slots.stride(0));
  }
  const int64_t rows = batch * q;
  const std::string R = std::to_string(rows);

  auto activation = [&](const char* name, const Array& t, int64_t width, const std::string& w) {
    c.place(name, t);
    c.dtype(name, t, Dt::kBf16);
    c.shape(name, t, {rows, width}, "[batch * tokens, " + w + "] = [" + R + ", " + std::to_string(width) + "]");
    return c.row_stride(name, t);
  };
  p.x_stride = activation("x", a.x, 3 * dim, "3 * heads * 128");
  if (a.f_a) p.f_a_stride = activation("f_a", *a.f_a, 128, "128");
  if (a.raw_gate) p.raw_gate_stride = activation("raw_gate", *a.raw_gate, dim, "heads * 128");
  p.raw_beta_stride = activation("raw_beta", a.raw_beta, heads, "heads");
  p.output_gate_stride = activation("output_gate", a.output_gate, dim, "heads * 128");
  p.output_stride = activation("output", a.output, dim, "heads * 128");

  // conv weight: [3 * dim, 4] (channel, tap) or K3's [3, 4, dim] (section, tap, channel),
  // any strides.
  p.conv_weight_dtype = bf16_or_f32(c, "conv_weight", a.conv_weight);
  const Array& w = a.conv_weight;
  if (w.ndim() == 2 && int64_t(w.shape(0)) == 3 * dim && w.shape(1) == 4) {
    p.conv_weight_channel_stride = w.stride(0);
    p.conv_weight_tap_stride = w.stride(1);
    p.conv_weight_section_stride = 0;
  } else if (w.ndim() == 3 && w.shape(0) == 3 && w.shape(1) == 4 && int64_t(w.shape(2)) == dim) {
    p.conv_weight_section_stride = w.stride(0);
    p.conv_weight_tap_stride = w.stride(1);
    p.conv_weight_channel_stride = w.stride(2);
  } else {
    bad_tensor(c.op, "conv_weight", w, "shape [3 * heads * 128, 4] = [" + D3 +
                                           ", 4] or [3, 4, heads * 128] = [3, 4, " + D + "]");
  }
  if (a.conv_bias) {
    c.place("conv_bias", *a.conv_bias);
    c.dtype("conv_bias", *a.conv_bias, Dt::kF32);
    c.shape("conv_bias", *a.conv_bias, {3 * dim}, "[3 * heads * 128] = [" + D3 + "]");
    c.contiguous("conv_bias", *a.conv_bias);
  }
  if (a.f_b_weight) {
    c.place("f_b_weight", *a.f_b_weight);
    c.dtype("f_b_weight", *a.f_b_weight, Dt::kBf16);
    c.shape("f_b_weight", *a.f_b_weight, {dim, 128}, "[heads * 128, 128] = [" + D + ", 128]");
    c.contiguous("f_b_weight", *a.f_b_weight);
  }
  auto f32_vector = [&](const char* name, const Array& t, int64_t n, const std::string& what) {
    c.place(name, t);
    c.dtype(name, t, Dt::kF32);
    c.shape(name, t, {n}, what);
    c.contiguous(name, t);
  };
  f32_vector("dt_bias", a.dt_bias, dim, "[heads * 128] = [" + D + "]");
  // norm weight: [128], BF16 (as Kimi K3's module holds it) or FP32, the same bits.
  p.norm_weight_dtype = bf16_or_f32(c, "norm_weight", a.norm_weight);
  c.place("norm_weight", a.norm_weight);
  c.shape("norm_weight", a.norm_weight, {128}, "[128]");
  c.contiguous("norm_weight", a.norm_weight);

  // conv state: [slots, 3 * dim, taps >= tokens + 2], any strides, BF16 or FP32.
  p.conv_state_dtype = bf16_or_f32(c, "conv_state", a.conv_state);
  const Array& cs = a.conv_state;
  if (cs.ndim() != 3 || int64_t(cs.shape(1)) != 3 * dim || int64_t(cs.shape(2)) < q + 2) {
    bad_tensor(c.op, "conv_state", cs,
               "shape [slots, 3 * heads * 128, taps] = [slots, " + D3 + ", >= tokens + 2 = " +
                   std::to_string(q + 2) + "] (any strides)");
  }
  p.conv_state_slots = cs.shape(0);
  p.conv_state_slot_stride = cs.stride(0);
  p.conv_state_channel_stride = cs.stride(1);
  p.conv_state_tap_stride = cs.stride(2);
  if (p.conv_state_slots == 1) {  // one slot: any slot stride past its span
    p.conv_state_slot_stride = (3 * dim - 1) * cs.stride(1) + (q + 1) * cs.stride(2) + 1;
  }

  // state: [slots, heads, 128, 128] FP32 or BF16 (its dtype is state_dtype), each slot's
  // heads contiguous.
  p.state_dtype = bf16_or_f32(c, "state", a.state);
  c.shape("state", a.state, {-1, heads, 128, 128}, "[slots, heads, 128, 128] with heads = " + H);
  c.dense_from("state", a.state, 1, "each slot's [heads, 128, 128] contiguous (strides (any, 16384, 128, 1))");
  p.state_slots = a.state.shape(0);
  p.state_slot_stride = p.state_slots == 1 ? heads * 16384 : int64_t(a.state.stride(0));

  auto per_request = [&](const char* name, const OptArray& t) {
    if (!t) return;
    c.place(name, *t);
    c.dtype(name, *t, Dt::kI32);
    c.shape(name, *t, {batch}, "[batch] = [" + std::to_string(batch) + "]");
    c.contiguous(name, *t);
  };
  per_request("accepted", a.accepted);
  per_request("token_counts", a.token_counts);
  per_request("record_rows", a.record_rows);

  if (a.record_correction) {
    c.place("record_correction", *a.record_correction);
    c.dtype("record_correction", *a.record_correction, Dt::kF32);
    c.shape("record_correction", *a.record_correction, {-1, heads, q, 128},
            "[record_slots, heads, tokens, 128] = [R, " + H + ", " + std::to_string(q) + ", 128]");
    c.contiguous("record_correction", *a.record_correction);
    p.record_slots = a.record_correction->shape(0);
  }
  if (a.record_key_gate) {
    c.place("record_key_gate", *a.record_key_gate);
    c.dtype("record_key_gate", *a.record_key_gate, Dt::kBf16);
    const int64_t R2 = a.record_correction ? p.record_slots : -1;
    c.shape("record_key_gate", *a.record_key_gate, {R2, heads, q, 256},
            "[record_slots, heads, tokens, 256] = [" +
                (R2 >= 0 ? std::to_string(R2) : std::string("R")) + ", " + H + ", " +
                std::to_string(q) + ", 256] (record_slots of record_correction)");
    c.contiguous("record_key_gate", *a.record_key_gate);
    p.record_slots = a.record_key_gate->shape(0);
  }

  p.batch = int(batch);
  p.heads = int(heads);
  p.tokens = q;
  p.x = ptr<const __nv_bfloat16>(a.x);
  p.f_a = ptr<const __nv_bfloat16>(a.f_a);
  p.raw_gate = ptr<const __nv_bfloat16>(a.raw_gate);
  p.raw_beta = ptr<const __nv_bfloat16>(a.raw_beta);
  p.output_gate = ptr<const __nv_bfloat16>(a.output_gate);
  p.conv_weight = a.conv_weight.data();
  p.conv_bias = ptr<const float>(a.conv_bias);
  p.f_b_weight = ptr<const __nv_bfloat16>(a.f_b_weight);
  p.a_log = ptr<const float>(a.a_log);
  p.dt_bias = ptr<const float>(a.dt_bias);
  p.norm_weight = a.norm_weight.data();
  p.conv_state = a.conv_state.data();
  p.state = a.state.data();
  p.slots = ptr<const int32_t>(a.slots);
  p.accepted = ptr<const int32_t>(a.accepted);
  p.token_counts = ptr<const int32_t>(a.token_counts);
  p.output = ptr<__nv_bfloat16>(a.output);
  p.record_correction = ptr<float>(a.record_correction);
  p.record_key_gate = ptr<__nv_bfloat16>(a.record_key_gate);
  p.record_rows = ptr<const int32_t>(a.record_rows);
}

nb::object kda_decode(Array x, OptArray f_a, OptArray raw_gate, Array raw_beta, Array output_gate,
                   Array conv_weight, OptArray conv_bias, OptArray f_b_weight, Array a_log,
                   Array dt_bias, Array norm_weight, Array conv_state, Array state, Array slots,
                   OptArray accepted, OptArray token_counts, Array output,
                   OptArray record_correction, OptArray record_key_gate, OptArray record_rows,
                   int tokens, float lower_bound, float q_scale, float norm_eps, int gate_mode,
                   int cluster, int lanes_per_row, int early,
                   bool evict_first, int mode, uintptr_t stream,
                   OptArray workspace, bool pdl) {
  Call c{"kda_decode", mode};
  KdaArrays a{x, f_a, raw_gate, raw_beta, output_gate, conv_weight, conv_bias, f_b_weight,
              a_log, dt_bias, norm_weight, conv_state, state, slots, accepted, token_counts,
              output, record_correction, record_key_gate, record_rows};
  fusedstep::KdaDecodeParams p;
  kda_fill(c, a, tokens, p);
  p.lower_bound = lower_bound;
  p.q_scale = q_scale;
  p.norm_eps = norm_eps;
  p.gate_mode = fusedstep::KdaGateMode(gate_mode);
  p.schedule.cluster = cluster;
  p.schedule.lanes_per_row = lanes_per_row;
  p.schedule.early = early;
  p.schedule.evict_first = evict_first;

  return run_mode(c, p, mode, stream, workspace, pdl);
}

void kda_commit(Array state, Array slots, Array accepted, Array record_correction,
                Array record_key_gate, OptArray record_rows, Array a_log, Array dt_bias,
                int tokens, float lower_bound, int mode, uintptr_t stream, bool pdl) {
  Call c{"kda_commit", mode};
  c.place("a_log", a_log);
  c.dtype("a_log", a_log, Dt::kF32);
  if (a_log.ndim() != 1) bad_tensor(c.op, "a_log", a_log, "shape [heads]");
  c.contiguous("a_log", a_log);
  const int64_t heads = a_log.shape(0), dim = heads * 128;
  c.place("dt_bias", dt_bias);
  c.dtype("dt_bias", dt_bias, Dt::kF32);
  c.shape("dt_bias", dt_bias, {dim}, "[heads * 128] = [" + std::to_string(dim) + "]");
  c.contiguous("dt_bias", dt_bias);
  c.place("slots", slots);
  c.dtype("slots", slots, Dt::kI32);
  if (slots.ndim() != 1) bad_tensor(c.op, "slots", slots, "shape [batch] (each request's checkpoint slot)");
  c.contiguous("slots", slots);
  const int64_t batch = slots.shape(0);
  const std::string B = std::to_string(batch);
  c.place("accepted", accepted);
  c.dtype("accepted", accepted, Dt::kI32);
  c.shape("accepted", accepted, {batch}, "[batch] = [" + B + "]");
  c.contiguous("accepted", accepted);
  if (record_rows) {
    c.place("record_rows", *record_rows);
    c.dtype("record_rows", *record_rows, Dt::kI32);
    c.shape("record_rows", *record_rows, {batch}, "[batch] = [" + B + "]");
    c.contiguous("record_rows", *record_rows);
  }
  const fusedstep::DType state_dtype = bf16_or_f32(c, "state", state);
  c.shape("state", state, {-1, heads, 128, 128},
          "[slots, heads, 128, 128] with heads = " + std::to_string(heads));
  c.dense_from("state", state, 1, "each slot's [heads, 128, 128] contiguous");
  c.place("record_correction", record_correction);
  c.dtype("record_correction", record_correction, Dt::kF32);
  c.shape("record_correction", record_correction, {-1, heads, tokens, 128},
          "[record_slots, heads, tokens, 128]");
  c.contiguous("record_correction", record_correction);
  c.place("record_key_gate", record_key_gate);
  c.dtype("record_key_gate", record_key_gate, Dt::kBf16);
  c.shape("record_key_gate", record_key_gate,
          {int64_t(record_correction.shape(0)), heads, tokens, 256},
          "[record_slots, heads, tokens, 256] (record_slots of record_correction)");
  c.contiguous("record_key_gate", record_key_gate);

  fusedstep::KdaCommitParams p;
  p.batch = int(batch);
  p.heads = int(heads);
  p.tokens = tokens;
  p.state = state.data();
  p.state_dtype = state_dtype;
  p.state_slots = state.shape(0);
  p.state_slot_stride = p.state_slots == 1 ? heads * 16384 : int64_t(state.stride(0));
  p.slots = ptr<const int32_t>(slots);
  p.accepted = ptr<const int32_t>(accepted);
  p.record_correction = ptr<const float>(record_correction);
  p.record_key_gate = ptr<const __nv_bfloat16>(record_key_gate);
  p.record_rows = ptr<const int32_t>(record_rows);
  p.record_slots = record_correction.shape(0);
  p.a_log = ptr<const float>(a_log);
  p.dt_bias = ptr<const float>(dt_bias);
  p.lower_bound = lower_bound;
  const fusedstep::DeviceInfo info = c.device_info();
  c.raise_if(fusedstep::check(p, info));
  if (mode == kModeCheck) return;
  if (mode == kModeComposed) {
    throw nb::value_error("kda_commit: there is one commit kernel (no composed path)");
  }
  c.ensure_current_device();
  fusedstep::LaunchOptions options{.pdl = pdl, .device = &info};
  c.raise_if(fusedstep::launch(p, options, as_stream(stream)));
}

// ---------------------------------------------------------------- CPU reference
nb::dict reference_kda_decode(Array x, OptArray f_a, OptArray raw_gate, Array raw_beta,
                              Array output_gate, Array conv_weight, OptArray conv_bias,
                              OptArray f_b_weight, Array a_log, Array dt_bias, Array norm_weight,
                              Array conv_state, Array state, Array slots, OptArray accepted,
                              OptArray token_counts, OptArray record_slots_like,
                              OptArray record_rows, int tokens, float lower_bound,
                              float q_scale, float norm_eps, int gate_mode,
                              const std::string& precision) {
  // The shapes are the GPU op's (kda_fill checks them with a dummy output); the data are
  // gathered into canonical row-major copies.
  Call c{"reference.kda_decode", kModeCheck};
  const int64_t heads_guess = a_log.ndim() == 1 ? int64_t(a_log.shape(0)) : 0;
  const int q = tokens;
  const int64_t batch = slots.ndim() >= 1 ? int64_t(slots.shape(0)) : 0;
  const int64_t rows = batch * q, dim = heads_guess * 128, channels = 3 * dim;
  // Shape checks shared with the op: reuse kda_fill on the given arrays with the output
  // shape it expects (the reference returns the output instead of writing it).
  std::vector<uint16_t> dummy(size_t(std::max<int64_t>(rows * dim, 1)));
  size_t out_shape[2] = {size_t(rows), size_t(dim)};
  Array output(dummy.data(), 2, out_shape, nb::handle(), nullptr, nb::dtype<uint16_t>());
  std::optional<Array> record_kg;
  std::vector<uint16_t> kg_dummy;
  int64_t record_slots = 0;
  if (record_slots_like) {  // record_correction-shaped [R, heads, q, 128]: only its shape is used
    record_slots = record_slots_like->ndim() == 4 ? int64_t(record_slots_like->shape(0)) : 0;
    kg_dummy.resize(size_t(std::max<int64_t>(record_slots * heads_guess * q * 256, 1)));
    size_t kg_shape[4] = {size_t(record_slots), size_t(heads_guess), size_t(q), 256};
    record_kg = Array(kg_dummy.data(), 4, kg_shape, nb::handle(), nullptr, nb::dtype<uint16_t>());
  }
  KdaArrays a{x, f_a, raw_gate, raw_beta, output_gate, conv_weight, conv_bias, f_b_weight,
              a_log, dt_bias, norm_weight, conv_state, state, slots, accepted, token_counts,
              output, record_slots_like, record_kg, record_rows};
  fusedstep::KdaDecodeParams gp;
  kda_fill(c, a, tokens, gp);
  if (gate_mode < 0 || gate_mode > 2) {
    throw nb::value_error(("gate_mode = " + std::to_string(gate_mode) + " must be 0, 1 or 2").c_str());
  }
  if (f_a.has_value() == raw_gate.has_value()) {
    throw nb::value_error("reference.kda_decode: give exactly one of f_a and raw_gate");
  }
  if (f_a && !f_b_weight) throw nb::value_error("reference.kda_decode: f_b_weight is needed with f_a");
  if (q > 1 && !accepted) throw nb::value_error("reference.kda_decode: accepted is needed with tokens > 1");

  const auto xs = gather<uint16_t>(c, "x", x);
  std::vector<uint16_t> fas, rgs, fbs;
  if (f_a) fas = gather<uint16_t>(c, "f_a", *f_a);
  if (raw_gate) rgs = gather<uint16_t>(c, "raw_gate", *raw_gate);
  if (f_b_weight) fbs = gather<uint16_t>(c, "f_b_weight", *f_b_weight);
  const auto rbs = gather<uint16_t>(c, "raw_beta", raw_beta);
  const auto ogs = gather<uint16_t>(c, "output_gate", output_gate);
  // conv weight -> [3 dim, 4] (channel, tap)
  std::vector<float> cw(size_t(channels) * 4);
  {
    const auto flat = gather<float>(c, "conv_weight", conv_weight);
    if (conv_weight.ndim() == 2) {
      cw = flat;
    } else {  // [3, 4, dim]
      for (int64_t s = 0; s < 3; ++s)
        for (int64_t j = 0; j < 4; ++j)
          for (int64_t i = 0; i < dim; ++i) cw[size_t((s * dim + i) * 4 + j)] = flat[size_t((s * 4 + j) * dim + i)];
    }
  }
  std::vector<float> cb;
  if (conv_bias) cb = gather<float>(c, "conv_bias", *conv_bias);
  const auto al = gather<float>(c, "a_log", a_log);
  const auto dt = gather<float>(c, "dt_bias", dt_bias);
  const auto nw = gather<float>(c, "norm_weight", norm_weight);
  const int64_t conv_slots = conv_state.shape(0), taps = conv_state.shape(2);
  const HostCache cs = gather_cache(c, "conv_state", conv_state);  // kda_fill took FP32 or BF16 only
  const HostCache st = gather_cache(c, "state", state);
  const auto sl = gather<int32_t>(c, "slots", slots);
  std::vector<int32_t> acc, tc, rr;
  if (accepted) acc = gather<int32_t>(c, "accepted", *accepted);
  if (token_counts) tc = gather<int32_t>(c, "token_counts", *token_counts);
  if (record_rows) rr = gather<int32_t>(c, "record_rows", *record_rows);

  ref::KdaProblem p;
  p.batch = int(batch);
  p.heads = int(heads_guess);
  p.tokens = q;
  p.x = xs.data(); p.x_stride = channels;
  if (f_a) { p.f_a = fas.data(); p.f_a_stride = 128; p.f_b_weight = fbs.data(); }
  if (raw_gate) { p.raw_gate = rgs.data(); p.raw_gate_stride = dim; }
  p.raw_beta = rbs.data(); p.raw_beta_stride = heads_guess;
  p.output_gate = ogs.data(); p.output_gate_stride = dim;
  p.conv_weight = cw.data(); p.conv_weight_bf16 = false;
  p.conv_weight_channel_stride = 4; p.conv_weight_tap_stride = 1;
  p.conv_bias = conv_bias ? cb.data() : nullptr;
  p.a_log = al.data(); p.dt_bias = dt.data(); p.norm_weight = nw.data();
  p.conv_state = cs.data();
  p.conv_state_bf16 = cs.bf16;
  p.conv_state_slot_stride = channels * taps; p.conv_state_channel_stride = taps; p.conv_state_tap_stride = 1;
  p.conv_state_slots = conv_slots;
  p.state = st.data(); p.state_bf16 = st.bf16;
  p.state_slot_stride = heads_guess * 16384; p.state_slots = state.shape(0);
  p.slots = sl.data(); p.slots_stride = q == 1 ? 1 : int64_t(slots.shape(1));
  p.accepted = accepted ? acc.data() : nullptr;
  p.token_counts = token_counts ? tc.data() : nullptr;
  p.records = record_slots_like.has_value();
  p.record_rows = record_rows ? rr.data() : nullptr;
  p.record_slots = record_slots;
  p.lower_bound = lower_bound; p.q_scale = q_scale; p.norm_eps = norm_eps;
  p.gate_mode = ref::KdaGateMode(gate_mode);
  ref::KdaResult r = ref::kda_decode(p, precision_of(precision));
  nb::dict out;
  const size_t R = size_t(rows), D = size_t(dim), Hh = size_t(heads_guess);
  out["output"] = to_numpy(std::move(r.output), {R, D});
  out["state"] = to_numpy(std::move(r.state), {size_t(state.shape(0)), Hh, 128, 128});
  out["conv_state"] = to_numpy(std::move(r.conv_state), {size_t(conv_slots), size_t(channels), size_t(taps)});
  out["raw_g"] = to_numpy(std::move(r.raw_g), {R, D});
  out["conv_out"] = to_numpy(std::move(r.conv_out), {R, size_t(channels)});
  if (p.records) {
    out["record_correction"] = to_numpy(std::move(r.record_correction), {size_t(record_slots), Hh, size_t(q), 128});
    out["record_key_gate"] = to_numpy(std::move(r.record_key_gate), {size_t(record_slots), Hh, size_t(q), 256});
  }
  return out;
}

nb::ndarray<nb::numpy, double> reference_kda_commit(Array state, Array slots, Array accepted,
                                                    Array record_correction, Array record_key_gate,
                                                    OptArray record_rows, Array a_log, Array dt_bias,
                                                    int tokens, float lower_bound,
                                                    const std::string& precision) {
  Call c{"reference.kda_commit", kModeCheck};
  c.dtype("a_log", a_log, Dt::kF32);
  if (a_log.ndim() != 1) bad_tensor(c.op, "a_log", a_log, "shape [heads]");
  const int64_t heads = a_log.shape(0);
  c.dtype("dt_bias", dt_bias, Dt::kF32);
  c.shape("dt_bias", dt_bias, {heads * 128}, "[heads * 128]");
  bf16_or_f32(c, "state", state);
  c.shape("state", state, {-1, heads, 128, 128}, "[slots, heads, 128, 128]");
  c.dtype("slots", slots, Dt::kI32);
  if (slots.ndim() != 1) bad_tensor(c.op, "slots", slots, "shape [batch]");
  const int64_t batch = slots.shape(0);
  c.dtype("accepted", accepted, Dt::kI32);
  c.shape("accepted", accepted, {batch}, "[batch]");
  if (!(is_f32(record_correction) || is_f64(record_correction))) {
    bad_tensor(c.op, "record_correction", record_correction, "dtype float32 or float64");
  }
  c.shape("record_correction", record_correction, {-1, heads, tokens, 128}, "[record_slots, heads, tokens, 128]");
  const int64_t R = record_correction.shape(0);
  if (!(is_bf16(record_key_gate) || is_f64(record_key_gate) || is_f32(record_key_gate))) {
    bad_tensor(c.op, "record_key_gate", record_key_gate, "dtype bfloat16, float32 or float64");
  }
  c.shape("record_key_gate", record_key_gate, {R, heads, tokens, 256}, "[record_slots, heads, tokens, 256]");
  if (record_rows) {
    c.dtype("record_rows", *record_rows, Dt::kI32);
    c.shape("record_rows", *record_rows, {batch}, "[batch]");
  }
  if (tokens < 1 || tokens > 8) throw nb::value_error("reference.kda_commit: tokens must be in [1, 8]");
  const HostCache st = gather_cache(c, "state", state);
  const auto sl = gather<int32_t>(c, "slots", slots);
  const auto ac = gather<int32_t>(c, "accepted", accepted);
  const auto rc = gather<double>(c, "record_correction", record_correction);
  const auto kg = gather<double>(c, "record_key_gate", record_key_gate);
  std::vector<int32_t> rr;
  if (record_rows) rr = gather<int32_t>(c, "record_rows", *record_rows);
  const auto al = gather<float>(c, "a_log", a_log);
  const auto dt = gather<float>(c, "dt_bias", dt_bias);
  ref::KdaCommitProblem p;
  p.batch = int(batch);
  p.heads = int(heads);
  p.tokens = tokens;
  p.state = st.data();
  p.state_bf16 = st.bf16;
  p.state_slot_stride = heads * 16384;
  p.state_slots = state.shape(0);
  p.slots = sl.data();
  p.slots_stride = 1;
  p.accepted = ac.data();
  p.record_correction = rc.data();
  p.record_key_gate = kg.data();
  p.record_rows = record_rows ? rr.data() : nullptr;
  p.record_slots = R;
  p.a_log = al.data();
  p.dt_bias = dt.data();
  p.lower_bound = lower_bound;
  std::vector<double> r = ref::kda_commit(p, precision_of(precision));
  return to_numpy(std::move(r), {size_t(state.shape(0)), size_t(heads), 128, 128});
}

}  // namespace

// The fields of KdaDecodePlan and its schedule (include/fusedstep/kda_decode.h) that
// MODE_PLAN returns, each as a dict entry of its own name. A field added to or removed
// from a struct is one entry here.
#define FS_KDA_PLAN_FIELDS(X) X(ctas) X(waves)
#define FS_KDA_SCHEDULE_FIELDS(X) \
  X(cluster) X(lanes_per_row) X(early) X(evict_first)

nb::dict plan_dict(const fusedstep::KdaDecodePlan& plan) {
  nb::dict schedule;
#define FS_FIELD(name) schedule[#name] = plan.schedule.name;
  FS_KDA_SCHEDULE_FIELDS(FS_FIELD)
#undef FS_FIELD
  nb::dict d;
  d["schedule"] = schedule;
#define FS_FIELD(name) d[#name] = plan.name;
  FS_KDA_PLAN_FIELDS(FS_FIELD)
#undef FS_FIELD
  return d;
}

void register_kda(nb::module_& m) {
  m.def("kda_decode", &kda_decode, nb::arg("x"), nb::arg("f_a").none(),
        nb::arg("raw_gate").none(), nb::arg("raw_beta"), nb::arg("output_gate"),
        nb::arg("conv_weight"), nb::arg("conv_bias").none(), nb::arg("f_b_weight").none(),
        nb::arg("a_log"), nb::arg("dt_bias"), nb::arg("norm_weight"), nb::arg("conv_state"),
        nb::arg("state"), nb::arg("slots"), nb::arg("accepted").none(),
        nb::arg("token_counts").none(), nb::arg("output"), nb::arg("record_correction").none(),
        nb::arg("record_key_gate").none(), nb::arg("record_rows").none(), nb::arg("tokens"),
        nb::arg("lower_bound"), nb::arg("q_scale"), nb::arg("norm_eps"), nb::arg("gate_mode"),
        nb::arg("cluster"), nb::arg("lanes_per_row"), nb::arg("early"),
        nb::arg("evict_first"),
        nb::arg("mode"), nb::arg("stream"),
        nb::arg("workspace").none(), nb::arg("pdl"));
  m.def("kda_commit", &kda_commit, nb::arg("state"), nb::arg("slots"), nb::arg("accepted"),
        nb::arg("record_correction"), nb::arg("record_key_gate"), nb::arg("record_rows").none(),
        nb::arg("a_log"), nb::arg("dt_bias"), nb::arg("tokens"), nb::arg("lower_bound"),
        nb::arg("mode"), nb::arg("stream"), nb::arg("pdl"));
  m.def("reference_kda_decode", &reference_kda_decode, nb::arg("x"), nb::arg("f_a").none(),
        nb::arg("raw_gate").none(), nb::arg("raw_beta"), nb::arg("output_gate"),
        nb::arg("conv_weight"), nb::arg("conv_bias").none(), nb::arg("f_b_weight").none(),
        nb::arg("a_log"), nb::arg("dt_bias"), nb::arg("norm_weight"), nb::arg("conv_state"),
        nb::arg("state"), nb::arg("slots"), nb::arg("accepted").none(),
        nb::arg("token_counts").none(), nb::arg("record_correction").none(),
        nb::arg("record_rows").none(), nb::arg("tokens"), nb::arg("lower_bound"),
        nb::arg("q_scale"), nb::arg("norm_eps"), nb::arg("gate_mode"), nb::arg("precision"));
  m.def("reference_kda_commit", &reference_kda_commit, nb::arg("state"), nb::arg("slots"),
        nb::arg("accepted"), nb::arg("record_correction"), nb::arg("record_key_gate"),
        nb::arg("record_rows").none(), nb::arg("a_log"), nb::arg("dt_bias"), nb::arg("tokens"),
        nb::arg("lower_bound"), nb::arg("precision"));
}

}  // namespace fusedstep_python
