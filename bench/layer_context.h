// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench --context layer: what the op chains share (layer_context.cc), used by the
// KDA chain (layer_kda.cc) and the mHC chain (layer_mhc.cc).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "bench.h"
#include "blas.h"
#include "device_util.h"
#include "layer_kernels.h"
#include "report.h"

namespace fusedstep::bench::layer {

constexpr int64_t kKdaModel = 7168;  // K3's hidden size
constexpr int64_t kMhcInner = 2048;  // the sublayer's width on one GPU on each side of an mHC seam

enum class Producer { kCublas, kEarlyRelease };
const char* producer_name(Producer p);

// DeviceArena's interface, counting: one carve function first sizes the arena, then fills it.
struct Sizer {
  int64_t bytes = 0;
  template <class T>
  T* take(int64_t count) {
    bytes += DeviceArena::round_up(count * sizeof(T));
    return nullptr;
  }
};

Result cuda_result(cudaError_t err, const char* what);

// The GEMMs of a chain (one scratch: they run one after another).
struct Gemms {
  Blas* blas = nullptr;
  GemmScratch scratch;
  int sm_count = 0;
  Result run(Producer producer, const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b, int64_t ldb,
             __nv_bfloat16* c, int64_t ldc, int m, int n, int k, cudaStream_t s) const;
};

// Split-K scratch for a chain's GEMM shapes {m, n, k}.
void size_scratch(std::initializer_list<std::array<int64_t, 3>> shapes, int sm_count, int64_t* floats,
                  int64_t* counters);

// The early-release GEMM against cuBLAS on the same operands (`out_a`, `out_b`: [m, n]
// scratch); false, with the reason in `note` (a failure counted), when they disagree.
bool release_gemm_agrees(Context& ctx, const Gemms& g, const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b,
                         int64_t ldb, int m, int n, int k, __nv_bfloat16* out_a, __nv_bfloat16* out_b,
                         std::string* note);

struct LayerRow;

// Layer 0 once, the op (`fused`, given PDL launch options) behind its input GEMM (the
// early-releasing one where `release_ok`, else cuBLAS), then the composed path on the same
// inputs (`composed`); base->exact from `compare` (whether every output buffer is equal;
// it clears *cuda_fine when a download fails). False, with the reason in base->note, when
// a launch failed or CUDA broke: the caller emits the row as it is.
bool check_layer_zero(Context& ctx, const std::function<Result(Producer, int)>& gemm_in, bool release_ok,
                      const std::function<Result(const LaunchOptions&)>& fused,
                      const std::function<Result()>& composed, const std::function<bool(bool* cuda_fine)>& compare,
                      LayerRow* base);

struct LayerRow {
  std::string op, shape, schedule, impl = "fusedstep";
  Producer producer = Producer::kCublas;
  bool pdl = false;
  int64_t bytes = 0;
  // us per layer of the chains: the GEMMs alone, with the op, the trivial kernel, the copy;
  // the peer's with its F_B GEMM and alone.
  double gemms_chain = NAN, op_chain = NAN, trivial_chain = NAN, copy_chain = NAN, peer_fb_chain = NAN,
         peer_chain = NAN;
  Exact exact = Exact::kUnknown;
  std::string note;
};

void print_layer_header(const std::string& title);
// Prints the row and, when its cost was measured, writes its JSON line (`o` holds the
// op's shape fields). A fusedstep row counts as a measured row; a peer row does not.
void emit_layer_row(Context& ctx, const Options& options, const LayerRow& r, JsonObject o);
// us per layer of a chain; NaN (with the reason in `note`) when it cannot be timed.
double time_chain(Context& ctx, const Options& options, const std::function<Result(int)>& layer, std::string* note);

// The chains every op shares: the GEMMs alone, then for each PDL setting the op, the
// trivial kernel and the copy in its place. `gemm_in(i)` writes the op's inputs of layer
// i, `gemm_out(i)` reads its output; `op(i, pdl)` is the op of layer i.
struct Chain {
  std::function<Result(Producer, int)> gemm_in, gemm_out;
  std::function<Result(int, bool)> op;
  std::vector<void*> copy;  // per layer: the copy's region
  int64_t copy_bytes = 0;
  int* flag = nullptr;
};
// Chain::op for layer i's params (the op with PDL on or off, on ctx's stream).
template <class Params>
std::function<Result(int, bool)> op_of(Context& ctx, const std::vector<Params>& params) {
  return [&ctx, &params](int i, bool pdl) {
    LaunchOptions o;
    o.pdl = pdl;
    o.device = &ctx.device;
    return launch(params[i], o, ctx.stream);
  };
}
// Whether the chains run behind `producer`: the early-releasing GEMM only where it agreed
// with cuBLAS (otherwise a "not run" line with the reason in `note`).
bool producer_runs(Producer producer, bool release_ok, const char* op, const char* shape, const std::string& note);
// Times them for `producer` and emits a row per PDL setting; returns the GEMMs-alone
// chain's us per layer.
double time_chains(Context& ctx, const Options& options, const Chain& c, Producer producer, LayerRow base,
                   const JsonObject& fields);

// One shape of each op's chain (KDA: the plan's schedule, or `schedule` where given).
void run_kda_shape(Context& ctx, const Options& options, Gemms& gemms, int heads, int batch, DType state_dtype,
                   uint64_t seed, const KdaSchedule* schedule = nullptr);
void run_mhc_shape(Context& ctx, const Options& options, Gemms& gemms, int64_t hidden, int64_t tokens,
                   uint64_t seed);

}  // namespace fusedstep::bench::layer
