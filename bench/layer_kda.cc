// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench --context layer, KDA (Kimi K3, q = 1): hidden [B, 7168] -> in_proj
// [B, 7168] x [7168, N] -> the op on row-strided views of that output (columns x 0..3 dim |
// output_gate | f_a 128 | raw_beta heads | zero padding to N, a multiple of 16: 6288 at 12
// heads) -> o_proj [B, dim] x [dim, 7168] -> the next layer's hidden; vLLM's kernel, where
// loaded (--kda-peer-lib) and the state is FP32, in the op's place too.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kda_peer.h"
#include "layer_context.h"

namespace fusedstep::bench::layer {
namespace {

struct KdaLayer {
  __nv_bfloat16 *w_in = nullptr, *w_out = nullptr, *f_b = nullptr, *conv_state = nullptr;
  float *conv_weight = nullptr, *a_log = nullptr, *dt_bias = nullptr, *norm_weight = nullptr;
  void* state = nullptr;  // FP32 or BF16 (KdaChain::state_dtype)
  float* peer_conv_weight = nullptr;  // vLLM's [3, 4, dim] copy (peer loaded)
  __nv_bfloat16* copy = nullptr;
};

struct KdaChain {
  int heads = 0, batch = 0, layers = 0;
  bool peer = false;
  DType state_dtype = DType::kFp32;
  int64_t dim = 0, in_cols = 0, copy_bytes = 0, state_elements = 0, state_bytes = 0, conv_elements = 0,
          workspace_bytes = 0;
  int64_t partial_floats = 0, counter_count = 0;
  std::vector<__nv_bfloat16*> hidden;  // layers + 1: layer i reads hidden[i], writes hidden[i + 1]
  __nv_bfloat16 *proj = nullptr, *out = nullptr, *raw_g = nullptr, *check_a = nullptr, *check_b = nullptr;
  int32_t* slots = nullptr;
  int* flag = nullptr;
  float* partial = nullptr;
  int* counters = nullptr;
  void* workspace = nullptr;
  // Exactness: layer 0's caches copied for each path, and their outputs.
  char *state_fused = nullptr, *state_composed = nullptr;
  __nv_bfloat16 *conv_fused = nullptr, *conv_composed = nullptr, *out_fused = nullptr, *out_composed = nullptr;
  std::vector<KdaLayer> layer;
};

template <class Arena>
void carve(Arena& a, KdaChain& c) {
  const int64_t b = c.batch, dim = c.dim;
  c.hidden.assign(c.layers + 1, nullptr);
  for (auto& h : c.hidden) h = a.template take<__nv_bfloat16>(b * kKdaModel);
  c.proj = a.template take<__nv_bfloat16>(b * c.in_cols);
  c.out = a.template take<__nv_bfloat16>(b * dim);
  c.raw_g = a.template take<__nv_bfloat16>(b * dim);
  c.check_a = a.template take<__nv_bfloat16>(b * std::max(c.in_cols, kKdaModel));
  c.check_b = a.template take<__nv_bfloat16>(b * std::max(c.in_cols, kKdaModel));
  c.slots = a.template take<int32_t>(b);
  c.flag = a.template take<int>(1);
  c.partial = a.template take<float>(std::max<int64_t>(c.partial_floats, 1));
  c.counters = a.template take<int>(std::max<int64_t>(c.counter_count, 1));
  c.workspace = a.template take<char>(std::max<int64_t>(c.workspace_bytes, 1));
  c.state_fused = a.template take<char>(c.state_bytes);
  c.state_composed = a.template take<char>(c.state_bytes);
  c.conv_fused = a.template take<__nv_bfloat16>(c.conv_elements);
  c.conv_composed = a.template take<__nv_bfloat16>(c.conv_elements);
  c.out_fused = a.template take<__nv_bfloat16>(b * dim);
  c.out_composed = a.template take<__nv_bfloat16>(b * dim);
  c.layer.assign(c.layers, KdaLayer{});
  for (KdaLayer& l : c.layer) {
    l.w_in = a.template take<__nv_bfloat16>(c.in_cols * kKdaModel);
    l.w_out = a.template take<__nv_bfloat16>(kKdaModel * dim);
    l.f_b = a.template take<__nv_bfloat16>(dim * kKdaRank);
    l.conv_weight = a.template take<float>(3 * dim * kKdaConvWidth);
    l.a_log = a.template take<float>(c.heads);
    l.dt_bias = a.template take<float>(dim);
    l.norm_weight = a.template take<float>(kKdaHeadDim);
    l.conv_state = a.template take<__nv_bfloat16>(c.conv_elements);
    l.state = a.template take<char>(c.state_bytes);
    l.copy = a.template take<__nv_bfloat16>(c.copy_bytes / 2);
    if (c.peer) l.peer_conv_weight = a.template take<float>(3 * 4 * dim);
  }
}

// Layer i's call: the activations are views of the shared in_proj output.
KdaDecodeParams kda_params(const KdaChain& c, int i, bool channel_major_conv) {
  const KdaLayer& l = c.layer[i];
  const int64_t dim = c.dim;
  KdaDecodeParams p;
  p.batch = c.batch;
  p.heads = c.heads;
  p.tokens = 1;
  p.x = c.proj;
  p.x_stride = c.in_cols;
  p.output_gate = c.proj + 3 * dim;
  p.output_gate_stride = c.in_cols;
  p.f_a = c.proj + 4 * dim;
  p.f_a_stride = c.in_cols;
  p.raw_beta = c.proj + 4 * dim + kKdaRank;
  p.raw_beta_stride = c.in_cols;
  p.conv_weight = l.conv_weight;  // [3 dim, 4] FP32
  p.conv_weight_dtype = DType::kFp32;
  p.conv_weight_channel_stride = kKdaConvWidth;
  p.conv_weight_tap_stride = 1;
  p.f_b_weight = l.f_b;
  p.a_log = l.a_log;
  p.dt_bias = l.dt_bias;
  p.norm_weight = l.norm_weight;
  p.conv_state = l.conv_state;
  p.conv_state_dtype = DType::kBf16;
  p.conv_state_slot_stride = 3 * 3 * dim;
  p.conv_state_channel_stride = channel_major_conv ? 3 : 1;
  p.conv_state_tap_stride = channel_major_conv ? 1 : 3 * dim;
  p.conv_state_slots = c.batch + 1;
  p.state = l.state;
  p.state_dtype = c.state_dtype;
  p.state_slot_stride = int64_t{c.heads} * kKdaHeadDim * kKdaHeadDim;
  p.state_slots = c.batch + 1;
  p.slots = c.slots;
  p.slots_stride = 1;
  p.output = c.out;
  p.output_stride = dim;
  return p;
}

void fill_kda(const KdaChain& c, uint64_t seed, cudaStream_t s) {
  const int64_t b = c.batch, dim = c.dim;
  for (size_t i = 0; i < c.hidden.size(); ++i) fill_uniform_bf16(c.hidden[i], b * kKdaModel, -1.0f, 1.0f, seed + i, s);
  fill_uniform_bf16(c.proj, b * c.in_cols, -1.0f, 1.0f, seed + 100, s);
  fill_uniform_bf16(c.out, b * dim, -1.0f, 1.0f, seed + 101, s);
  fill_uniform_bf16(c.raw_g, b * dim, -1.0f, 1.0f, seed + 102, s);
  // Weights scaled so that every activation keeps a standard deviation near 0.6.
  const float in_scale = std::sqrt(3.0f / kKdaModel), out_scale = std::sqrt(3.0f / dim);
  for (size_t i = 0; i < c.layer.size(); ++i) {
    const KdaLayer& l = c.layer[i];
    const uint64_t k = seed + 1000 * (i + 1);
    fill_uniform_bf16(l.w_in, c.in_cols * kKdaModel, -in_scale, in_scale, k + 1, s);
    fill_uniform_bf16(l.w_out, kKdaModel * dim, -out_scale, out_scale, k + 2, s);
    fill_uniform_bf16(l.f_b, dim * kKdaRank, -0.1f, 0.1f, k + 3, s);
    fill_uniform_f32(l.conv_weight, 3 * dim * kKdaConvWidth, -0.5f, 0.5f, k + 4, s);
    fill_uniform_f32(l.a_log, c.heads, 0.0f, 2.5f, k + 5, s);
    fill_uniform_f32(l.dt_bias, dim, -1.0f, 1.0f, k + 6, s);
    fill_uniform_f32(l.norm_weight, kKdaHeadDim, 0.5f, 1.5f, k + 7, s);
    fill_uniform_bf16(l.conv_state, c.conv_elements, -2.0f, 2.0f, k + 8, s);
    if (c.state_dtype == DType::kBf16) {
      fill_uniform_bf16(l.state, c.state_elements, -0.3f, 0.3f, k + 9, s);
    } else {
      fill_uniform_f32(static_cast<float*>(l.state), c.state_elements, -0.3f, 0.3f, k + 9, s);
    }
    fill_uniform_bf16(l.copy, c.copy_bytes / 2, -1.0f, 1.0f, k + 10, s);
  }
  // The padding columns of every in_proj weight are zero, as a padded weight's are.
  const int64_t used = 4 * dim + kKdaRank + c.heads;
  for (const KdaLayer& l : c.layer) {
    cudaMemsetAsync(l.w_in + used * kKdaModel, 0, (c.in_cols - used) * kKdaModel * 2, s);
  }
}

}  // namespace

void run_kda_shape(Context& ctx, const Options& options, Gemms& gemms, int heads, int batch, DType state_dtype,
                   uint64_t seed, const KdaSchedule* schedule) {
  const cudaStream_t s = ctx.stream;
  const bool bf16_state = state_dtype == DType::kBf16;
  const int64_t call_bytes = kda_call_bytes(heads, batch, 1, false, state_dtype);
  KdaChain c;
  c.heads = heads;
  c.batch = batch;
  c.layers = options.layers;
  c.state_dtype = state_dtype;
  c.dim = int64_t{heads} * kKdaHeadDim;
  c.in_cols = (4 * c.dim + kKdaRank + heads + 15) / 16 * 16;
  c.copy_bytes = (call_bytes + 31) / 32 * 16;  // half the op's bytes, in 16-byte vectors
  c.state_elements = int64_t{batch + 1} * heads * kKdaHeadDim * kKdaHeadDim;
  c.state_bytes = c.state_elements * (bf16_state ? 2 : 4);
  c.conv_elements = int64_t{batch + 1} * 3 * 3 * c.dim;
  KdaDecodeParams probe;
  probe.batch = batch;
  probe.heads = heads;
  probe.state_dtype = state_dtype;
  c.workspace_bytes = std::max<int64_t>(composed::workspace_bytes(probe), 0);
  size_scratch({{batch, c.in_cols, kKdaModel}, {batch, kKdaModel, c.dim}}, ctx.device.sm_count, &c.partial_floats,
               &c.counter_count);
  LayerRow base;
  base.op = "kda_decode";
  char shape[48];
  std::snprintf(shape, sizeof shape, "H=%d B=%d %s", heads, batch, bf16_state ? "bf16" : "fp32");
  base.shape = shape;
  base.bytes = call_bytes;
  JsonObject fields;
  fields.add("op", "kda_decode").add("heads", heads).add("batch", batch).add("q", 1);
  fields.add("state_dtype", bf16_state ? "bf16" : "fp32");
  if (schedule != nullptr) fields.add("schedule_listed", true);  // --schedules, not the plan's default

  // The peer, where loaded and able to run this shape (one row per producer; FP32 state).
  c.peer = kda_peer_loaded() && !bf16_state;
  Sizer sizer;
  carve(sizer, c);
  DeviceArena arena;
  std::string error;
  if (!arena.allocate(sizer.bytes, &error)) {
    base.note = error;
    ++ctx.failures;
    emit_layer_row(ctx, options, base, fields);
    return;
  }
  carve(arena, c);
  fill_kda(c, seed, s);
  std::vector<int32_t> slots(batch);
  std::iota(slots.begin(), slots.end(), 1);
  std::mt19937_64 rng(seed);
  std::shuffle(slots.begin(), slots.end(), rng);  // recycled slots: a permutation, the same in every layer
  cudaMemcpyAsync(c.slots, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice, s);
  cudaMemsetAsync(c.counters, 0, std::max<int64_t>(c.counter_count, 1) * sizeof(int), s);
  if (!cuda_ok(ctx, cudaStreamSynchronize(s), "input generation", &base.note)) {
    emit_layer_row(ctx, options, base, fields);
    return;
  }
  gemms.scratch = {c.partial, c.partial_floats, c.counters, c.counter_count};
  std::vector<KdaDecodeParams> params;
  for (int i = 0; i < c.layers; ++i) params.push_back(kda_params(c, i, options.conv_state_channel_major));
  if (schedule != nullptr) {
    for (KdaDecodeParams& p : params) p.schedule = *schedule;
  }
  KdaDecodePlan plan;
  const Result planned = fusedstep::plan(params[0], ctx.device, &plan);
  if (!planned.ok()) {
    base.note = not_run("plan", planned);
    emit_layer_row(ctx, options, base, fields);
    return;
  }
  char schedule_name[64];
  std::snprintf(schedule_name, sizeof schedule_name, "cluster=%d lanes=%d early=%d%s", plan.schedule.cluster,
                plan.schedule.lanes_per_row, plan.schedule.early, plan.schedule.evict_first ? " evict_first" : "");
  base.schedule = schedule_name;

  auto gemm_in = [&](Producer producer, int i) {
    return gemms.run(producer, c.hidden[i], kKdaModel, c.layer[i].w_in, kKdaModel, c.proj, c.in_cols, batch,
                     static_cast<int>(c.in_cols), kKdaModel, s);
  };
  auto gemm_out = [&](Producer producer, int i) {
    return gemms.run(producer, c.out, c.dim, c.layer[i].w_out, c.dim, c.hidden[i + 1], kKdaModel, batch, kKdaModel,
                     static_cast<int>(c.dim), s);
  };

  // The early-release GEMM against cuBLAS on in_proj; then exactness on layer 0: that GEMM,
  // the fused op launched with PDL right behind it (the overlap the chains time) on copies of
  // the layer's caches, and the composed path on the same views; then o_proj's GEMM check
  // on the fused output.
  bool release_ok = release_gemm_agrees(ctx, gemms, c.hidden[0], kKdaModel, c.layer[0].w_in, kKdaModel, batch,
                                        static_cast<int>(c.in_cols), kKdaModel, c.check_a, c.check_b, &base.note);
  if (ctx.cuda_broken) return emit_layer_row(ctx, options, base, fields);
  KdaDecodeParams fused = params[0], comp = params[0];
  fused.state = c.state_fused;
  fused.conv_state = c.conv_fused;
  fused.output = c.out_fused;
  comp.state = c.state_composed;
  comp.conv_state = c.conv_composed;
  comp.output = c.out_composed;
  for (char* dst : {c.state_fused, c.state_composed}) {
    cudaMemcpyAsync(dst, c.layer[0].state, c.state_bytes, cudaMemcpyDeviceToDevice, s);
  }
  for (__nv_bfloat16* dst : {c.conv_fused, c.conv_composed}) {
    cudaMemcpyAsync(dst, c.layer[0].conv_state, c.conv_elements * 2, cudaMemcpyDeviceToDevice, s);
  }
  cudaMemsetAsync(c.out_fused, 0xff, c.dim * batch * 2, s);
  cudaMemsetAsync(c.out_composed, 0xfe, c.dim * batch * 2, s);
  const bool checked = check_layer_zero(
      ctx, gemm_in, release_ok, [&](const LaunchOptions& o) { return launch(fused, o, s); },
      [&] { return composed::launch(comp, c.workspace, s); },
      [&](bool* cuda_fine) {
        bool same = true;
        same &= same_bytes("output", c.out_fused, c.out_composed, c.dim * batch * 2, 2, &base.note, cuda_fine);
        same &= same_bytes("state", c.state_fused, c.state_composed, c.state_bytes, bf16_state ? 2 : 4, &base.note,
                           cuda_fine);
        same &= same_bytes("conv_state", c.conv_fused, c.conv_composed, c.conv_elements * 2, 2, &base.note,
                           cuda_fine);
        return same;
      },
      &base);
  if (!checked) return emit_layer_row(ctx, options, base, fields);
  if (release_ok) {
    release_ok = release_gemm_agrees(ctx, gemms, c.out_fused, c.dim, c.layer[0].w_out, c.dim, batch,
                                     static_cast<int>(kKdaModel), static_cast<int>(c.dim), c.check_a, c.check_b,
                                     &base.note);
  }

  Chain chain;
  chain.gemm_in = gemm_in;
  chain.gemm_out = gemm_out;
  chain.op = op_of(ctx, params);
  for (const KdaLayer& l : c.layer) chain.copy.push_back(l.copy);
  chain.copy_bytes = c.copy_bytes;
  chain.flag = c.flag;

  // vLLM's kernel in the op's place: its F_B GEMM (cuBLAS, f_a -> raw_g) and the kernel,
  // which launches with PDL as vLLM launches it; and the kernel alone on that raw_g.
  std::vector<KdaPeerCall> peer_calls;
  std::string peer_skip = !kda_peer_loaded() ? "not loaded"
                          : c.peer           ? kda_peer_unsupported(params[0], ctx.device)
                                             : "an FP32 state only";
  if (peer_skip.empty()) {
    for (int i = 0; i < c.layers && peer_skip.empty(); ++i) {
      const KdaLayer& l = c.layer[i];
      const cudaError_t copied =
          transpose_conv_weight(l.conv_weight, c.dim * kKdaConvWidth, kKdaConvWidth, 1, c.dim, l.peer_conv_weight, s);
      if (copied != cudaSuccess) {
        peer_skip = "conv weight layout copy failed";
      }
      peer_calls.emplace_back(params[i], l.state, c.raw_g, l.peer_conv_weight);
    }
    if (!cuda_ok(ctx, cudaStreamSynchronize(s), "peer setup", &base.note)) peer_skip = "setup failed";
    // One call outside the graphs: the library's own CUDA runtime initializes and loads its
    // kernel on first use, which must not happen during a capture.
    if (peer_skip.empty()) {
      const Result warm = peer_calls[0].launch(s);
      if (!warm.ok()) {
        peer_skip = describe(warm);
        ++ctx.failures;
      } else if (!cuda_ok(ctx, cudaStreamSynchronize(s), "peer warm-up", &base.note)) {
        peer_skip = "warm-up failed";
      }
    }
  }
  if (kda_peer_loaded() && !peer_skip.empty()) {
    std::printf("  vllm_cuda_kda peer, %s: not run (%s)\n", shape, peer_skip.c_str());
  }
  auto f_b_gemm = [&](int i) {
    return blas_gemm(gemms.blas, c.proj + 4 * c.dim, c.in_cols, c.layer[i].f_b, kKdaRank, c.raw_g, c.dim, batch,
                     static_cast<int>(c.dim), kKdaRank, s);
  };

  for (Producer producer : {Producer::kCublas, Producer::kEarlyRelease}) {
    if (ctx.cuda_broken) break;
    if (!producer_runs(producer, release_ok, "kda_decode", shape, base.note)) continue;
    const double gemms_alone = time_chains(ctx, options, chain, producer, base, fields);
    if (!peer_skip.empty() || ctx.cuda_broken) continue;
    LayerRow row = base;
    row.impl = "vllm_cuda_kda";
    row.producer = producer;
    row.pdl = true;
    row.exact = Exact::kUnknown;
    row.schedule = "-";
    row.note.clear();
    auto chain_of = [&](bool with_fb) {
      return [&, with_fb](int i) {
        Result r = gemm_in(producer, i);
        if (r.ok() && with_fb) r = f_b_gemm(i);
        if (r.ok()) r = peer_calls[i].launch(s);
        if (r.ok()) r = gemm_out(producer, i);
        return r;
      };
    };
    row.gemms_chain = gemms_alone;
    row.peer_fb_chain = time_chain(ctx, options, chain_of(true), &row.note);
    row.peer_chain = time_chain(ctx, options, chain_of(false), &row.note);
    emit_layer_row(ctx, options, row, fields);
  }
}

}  // namespace fusedstep::bench::layer
