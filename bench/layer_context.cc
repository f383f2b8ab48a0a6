// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench --context layer: each op where an engine runs it. One CUDA graph holds a
// chain of `--layers` layers, each the op between the GEMMs around it in its model
// (layer_kda.cc, layer_mhc.cc), every layer with its own weights, states and caches (they
// come from HBM, as in a decode step, while the GEMMs stream their weights through L2).
// The op's cost = (the chain's time - the chain's time without the op) per layer. In the
// op's place the chain also times one trivial kernel (a launch's cost there) and an in-place
// copy of the op's bytes (the floor an engine can see there). The GEMMs are cuBLAS
// ("producer": "cublas": no early release) or release_gemm ("early_release": its CTAs release
// their dependents at entry); the op runs with its default arguments (no PDL) and with PDL.
#include "layer_context.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace fusedstep::bench {
namespace layer {

const char* producer_name(Producer p) { return p == Producer::kCublas ? "cublas" : "early_release"; }

Result cuda_result(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Result::success();
  return Result::error(Status::kCudaError, "%s: %s", what, cudaGetErrorName(err));
}

Result Gemms::run(Producer producer, const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b, int64_t ldb,
                  __nv_bfloat16* c, int64_t ldc, int m, int n, int k, cudaStream_t s) const {
  if (producer == Producer::kCublas) return blas_gemm(blas, a, lda, b, ldb, c, ldc, m, n, k, s);
  return cuda_result(release_gemm(a, lda, b, ldb, c, ldc, m, n, k, sm_count, scratch, s), "release_gemm");
}

void size_scratch(std::initializer_list<std::array<int64_t, 3>> shapes, int sm_count, int64_t* floats,
                  int64_t* counters) {
  *floats = *counters = 0;
  for (const auto& s : shapes) {
    const int m = static_cast<int>(s[0]), n = static_cast<int>(s[1]), k = static_cast<int>(s[2]);
    *floats = std::max(*floats, release_gemm_partial_floats(m, n, k, sm_count));
    *counters = std::max(*counters, release_gemm_counters(m, n, k, sm_count));
  }
}

namespace {
float bf16_value(uint16_t bits) {
  const uint32_t word = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &word, 4);
  return f;
}

std::string us_text(double us) {
  char buf[32] = "-";
  if (std::isfinite(us)) std::snprintf(buf, sizeof buf, "%.2f", us);
  return buf;
}
}  // namespace

bool producer_runs(Producer producer, bool release_ok, const char* op, const char* shape, const std::string& note) {
  if (producer != Producer::kEarlyRelease || release_ok) return true;
  std::printf("%-13s %-16s %-14s: not run (the GEMM check failed: %s)\n", op, shape, producer_name(producer),
              note.c_str());
  return false;
}

bool check_layer_zero(Context& ctx, const std::function<Result(Producer, int)>& gemm_in, bool release_ok,
                      const std::function<Result(const LaunchOptions&)>& fused,
                      const std::function<Result()>& composed, const std::function<bool(bool* cuda_fine)>& compare,
                      LayerRow* base) {
  const cudaStream_t s = ctx.stream;
  LaunchOptions pdl_on;
  pdl_on.pdl = true;
  pdl_on.device = &ctx.device;
  Result ran = gemm_in(release_ok ? Producer::kEarlyRelease : Producer::kCublas, 0);
  if (ran.ok()) ran = fused(pdl_on);
  if (ran.ok() && cuda_ok(ctx, cudaStreamSynchronize(s), "exactness run", &base->note)) {
    ran = composed();
    if (ran.ok() && cuda_ok(ctx, cudaStreamSynchronize(s), "composed exactness run", &base->note)) {
      bool cuda_fine = true;
      const bool same = compare(&cuda_fine);
      if (cuda_fine) {
        base->exact = same ? Exact::kYes : Exact::kNo;
      } else {
        cuda_ok(ctx, cudaGetLastError(), "exactness download", &base->note);
      }
    }
  }
  if (!ran.ok()) {
    base->note += (base->note.empty() ? "" : "; ") + not_run("exactness run", ran);
    return false;
  }
  return !ctx.cuda_broken;
}

// Two summation orders, so every element must agree to 2^-6 of its size plus
// 2^-8 of the RMS (about one BF16 rounding); a wrong kernel is off by about the values.
bool release_gemm_agrees(Context& ctx, const Gemms& g, const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b,
                         int64_t ldb, int m, int n, int k, __nv_bfloat16* out_a, __nv_bfloat16* out_b,
                         std::string* note) {
  Result r = g.run(Producer::kCublas, a, lda, b, ldb, out_a, n, m, n, k, ctx.stream);
  if (r.ok()) r = g.run(Producer::kEarlyRelease, a, lda, b, ldb, out_b, n, m, n, k, ctx.stream);
  if (!r.ok()) {
    *note += (note->empty() ? "" : "; ") + describe(r);
    ++ctx.failures;
    return false;
  }
  if (!cuda_ok(ctx, cudaStreamSynchronize(ctx.stream), "GEMM check", note)) return false;
  const size_t count = size_t(m) * n;
  std::vector<uint16_t> ha(count), hb(count);
  if (!cuda_ok(ctx, cudaMemcpy(ha.data(), out_a, count * 2, cudaMemcpyDeviceToHost), "GEMM check download", note) ||
      !cuda_ok(ctx, cudaMemcpy(hb.data(), out_b, count * 2, cudaMemcpyDeviceToHost), "GEMM check download", note)) {
    return false;
  }
  double sum_sq = 0.0;
  for (uint16_t v : ha) sum_sq += double(bf16_value(v)) * bf16_value(v);
  const double rms = std::sqrt(sum_sq / std::max<size_t>(count, 1));
  size_t bad = 0;
  double worst = 0.0;
  for (size_t i = 0; i < count; ++i) {
    const double x = bf16_value(ha[i]), y = bf16_value(hb[i]);
    const double d = std::isfinite(y) ? std::fabs(x - y) : INFINITY;
    worst = std::max(worst, d);
    bad += d > std::ldexp(std::fabs(x), -6) + std::ldexp(rms, -8);
  }
  if (bad == 0 && rms > 0.0) return true;
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "early_release GEMM %dx%dx%d: %zu of %zu elements differ from cuBLAS (largest %.3g, RMS %.3g)", m, n,
                k, bad, count, worst, rms);
  *note += (note->empty() ? "" : "; ") + std::string(buf);
  ++ctx.failures;
  return false;
}

// ---- rows
void print_layer_header(const std::string& title) {
  std::printf("\n%s\n", title.c_str());
  std::printf("%-13s %-16s %-14s %4s %9s %9s %10s %8s %9s %7s  %s\n", "op", "shape", "producer", "pdl", "gemms_us",
              "op_us", "trivial_us", "copy_us", "floor_us", "%copy", "exact");
}

void emit_layer_row(Context& ctx, const Options& options, const LayerRow& r, JsonObject o) {
  const bool peer = r.impl != "fusedstep";
  const double cost = (peer ? r.peer_fb_chain : r.op_chain) - r.gemms_chain;
  const double trivial = r.trivial_chain - r.gemms_chain, copy = r.copy_chain - r.gemms_chain;
  const double floor_us = ctx.copy_gbps > 0 ? r.bytes / (ctx.copy_gbps * 1e3) : NAN;
  const double pct = 100.0 * floor_us / cost;
  char pct_text[32] = "-";
  if (std::isfinite(pct)) std::snprintf(pct_text, sizeof pct_text, "%.1f%%", pct);
  std::string note = r.note;
  if (peer) note = "vllm_cuda_kda + its F_B GEMM; the kernel alone " + us_text(r.peer_chain - r.gemms_chain) + " us" +
                   (note.empty() ? "" : "; " + note);
  const char* exact = r.exact == Exact::kYes ? "yes" : r.exact == Exact::kNo ? "NO" : "-";
  std::printf("%-13s %-16s %-14s %4s %9s %9s %10s %8s %9.2f %7s  %s%s%s\n", peer ? "vllm_cuda_kda" : r.op.c_str(),
              r.shape.c_str(), producer_name(r.producer), r.pdl ? "1" : "0", us_text(r.gemms_chain).c_str(),
              us_text(cost).c_str(), us_text(trivial).c_str(), us_text(copy).c_str(), floor_us, pct_text, exact,
              note.empty() ? "" : "  ", note.c_str());
  std::fflush(stdout);
  if (!peer) {
    if (r.exact == Exact::kNo) ++ctx.failures;
    if (r.exact == Exact::kYes) ++ctx.rows_exact;
    ++(std::isfinite(cost) ? ctx.rows_measured : ctx.rows_not_run);
  }
  if (ctx.json == nullptr || !std::isfinite(cost)) return;
  o.add("context", "layer").add("layers", options.layers).add("producer", producer_name(r.producer))
      .add("pdl", r.pdl).add("impl", r.impl).add("schedule", r.schedule);
  if (peer) {
    o.add("peer_us", r.peer_chain - r.gemms_chain).add("peer_with_fb_us", cost).add("chain_us", r.peer_fb_chain);
  } else {
    o.add("fused_us", cost).add("chain_us", r.op_chain).add("trivial_us", trivial).add("copy_floor_us", copy);
  }
  o.add("gemm_chain_us", r.gemms_chain).add("bytes", r.bytes).add("floor_us", floor_us).add("copy_gbps", ctx.copy_gbps)
      .add("pct_copy_bw", pct);
  if (!peer) {
    if (r.exact == Exact::kUnknown) {
      o.add_null("exact");
    } else {
      o.add("exact", r.exact == Exact::kYes);
    }
  }
  if (!r.note.empty()) o.add("note", r.note);
  o.add("iters", options.iters).add("gpu", ctx.gpu_name).add("commit", ctx.commit).add("date", ctx.date)
      .add("seed", static_cast<int64_t>(ctx.seed));
  ctx.json->write(o);
}

double time_chain(Context& ctx, const Options& options, const std::function<Result(int)>& layer, std::string* note) {
  if (ctx.cuda_broken) return NAN;
  const Timing t = time_graph(ctx.stream, options.layers, options.iters, layer);
  if (t.ok) return t.us_per_launch;
  *note += (note->empty() ? "" : "; ") + t.error;
  if (cuda_ok(ctx, cudaGetLastError(), "layer chain", nullptr)) ++ctx.failures;
  return NAN;
}

double time_chains(Context& ctx, const Options& options, const Chain& c, Producer producer, LayerRow base,
                   const JsonObject& fields) {
  const cudaStream_t s = ctx.stream;
  auto around = [&](const std::function<Result(int)>& middle) {
    return [&, middle](int i) {
      Result r = c.gemm_in(producer, i);
      if (r.ok()) r = middle(i);
      if (r.ok()) r = c.gemm_out(producer, i);
      return r;
    };
  };
  base.producer = producer;
  base.gemms_chain = time_chain(ctx, options, around([](int) { return Result::success(); }), &base.note);
  for (bool pdl : {false, true}) {
    LayerRow row = base;
    row.pdl = pdl;
    row.op_chain = time_chain(ctx, options, around([&](int i) { return c.op(i, pdl); }), &row.note);
    row.trivial_chain = time_chain(
        ctx, options, around([&](int) { return cuda_result(launch_trivial(c.flag, pdl, s), "trivial kernel"); }),
        &row.note);
    auto copy = [&](int i) {
      return cuda_result(launch_inplace_copy(c.copy[i], c.copy_bytes, pdl, ctx.device.sm_count, s), "copy kernel");
    };
    row.copy_chain = time_chain(ctx, options, around(copy), &row.note);
    emit_layer_row(ctx, options, row, fields);
  }
  return base.gemms_chain;
}

}  // namespace layer

void run_layer_context(Context& ctx, const Options& options) {
  using namespace layer;
  std::string error;
  Gemms gemms;
  gemms.blas = shared_blas(&error);
  gemms.sm_count = ctx.device.sm_count;
  const cudaError_t setup = gemms.blas != nullptr ? release_gemm_setup() : cudaSuccess;
  if (gemms.blas == nullptr || setup != cudaSuccess) {
    std::printf("layer context: not run (%s)\n", gemms.blas == nullptr ? error.c_str() : cudaGetErrorName(setup));
    ++ctx.failures;
    return;
  }
  std::printf("\nlayer context: %d layers to a CUDA graph, each the op between the GEMMs around it; us per layer, "
              "median of %d replays;\nop / trivial / copy = the chain with the op / one trivial kernel / an in-place "
              "copy of the op's bytes in its place, minus the GEMMs alone\n",
              options.layers, options.iters);
  const int measured_before = ctx.rows_measured, not_run_before = ctx.rows_not_run;
  if (options.run_mhc) {
    std::vector<int64_t> hiddens = options.hidden.empty() ? std::vector<int64_t>{5120} : options.hidden;
    std::vector<int64_t> tokens = options.tokens;
    if (tokens.empty()) tokens = options.quick ? std::vector<int64_t>{1, 64} : std::vector<int64_t>{1, 64, 256, 1024};
    print_layer_header("mhc_boundary between [T, 2048] x [2048, H] and [T, H] x [H, 2048] (DeepSeek-V4.1 seam)");
    uint64_t seed = ctx.seed * 6151 + 41;
    for (int64_t hidden : hiddens) {
      for (int64_t t : tokens) {
        if (ctx.cuda_broken) break;
        run_mhc_shape(ctx, options, gemms, hidden, t, seed);
        seed += 1000003;
      }
    }
  }
  if (options.run_kda && !ctx.cuda_broken) {
    std::vector<int64_t> heads = options.heads, batches = options.batch;
    if (heads.empty()) heads = options.quick ? std::vector<int64_t>{12} : std::vector<int64_t>{12, 24};
    if (batches.empty()) {
      batches = options.quick ? std::vector<int64_t>{1, 64} : std::vector<int64_t>{1, 8, 16, 64, 128, 256};
    }
    if (std::any_of(options.q.begin(), options.q.end(), [](int64_t q) { return q != 1; })) {
      std::printf("layer context: KDA runs q = 1 only (--q ignored)\n");
    }
    // The state dtypes of --state-dtype, each shape with each; by default FP32 only.
    const std::vector<DType> dtypes =
        options.kda_state_dtypes.empty() ? std::vector<DType>{DType::kFp32} : options.kda_state_dtypes;
    print_layer_header("kda_decode q = 1 between in_proj [B, 7168] x [7168, 4 dim + 128 + heads, padded to 16] and "
                       "o_proj [B, dim] x [dim, 7168] (Kimi K3; the shape names the recurrent state's dtype)");
    uint64_t seed = ctx.seed * 7717 + 53;
    for (int64_t h : heads) {
      for (int64_t b : batches) {
        for (DType d : dtypes) {
          if (ctx.cuda_broken) break;
          run_kda_shape(ctx, options, gemms, static_cast<int>(h), static_cast<int>(b), d, seed);
          for (const KdaSchedule& k : options.kda_schedules) {  // --schedules: each in the same chain
            if (!ctx.cuda_broken) run_kda_shape(ctx, options, gemms, static_cast<int>(h), static_cast<int>(b), d, seed, &k);
          }
          seed += 1000003;
        }
      }
    }
  }
  if (ctx.cuda_broken) std::printf("(a CUDA error poisoned the context: remaining rows skipped)\n");
  print_op_status(ctx, "layer context", measured_before, not_run_before);
}


}  // namespace fusedstep::bench
