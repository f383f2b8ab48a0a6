// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench: the mHC shifted boundary rows. Per shape: an exactness run (fused
// vs composed on identical inputs, every output byte), then both paths timed as CUDA
// graphs over enough buffer sets (inputs, prepared weights and outputs of distinct
// "layers") to miss L2 the way a real decode step does.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench.h"
#include "device_util.h"
#include "mhc_outputs.h"
#include "report.h"


namespace fusedstep::bench {
namespace {


// pre, post, comb in and pre_out, post_out, comb_out: FP32 per token.
constexpr int64_t kCoefficientBytesPerToken = 4 * (4 + 4 + 16) * 2;
constexpr int kMaxBufferSets = 256;

const char* rounding_name(WeightRounding rounding) {
  switch (rounding) {
    case WeightRounding::kTf32Rna: return "tf32_rna";
    case WeightRounding::kTf32Rne: return "tf32_rne";
    case WeightRounding::kFp32: return "fp32";
  }
  return "?";
}

// A shape with distinct, far-apart, aligned addresses: enough for the pure-host
// plan() (nothing is dereferenced).
MhcBoundaryParams shape_only(int64_t hidden, int64_t tokens, WeightRounding rounding) {
  auto fake = [](int k) { return reinterpret_cast<void*>((uintptr_t{1} << 44) + (uintptr_t(k) << 38)); };
  MhcBoundaryParams p;
  p.hidden = hidden;
  p.tokens = tokens;
  p.rounding = rounding;
  p.x = static_cast<const __nv_bfloat16*>(fake(0));
  p.residual = static_cast<const __nv_bfloat16*>(fake(1));
  p.post = static_cast<const float*>(fake(2));
  p.comb = static_cast<const float*>(fake(3));
  p.pre_lag = static_cast<const float*>(fake(4));
  p.weight = static_cast<const uint32_t*>(fake(5));
  p.scale = static_cast<const float*>(fake(6));
  p.base = static_cast<const float*>(fake(7));
  p.norm_weight = static_cast<const __nv_bfloat16*>(fake(8));
  p.residual_out = static_cast<__nv_bfloat16*>(fake(9));
  p.layer_input = static_cast<__nv_bfloat16*>(fake(10));
  p.pre_out = static_cast<float*>(fake(11));
  p.post_out = static_cast<float*>(fake(12));
  p.comb_out = static_cast<float*>(fake(13));
  return p;
}

// Largest token count the plan covers in one wave of co-resident clusters (0 when
// the plan is unavailable). Waves grow with tokens, so a bisection finds the edge.
// The tile the run asked for (--mhc-tile).
MhcBoundaryParams with_schedule(MhcBoundaryParams p, const Options& options) {
  p.tile = options.mhc_tile;
  return p;
}

// Tokens of one full wave of the one-wave schedule's largest tile.
int64_t max_single_wave_tokens(const DeviceInfo& device, int64_t hidden, WeightRounding rounding) {
  auto one_wave = [&](int64_t tokens) {
    MhcBoundaryPlan covered;
    MhcBoundaryParams p = shape_only(hidden, tokens, rounding);
    return plan(p, device, &covered).ok() && covered.waves == 1;
  };
  if (!one_wave(1)) return 0;
  int64_t lo = 1, hi = kMhcMaxTokens;  // one_wave(lo) holds
  if (one_wave(hi)) return hi;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (one_wave(mid) ? lo : hi) = mid;
  }
  return lo;
}

int64_t output_bytes(int64_t hidden, int64_t tokens) {
  return DeviceArena::round_up(tokens * 4 * hidden * 2) + DeviceArena::round_up(tokens * hidden * 2) +
         2 * DeviceArena::round_up(tokens * 4 * 4) + DeviceArena::round_up(tokens * 16 * 4);
}

int64_t input_bytes(int64_t hidden, int64_t tokens, int64_t weight_words) {
  return DeviceArena::round_up(tokens * hidden * 2) + DeviceArena::round_up(tokens * 4 * hidden * 2) +
         2 * DeviceArena::round_up(tokens * 4 * 4) + DeviceArena::round_up(tokens * 16 * 4) +
         DeviceArena::round_up(weight_words * 4) + DeviceArena::round_up(3 * 4) +
         DeviceArena::round_up(24 * 4) + DeviceArena::round_up(hidden * 2);
}

// Carves one set's inputs and fills them with random values of realistic magnitude;
// its weight is prepared from a fresh random fn (each set is its own layer).
Result make_set(DeviceArena& arena, int64_t hidden, int64_t tokens, int64_t weight_words,
                WeightRounding rounding, float* fn_scratch, uint64_t seed, cudaStream_t s,
                MhcBoundaryParams* p) {
  auto* x = arena.take<__nv_bfloat16>(tokens * hidden);
  auto* residual = arena.take<__nv_bfloat16>(tokens * 4 * hidden);
  auto* post = arena.take<float>(tokens * 4);
  auto* pre_lag = arena.take<float>(tokens * 4);
  auto* comb = arena.take<float>(tokens * 16);
  auto* weight = arena.take<uint32_t>(weight_words);
  auto* scale = arena.take<float>(3);
  auto* base = arena.take<float>(24);
  auto* norm_weight = arena.take<__nv_bfloat16>(hidden);
  fill_uniform_bf16(x, tokens * hidden, -2.0f, 2.0f, seed + 1, s);
  fill_uniform_bf16(residual, tokens * 4 * hidden, -4.0f, 4.0f, seed + 2, s);
  fill_uniform_f32(post, tokens * 4, 0.0f, 2.0f, seed + 3, s);      // 2 * sigmoid
  fill_uniform_f32(pre_lag, tokens * 4, 0.0f, 1.0f, seed + 4, s);   // sigmoid + eps
  fill_uniform_f32(comb, tokens * 16, 0.0f, 0.5f, seed + 5, s);     // near doubly stochastic
  fill_uniform_f32(scale, 3, 0.1f, 0.5f, seed + 6, s);
  fill_uniform_f32(base, 24, -1.0f, 1.0f, seed + 7, s);
  fill_uniform_bf16(norm_weight, hidden, 0.5f, 1.5f, seed + 8, s);
  fill_uniform_f32(fn_scratch, 24 * 4 * hidden, -0.05f, 0.05f, seed + 9, s);
  const Result prepared = prepare_mhc_boundary_weight_device(fn_scratch, hidden, rounding, weight, s);
  if (!prepared.ok()) return prepared;
  p->hidden = hidden;
  p->tokens = tokens;
  p->rounding = rounding;
  p->x = x;
  p->residual = residual;
  p->post = post;
  p->comb = comb;
  p->pre_lag = pre_lag;
  p->weight = weight;
  p->scale = scale;
  p->base = base;
  p->norm_weight = norm_weight;
  return Result::success();
}

void run_row(Context& ctx, const Options& options, int64_t hidden, int64_t tokens,
             bool max_single_wave, uint64_t seed) {
  Row row;
  row.op = "mhc_boundary";
  char shape[64];
  std::snprintf(shape, sizeof shape, "H=%lld T=%lld%s%s", static_cast<long long>(hidden),
                static_cast<long long>(tokens), max_single_wave ? " (1-wave max)" : "",
                options.mhc_hot_weight ? " hot-weight" : "");
  row.shape = shape;
  JsonObject fields;
  fields.add("op", "mhc_boundary").add("hidden", hidden).add("tokens", tokens)
      .add("rounding", rounding_name(options.rounding));
  if (options.mhc_hot_weight) fields.add("weight", "hot");
  if (max_single_wave) fields.add("max_single_wave", true);
  const cudaStream_t s = ctx.stream;

  const int64_t words = mhc_boundary_weight_words(hidden, options.rounding);
  if (words <= 0) {
    row.note = "not run: mhc_boundary_weight_words(hidden) = 0 (not built yet, or hidden unsupported)";
    emit_row(ctx, options, row, fields);
    return;
  }
  // Without a plan the fused path cannot run; the composed path is still measured.
  MhcBoundaryPlan cover;
  const Result planned = plan(with_schedule(shape_only(hidden, tokens, options.rounding), options), ctx.device, &cover);
  if (planned.ok()) {
    row.schedule = "tile=" + std::to_string(cover.tile) + " clusters=" + std::to_string(cover.clusters) +
                   (cover.ctas_per_sm == 1 ? " 1cta/sm" : "");
    row.waves = cover.waves;
  } else {
    row.schedule = "-";
    row.note = not_run("plan", planned);
  }
  row.bytes = mhc_call_bytes(hidden, tokens, options.rounding);

  // Buffer sets: ~4x L2 in total so every replay reads from HBM.
  const int64_t per_set = input_bytes(hidden, tokens, words) + output_bytes(hidden, tokens);
  const int64_t target = 4 * std::max<int64_t>(ctx.device.l2_bytes, 1 << 20);
  int sets = static_cast<int>(std::clamp<int64_t>((target + per_set - 1) / per_set, 1, kMaxBufferSets));
  MhcBoundaryParams probe = shape_only(hidden, tokens, options.rounding);
  const int64_t workspace_bytes = std::max<int64_t>(composed::workspace_bytes(probe), 0);
  const int64_t fixed = output_bytes(hidden, tokens) + DeviceArena::round_up(24 * 4 * hidden * 4) +
                        DeviceArena::round_up(workspace_bytes);
  DeviceArena arena;
  std::string error;
  while (!arena.allocate(fixed + sets * per_set, &error)) {
    if (sets == 1) {
      row.note = error;
      ++ctx.failures;
      emit_row(ctx, options, row, fields);
      return;
    }
    sets = std::max(1, sets / 2);
  }
  row.buffer_sets = sets;
  float* fn_scratch = arena.take<float>(24 * 4 * hidden);
  void* workspace = workspace_bytes > 0 ? arena.take<char>(workspace_bytes) : nullptr;
  const MhcOutputs composed_out = take_mhc_outputs(arena, hidden, tokens);
  std::vector<MhcBoundaryParams> set_params(sets);
  std::vector<MhcOutputs> set_out(sets);
  for (int i = 0; i < sets; ++i) {
    Result made = make_set(arena, hidden, tokens, words, options.rounding, fn_scratch,
                           seed + 1000 * static_cast<uint64_t>(i), s, &set_params[i]);
    if (!made.ok()) {
      row.note = not_run("weight preparation", made);
      emit_row(ctx, options, row, fields);
      return;
    }
    set_params[i] = with_schedule(set_params[i], options);
    if (options.mhc_hot_weight) {
      set_params[i].weight = set_params[0].weight;
      set_params[i].norm_weight = set_params[0].norm_weight;
    }
    set_out[i] = take_mhc_outputs(arena, hidden, tokens);
    set_mhc_outputs(&set_params[i], set_out[i]);
  }
  if (!cuda_ok(ctx, cudaStreamSynchronize(s), "input generation", &row.note)) {
    emit_row(ctx, options, row, fields);
    return;
  }

  LaunchOptions launch_options;
  launch_options.pdl = options.pdl;
  launch_options.device = &ctx.device;

  // Exactness: both paths once on set 0's inputs, outputs poisoned with different
  // bytes so an element either path leaves unwritten shows up as a difference.
  poison_mhc_outputs(set_out[0], hidden, tokens, 0xff, s);
  poison_mhc_outputs(composed_out, hidden, tokens, 0xfe, s);
  const Result fused_run = planned.ok() ? launch(set_params[0], launch_options, s) : planned;
  if (planned.ok() && !fused_run.ok()) row.note = not_run("fused launch", fused_run);
  MhcBoundaryParams composed_params = set_params[0];
  set_mhc_outputs(&composed_params, composed_out);
  const int64_t workspace_needed = composed::workspace_bytes(composed_params);
  const Result composed_run =
      workspace_needed <= workspace_bytes
          ? composed::launch(composed_params, workspace, s)
          : Result::error(Status::kInvalidValue, "bench: composed workspace_bytes = %lld exceeds the %lld sized from the shape",
                          static_cast<long long>(workspace_needed), static_cast<long long>(workspace_bytes));
  if (!cuda_ok(ctx, cudaStreamSynchronize(s), "exactness run", &row.note)) {
    emit_row(ctx, options, row, fields);
    return;
  }
  if (!composed_run.ok()) {
    row.note += (row.note.empty() ? "" : "; ") + not_run("composed launch", composed_run);
  } else if (fused_run.ok()) {
    bool cuda_fine = true;
    const bool same = same_mhc_outputs(set_out[0], composed_out, hidden, tokens, &row.note, &cuda_fine);
    if (!cuda_fine) {
      cuda_ok(ctx, cudaGetLastError(), "exactness download", &row.note);
    } else {
      row.exact = same ? Exact::kYes : Exact::kNo;
    }
  }

  if (fused_run.ok() && !ctx.cuda_broken) {
    const Timing fused = time_graph(s, sets, options.iters, [&](int i) {
      return launch(set_params[i], launch_options, s);
    });
    if (fused.ok) {
      row.fused_us = fused.us_per_launch;
    } else {
      row.note += (row.note.empty() ? "" : "; ") + std::string("fused timing: ") + fused.error;
      // It ran once already, so a timing failure is a real one (counted once).
      if (cuda_ok(ctx, cudaGetLastError(), "fused timing", nullptr)) ++ctx.failures;
    }
  }
  if (composed_run.ok() && !ctx.cuda_broken) {
    const Timing comp = time_graph(s, sets, options.iters, [&](int i) {
      return composed::launch(set_params[i], workspace, s);
    });
    if (comp.ok) {
      row.composed_us = comp.us_per_launch;
    } else {
      row.note += (row.note.empty() ? "" : "; ") + std::string("composed timing: ") + comp.error;
      if (cuda_ok(ctx, cudaGetLastError(), "composed timing", nullptr)) ++ctx.failures;
    }
  }
  emit_row(ctx, options, row, fields);
}

}  // namespace

int64_t mhc_call_bytes(int64_t hidden, int64_t tokens, WeightRounding rounding) {
  return mhc_boundary_weight_words(hidden, rounding) * 4 + 20 * hidden * tokens + kCoefficientBytesPerToken * tokens;
}

void run_mhc(Context& ctx, const Options& options) {
  std::vector<int64_t> hiddens = options.hidden;
  if (hiddens.empty()) hiddens = options.quick ? std::vector<int64_t>{5120} : std::vector<int64_t>{4096, 5120, 7168};
  print_table_header("mhc_boundary (DeepSeek-V4.1 shifted mHC boundary; rounding of the mixer weight: " +
                     std::string(rounding_name(options.rounding)) + ")");
  uint64_t row_seed = ctx.seed * 7919 + 17;
  const int measured_before = ctx.rows_measured, not_run_before = ctx.rows_not_run;
  // --mhc-two-cta: plan() and launch() see a DeviceInfo without the one-CTA wave (what
  // plan() does on a device that cannot run it); restored below.
  const DeviceInfo device = ctx.device;
  if (options.mhc_two_cta) ctx.device.mhc_one_cta_clusters_per_wave = 0;
  for (int64_t hidden : hiddens) {
    std::vector<int64_t> tokens = options.tokens;
    const bool default_tokens = tokens.empty();
    if (default_tokens) {
      tokens = options.quick ? std::vector<int64_t>{1, 16, 256}
                             : std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128, 256, 2048};
    }
    // The largest single-wave count joins the full default list; --mhc-wave-edge adds it
    // and the count one past it (a second wave) to any list.
    int64_t one_wave = 0;
    if ((default_tokens && !options.quick) || options.mhc_wave_edge) {
      one_wave = max_single_wave_tokens(ctx.device, hidden, options.rounding);
      if (one_wave > 0) {
        tokens.push_back(one_wave);
        if (options.mhc_wave_edge && one_wave < kMhcMaxTokens) tokens.push_back(one_wave + 1);
      }
      std::sort(tokens.begin(), tokens.end());
      tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
    }
    for (int64_t t : tokens) {
      if (ctx.cuda_broken) break;
      run_row(ctx, options, hidden, t, t == one_wave, row_seed);
      row_seed += 1000003;
    }
  }
  ctx.device = device;
  if (ctx.cuda_broken) std::printf("(a CUDA error poisoned the context: remaining rows skipped)\n");
  print_op_status(ctx, "mhc_boundary", measured_before, not_run_before);
}

}  // namespace fusedstep::bench
