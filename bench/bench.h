// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench: shared declarations of the main program (options, the device
// context, result rows, the per-operation drivers).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fusedstep/fusedstep.h"
#include "json.h"

namespace fusedstep::bench {

struct Options {
  bool run_mhc = true;
  bool run_kda = true;
  bool quick = false;
  bool sweep_schedules = false;
  // KDA: also time these schedules (names as kda_schedule_name prints them) after the default.
  std::vector<KdaSchedule> kda_schedules;
  bool pdl = true;          // fused launches as a serving engine issues them
  int iters = 50;           // timed graph replays per measurement (median taken)
  uint64_t seed = 0;        // 0 = fresh per run (printed)
  std::string json_path;    // JSON lines output; empty = none
  WeightRounding rounding = WeightRounding::kTf32Rna;
  bool conv_state_channel_major = false;  // KDA conv state [slot, channel, tap] instead of [slot, tap, channel]
  // KDA: every buffer set reads set 0's activations (x, f_a, raw_beta, output gate), so
  // they stay L2-resident as when the input projection has just written them; states,
  // conv states and weights still rotate.
  bool kda_hot_activations = false;
  bool kda_raw_gate = false;  // KDA: the caller's raw_g instead of f_a and F_B (--kda-gate raw_g)
  bool kda_slots_in_order = false;  // KDA: request b's slots in order, not a permutation (--kda-slots)
  // KDA recurrent state dtypes, each shape measured with each (--state-dtype); empty = the
  // default: FP32 and BF16 (the default full run's 24-head rows FP32 only).
  std::vector<DType> kda_state_dtypes;
  bool records = false;     // KDA q > 1 in RecoverSSM record mode (records written, no state)
  bool kda_commit = false;  // KDA q > 1: also time the RecoverSSM commit of the records (implies records)
  bool mhc_two_cta = false; // mHC: plan without the one-CTA-per-SM configuration
  bool mhc_wave_edge = false;  // mHC: also the largest single-wave token count and one more
  // mHC: every buffer set reads set 0's mixer and norm weights (--mhc-weight hot: L2-resident,
  // to measure the weight fetch's share of a call); activations still rotate.
  bool mhc_hot_weight = false;
  int mhc_tile = 0;                                                // mHC: --mhc-tile (0 = plan's)
  // --context layer: each op between the GEMMs around it in its model, `layers` layers to a
  // CUDA graph (layer_context.cc), instead of back-to-back calls ("bench").
  bool layer_context = false;
  int layers = 16;
  // vLLM's CUDA KDA kernel as a peer: the shared library its peer folder builds (kda_peer.h);
  // empty = no peer.
  std::string kda_peer_lib;
  // Explicit shape lists; empty = the default shape lists (or --quick's).
  std::vector<int64_t> hidden, tokens, heads, batch, q;
};

// What every measurement of the run shares.
struct Context {
  DeviceInfo device;
  std::string gpu_name;
  double copy_gbps = 0.0;   // measured copy bandwidth, bytes read + written per second / 1e9
  cudaStream_t stream = nullptr;
  std::string commit;
  std::string date;         // UTC, ISO 8601
  uint64_t seed = 0;
  int failures = 0;         // exactness mismatches and bench-side errors
  int rows_measured = 0;    // rows with a fused time
  int rows_exact = 0;       // rows whose fused outputs equal the composed ones
  int rows_not_run = 0;     // rows the library could not run (not built yet, rejected)
  bool cuda_broken = false; // a sticky CUDA error: stop measuring
  JsonLines* json = nullptr;
};

// Drivers: each prints its table and appends JSON lines; failures of the library
// (not built yet, rejected) are printed and skipped, never timed.
void run_mhc(Context& ctx, const Options& options);
void run_kda(Context& ctx, const Options& options);
void run_layer_context(Context& ctx, const Options& options);  // --context layer, both ops

// Bytes a call must move, as the rows count them (docs/benchmarks.md, "Byte floor").
int64_t kda_call_bytes(int heads, int batch, int q, bool raw_gate, DType state_dtype);
int64_t mhc_call_bytes(int64_t hidden, int64_t tokens, WeightRounding rounding);

// KDA schedule names: c<cluster>l<lanes>e<early>, then x (evict-first), m<n> (minimum
// CTAs per SM), r<n> (requests per cluster), e.g. c1l16e2x, c4l16e2xm4. parse returns
// false on anything else.
std::string kda_schedule_name(const KdaSchedule& k);
bool parse_kda_schedule(const std::string& name, KdaSchedule* out);

// Copy bandwidth over `bytes` of source (as many written; less where that does not fit,
// down to 1 GiB: the size used in *copied_bytes): GB/s of bytes read plus written, the
// best median of `iters` launches of each copy; <= 0 with `error` set on failure.
double measure_copy_bandwidth(size_t bytes, int iters, cudaStream_t stream, size_t* copied_bytes,
                              std::string* error);

// CPU reference self-check: a tiny problem per operation through the float32 and
// float64 modes; prints one line per operation. Returns false when a check ran and failed.
bool run_reference_self_check(uint64_t seed);

}  // namespace fusedstep::bench
