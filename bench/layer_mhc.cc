// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench --context layer, mHC (DeepSeek-V4.1, hidden H): h [T, 2048] -> [T, 2048] x
// [2048, H] = x, the sublayer's output -> the boundary (x; the residual streams, post and comb
// of the seam before, its pre as pre_lag) -> layer_input [T, H] x [H, 2048] -> the next
// layer's h. The boundary's residual, post, comb and pre outputs are the next layer's inputs.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "layer_context.h"
#include "mhc_outputs.h"

namespace fusedstep::bench::layer {
namespace {

struct MhcLayer {
  __nv_bfloat16 *w_a = nullptr, *w_b = nullptr, *norm_weight = nullptr, *copy = nullptr;
  uint32_t* weight = nullptr;
  float *scale = nullptr, *base = nullptr;
};

struct MhcChain {
  int64_t hidden = 0, tokens = 0, words = 0, copy_bytes = 0, workspace_bytes = 0;
  int64_t partial_floats = 0, counter_count = 0;
  int layers = 0;
  // layers + 1 each: layer i reads index i and writes index i + 1.
  std::vector<__nv_bfloat16*> h, residual;
  std::vector<float*> post, comb, pre;
  __nv_bfloat16 *x = nullptr, *layer_input = nullptr, *check_a = nullptr, *check_b = nullptr;
  float* fn = nullptr;
  int* flag = nullptr;
  float* partial = nullptr;
  int* counters = nullptr;
  void* workspace = nullptr;
  MhcOutputs fused, composed;  // exactness outputs of layer 0
  std::vector<MhcLayer> layer;
};

template <class Arena>
void carve(Arena& a, MhcChain& c) {
  const int64_t t = c.tokens, hd = c.hidden;
  c.h.assign(c.layers + 1, nullptr);
  c.residual.assign(c.layers + 1, nullptr);
  c.post.assign(c.layers + 1, nullptr);
  c.comb.assign(c.layers + 1, nullptr);
  c.pre.assign(c.layers + 1, nullptr);
  for (int i = 0; i <= c.layers; ++i) {
    c.h[i] = a.template take<__nv_bfloat16>(t * kMhcInner);
    c.residual[i] = a.template take<__nv_bfloat16>(t * 4 * hd);
    c.post[i] = a.template take<float>(t * 4);
    c.comb[i] = a.template take<float>(t * 16);
    c.pre[i] = a.template take<float>(t * 4);
  }
  c.x = a.template take<__nv_bfloat16>(t * hd);
  c.layer_input = a.template take<__nv_bfloat16>(t * hd);
  c.check_a = a.template take<__nv_bfloat16>(t * std::max(hd, kMhcInner));
  c.check_b = a.template take<__nv_bfloat16>(t * std::max(hd, kMhcInner));
  c.fn = a.template take<float>(kMhcMixes * 4 * hd);
  c.flag = a.template take<int>(1);
  c.partial = a.template take<float>(std::max<int64_t>(c.partial_floats, 1));
  c.counters = a.template take<int>(std::max<int64_t>(c.counter_count, 1));
  c.workspace = a.template take<char>(std::max<int64_t>(c.workspace_bytes, 1));
  c.fused = take_mhc_outputs(a, hd, t);
  c.composed = take_mhc_outputs(a, hd, t);
  c.layer.assign(c.layers, MhcLayer{});
  for (MhcLayer& l : c.layer) {
    l.w_a = a.template take<__nv_bfloat16>(hd * kMhcInner);
    l.w_b = a.template take<__nv_bfloat16>(kMhcInner * hd);
    l.weight = a.template take<uint32_t>(c.words);
    l.scale = a.template take<float>(3);
    l.base = a.template take<float>(kMhcMixes);
    l.norm_weight = a.template take<__nv_bfloat16>(hd);
    l.copy = a.template take<__nv_bfloat16>(c.copy_bytes / 2);
  }
}

MhcBoundaryParams mhc_params(const MhcChain& c, int i, const Options& options) {
  const MhcLayer& l = c.layer[i];
  MhcBoundaryParams p;
  p.hidden = c.hidden;
  p.tokens = c.tokens;
  p.rounding = options.rounding;
  p.tile = options.mhc_tile;
  p.x = c.x;
  p.residual = c.residual[i];
  p.post = c.post[i];
  p.comb = c.comb[i];
  p.pre_lag = c.pre[i];
  p.weight = l.weight;
  p.scale = l.scale;
  p.base = l.base;
  p.norm_weight = l.norm_weight;
  p.residual_out = c.residual[i + 1];
  p.layer_input = c.layer_input;
  p.pre_out = c.pre[i + 1];
  p.post_out = c.post[i + 1];
  p.comb_out = c.comb[i + 1];
  return p;
}

Result fill_mhc(const MhcChain& c, WeightRounding rounding, uint64_t seed, cudaStream_t s) {
  const int64_t t = c.tokens, hd = c.hidden;
  for (int i = 0; i <= c.layers; ++i) {  // ranges as the back-to-back rows' (mhc_bench.cc)
    const uint64_t k = seed + 10 * i;
    fill_uniform_bf16(c.h[i], t * kMhcInner, -1.0f, 1.0f, k + 1, s);
    fill_uniform_bf16(c.residual[i], t * 4 * hd, -4.0f, 4.0f, k + 2, s);
    fill_uniform_f32(c.post[i], t * 4, 0.0f, 2.0f, k + 3, s);
    fill_uniform_f32(c.comb[i], t * 16, 0.0f, 0.5f, k + 4, s);
    fill_uniform_f32(c.pre[i], t * 4, 0.0f, 1.0f, k + 5, s);
  }
  fill_uniform_bf16(c.x, t * hd, -1.0f, 1.0f, seed + 901, s);
  fill_uniform_bf16(c.layer_input, t * hd, -1.0f, 1.0f, seed + 902, s);
  const float a_scale = std::sqrt(3.0f / kMhcInner), b_scale = std::sqrt(3.0f / hd);
  for (size_t i = 0; i < c.layer.size(); ++i) {
    const MhcLayer& l = c.layer[i];
    const uint64_t k = seed + 1000 * (i + 1);
    fill_uniform_bf16(l.w_a, hd * kMhcInner, -a_scale, a_scale, k + 1, s);
    fill_uniform_bf16(l.w_b, kMhcInner * hd, -b_scale, b_scale, k + 2, s);
    fill_uniform_f32(l.scale, 3, 0.1f, 0.5f, k + 3, s);
    fill_uniform_f32(l.base, kMhcMixes, -1.0f, 1.0f, k + 4, s);
    fill_uniform_bf16(l.norm_weight, hd, 0.5f, 1.5f, k + 5, s);
    fill_uniform_bf16(l.copy, c.copy_bytes / 2, -1.0f, 1.0f, k + 6, s);
    fill_uniform_f32(c.fn, kMhcMixes * 4 * hd, -0.05f, 0.05f, k + 7, s);
    const Result prepared = prepare_mhc_boundary_weight_device(c.fn, hd, rounding, l.weight, s);
    if (!prepared.ok()) return prepared;
  }
  return Result::success();
}

}  // namespace

void run_mhc_shape(Context& ctx, const Options& options, Gemms& gemms, int64_t hidden, int64_t tokens, uint64_t seed) {
  const cudaStream_t s = ctx.stream;
  MhcChain c;
  c.hidden = hidden;
  c.tokens = tokens;
  c.layers = options.layers;
  c.words = mhc_boundary_weight_words(hidden, options.rounding);
  LayerRow base;
  base.op = "mhc_boundary";
  char shape[48];
  std::snprintf(shape, sizeof shape, "H=%lld T=%lld", static_cast<long long>(hidden), static_cast<long long>(tokens));
  base.shape = shape;
  JsonObject fields;
  fields.add("op", "mhc_boundary").add("hidden", hidden).add("tokens", tokens);
  if (c.words <= 0) {
    base.note = "not run: mhc_boundary_weight_words(hidden) = 0 (hidden unsupported)";
    return emit_layer_row(ctx, options, base, fields);
  }
  base.bytes = mhc_call_bytes(hidden, tokens, options.rounding);
  c.copy_bytes = (base.bytes + 31) / 32 * 16;  // half the op's bytes, in 16-byte vectors
  const int m = static_cast<int>(tokens);
  size_scratch({{m, hidden, kMhcInner}, {m, kMhcInner, hidden}}, ctx.device.sm_count, &c.partial_floats,
               &c.counter_count);
  Sizer sizer;
  carve(sizer, c);
  DeviceArena arena;
  std::string error;
  if (!arena.allocate(sizer.bytes, &error)) {
    base.note = error;
    ++ctx.failures;
    return emit_layer_row(ctx, options, base, fields);
  }
  carve(arena, c);
  std::vector<MhcBoundaryParams> params;
  for (int i = 0; i < c.layers; ++i) params.push_back(mhc_params(c, i, options));
  c.workspace_bytes = std::max<int64_t>(composed::workspace_bytes(params[0]), 0);
  if (c.workspace_bytes > 0) {  // sized after the shape: carve again with the workspace in
    Sizer resized;
    carve(resized, c);
    if (!arena.allocate(resized.bytes, &error)) {
      base.note = error;
      ++ctx.failures;
      return emit_layer_row(ctx, options, base, fields);
    }
    carve(arena, c);
    params.clear();
    for (int i = 0; i < c.layers; ++i) params.push_back(mhc_params(c, i, options));
  }
  const Result filled = fill_mhc(c, options.rounding, seed, s);
  cudaMemsetAsync(c.counters, 0, std::max<int64_t>(c.counter_count, 1) * sizeof(int), s);
  if (!filled.ok()) {
    base.note = not_run("weight preparation", filled);
    return emit_layer_row(ctx, options, base, fields);
  }
  if (!cuda_ok(ctx, cudaStreamSynchronize(s), "input generation", &base.note)) {
    return emit_layer_row(ctx, options, base, fields);
  }
  gemms.scratch = {c.partial, c.partial_floats, c.counters, c.counter_count};
  MhcBoundaryPlan plan;
  const Result planned = fusedstep::plan(params[0], ctx.device, &plan);
  if (!planned.ok()) {
    base.note = not_run("plan", planned);
    return emit_layer_row(ctx, options, base, fields);
  }
  base.schedule = "tile=" + std::to_string(plan.tile) + " clusters=" + std::to_string(plan.clusters) +
                  (plan.ctas_per_sm == 1 ? " 1cta/sm" : "");

  auto gemm_in = [&](Producer producer, int i) {  // the sublayer's output projection: x
    return gemms.run(producer, c.h[i], kMhcInner, c.layer[i].w_a, kMhcInner, c.x, hidden, m, static_cast<int>(hidden),
                     kMhcInner, s);
  };
  auto gemm_out = [&](Producer producer, int i) {  // the next sublayer's input projection
    return gemms.run(producer, c.layer_input, hidden, c.layer[i].w_b, hidden, c.h[i + 1], kMhcInner, m, kMhcInner,
                     static_cast<int>(hidden), s);
  };

  // GEMM check, exactness on layer 0 (as for KDA), the second GEMM's check.
  bool release_ok = release_gemm_agrees(ctx, gemms, c.h[0], kMhcInner, c.layer[0].w_a, kMhcInner, m,
                                        static_cast<int>(hidden), kMhcInner, c.check_a, c.check_b, &base.note);
  if (ctx.cuda_broken) return emit_layer_row(ctx, options, base, fields);
  MhcBoundaryParams fused = params[0], comp = params[0];
  set_mhc_outputs(&fused, c.fused);
  set_mhc_outputs(&comp, c.composed);
  poison_mhc_outputs(c.fused, hidden, tokens, 0xff, s);
  poison_mhc_outputs(c.composed, hidden, tokens, 0xfe, s);
  const bool checked = check_layer_zero(
      ctx, gemm_in, release_ok, [&](const LaunchOptions& o) { return launch(fused, o, s); },
      [&] { return composed::launch(comp, c.workspace, s); },
      [&](bool* cuda_fine) { return same_mhc_outputs(c.fused, c.composed, hidden, tokens, &base.note, cuda_fine); },
      &base);
  if (!checked) return emit_layer_row(ctx, options, base, fields);
  if (release_ok) {
    release_ok = release_gemm_agrees(ctx, gemms, c.fused.layer_input, hidden, c.layer[0].w_b, hidden, m, kMhcInner,
                                     static_cast<int>(hidden), c.check_a, c.check_b, &base.note);
  }

  Chain chain;
  chain.gemm_in = gemm_in;
  chain.gemm_out = gemm_out;
  chain.op = op_of(ctx, params);
  for (const MhcLayer& l : c.layer) chain.copy.push_back(l.copy);
  chain.copy_bytes = c.copy_bytes;
  chain.flag = c.flag;
  for (Producer producer : {Producer::kCublas, Producer::kEarlyRelease}) {
    if (ctx.cuda_broken) break;
    if (!producer_runs(producer, release_ok, "mhc_boundary", shape, base.note)) continue;
    time_chains(ctx, options, chain, producer, base, fields);
  }
}

}  // namespace fusedstep::bench::layer
