// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench: runs each fused operation at its model's default shapes, checks
// it bit for bit against its composed reference path and times both, against the
// measured copy bandwidth. Without a GPU it runs the CPU reference self-check only.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "bench.h"
#include "device_util.h"
#include "kda_peer.h"

#ifndef FUSEDSTEP_BENCH_COMMIT
#define FUSEDSTEP_BENCH_COMMIT "unknown"
#endif

namespace fusedstep::bench {
namespace {

constexpr size_t kCopyBytes = size_t{4} << 30;  // far beyond L2, HBM-bound (1 GiB where 4 do not fit)

void usage(const char* argv0) {
  std::printf(
      "usage: %s [options]\n"
      "  --op mhc|kda|all          operations to run (default all)\n"
      "  --hidden LIST             mHC hidden sizes (default 4096,5120,7168)\n"
      "  --tokens LIST             mHC token counts (default 1..256 by powers of 2, the\n"
      "                            largest single-wave count, 2048)\n"
      "  --heads LIST              KDA local heads (default 12,24)\n"
      "  --batch LIST              KDA batch sizes (default 1..256 by powers of 2)\n"
      "  --q LIST                  KDA tokens per request (default 1; 2,4,8 at 12 heads)\n"
      "  --iters N                 timed graph replays per measurement (default 50, median)\n"
      "  --sweep-schedules         also time every KDA schedule check() accepts \n"
      "  --schedules NAMES         also time these KDA schedules, e.g. c1l16e2x,c2l16e1\n"
      "                            (c<cluster>l<lanes>e<early>[x]; --context layer: each\n"
      "                            as its own row of the KDA chain)\n"
      "  --records                 KDA q > 1 in RecoverSSM record mode (records, no state writes)\n"
      "  --kda-commit              KDA q > 1: also time the RecoverSSM commit of each verify's\n"
      "                            records, every token folded (implies --records)\n"
      "  --rounding tf32-rna|tf32-rne|fp32   mHC weight rounding (default tf32-rna)\n"
      "  --mhc-tile 0|8|16|24|32   mHC: tokens per cluster; 0 = plan's\n"
      "  --mhc-two-cta             mHC: plan as on a device without the one-CTA-per-SM\n"
      "                            configuration (compares the two at small T)\n"
      "  --mhc-wave-edge           mHC: also the largest single-wave token count and the\n"
      "                            count one past it, with --tokens or the defaults\n"
      "  --mhc-weight cold|hot     mHC: each buffer set its own weight (default), or all\n"
      "                            sharing set 0's (L2-resident: the weight fetch's share)\n"
      "  --conv-state-layout tap|channel     KDA conv state [slot,tap,ch] (default) or [slot,ch,tap]\n"
      "  --kda-activations cold|hot  KDA activations rotated with the buffer sets (default)\n"
      "                            or shared by them (L2-resident, as just written by the\n"
      "                            input projection); states and weights rotate either way\n"
      "  --kda-gate f_a|raw_g      KDA gate input: f_a projected by F_B in the kernel (default)\n"
      "                            or the caller's precomputed raw_g [rows, dim]\n"
      "  --state-dtype fp32|bf16|fp32,bf16  KDA recurrent state dtype(s), each shape with each\n"
      "                            (default fp32,bf16; the default full run measures its 24-head\n"
      "                            q = 1 rows with fp32 only, to stay within ~110 s on an H200;\n"
      "                            --context layer: fp32 only)\n"
      "  --kda-slots shuffled|in-order  KDA state slots: a random permutation (default) or\n"
      "                            request b's slots in order (neighbouring requests' states\n"
      "                            adjacent in memory)\n"
      "  --pdl 0|1                 fused launches with programmatic dependent launch (default 1)\n"
      "  --context bench|layer     back-to-back calls (default), or each op between the GEMMs\n"
      "                            around it in its model, --layers layers to a CUDA graph, with\n"
      "                            cuBLAS and an early-releasing GEMM, PDL off and on (KDA q = 1:\n"
      "                            --heads, --batch; mHC: --hidden, --tokens)\n"
      "  --layers N                layers a layer-context graph holds (default 16)\n"
      "  --kda-peer-lib PATH       vLLM's CUDA KDA kernel as a peer (KDA q = 1, FP32 state): the\n"
      "                            shared library its peer folder's peer.py builds, loaded at\n"
      "                            run time; without it the peer fields are absent\n"
      "  --seed N                  input seed (default: fresh per run, printed)\n"
      "  --json PATH               also write one JSON object per measured row\n"
      "  --quick                   a few shapes (smoke test)\n"
      "LIST is comma-separated, e.g. --batch 1,16,128.\n",
      argv0);
}

bool parse_list(const char* text, std::vector<int64_t>* out) {
  out->clear();
  const char* p = text;
  while (*p) {
    char* end = nullptr;
    const long long v = std::strtoll(p, &end, 10);
    if (end == p || v <= 0) return false;
    out->push_back(v);
    p = end;
    if (*p == ',') ++p;
    else if (*p) return false;
  }
  return !out->empty();
}

// `v` as one of the named `choices`; otherwise "<option> <v>: expected a, b or c" on
// stderr and false.
template <class T>
bool parse_choice(const std::string& option, const char* v,
                  std::initializer_list<std::pair<const char*, T>> choices, T* out) {
  if (v == nullptr) return false;  // value() said what is missing
  std::string expected;
  size_t i = 0;
  for (const auto& [name, value] : choices) {
    if (std::strcmp(v, name) == 0) {
      *out = value;
      return true;
    }
    expected += (i == 0 ? "" : (i + 1 == choices.size() ? " or " : ", ")) + std::string(name);
    ++i;
  }
  std::fprintf(stderr, "%s %s: expected %s\n", option.c_str(), v, expected.c_str());
  return false;
}

// Returns 0 to run, 1 on a usage error, 2 for --help.
int parse(int argc, char** argv, Options* o) {
  bool iters_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        return nullptr;
      }
      return argv[++i];
    };
    auto list = [&](std::vector<int64_t>* out) {
      const char* v = value();
      if (v && parse_list(v, out)) return true;
      std::fprintf(stderr, "%s: expected a comma-separated list of positive integers\n", arg.c_str());
      return false;
    };
    if (arg == "--help" || arg == "-h") return 2;
    if (arg == "--quick") {
      o->quick = true;
    } else if (arg == "--sweep-schedules") {
      o->sweep_schedules = true;
    } else if (arg == "--schedules") {
      const char* v = value();
      if (!v) return 1;
      o->kda_schedules.clear();
      const std::string text = v;
      for (size_t start = 0; start <= text.size();) {
        const size_t comma = std::min(text.find(',', start), text.size());
        KdaSchedule k;
        if (!parse_kda_schedule(text.substr(start, comma - start), &k)) {
          std::fprintf(stderr, "--schedules: '%s' is not a schedule name (e.g. c1l16e2x)\n",
                       text.substr(start, comma - start).c_str());
          return 1;
        }
        o->kda_schedules.push_back(k);
        start = comma + 1;
      }
    } else if (arg == "--records") {
      o->records = true;
    } else if (arg == "--kda-commit") {
      o->kda_commit = true;
      o->records = true;
    } else if (arg == "--op") {
      const char* v = value();
      if (!v) return 1;
      const std::string op = v;
      if (op != "mhc" && op != "kda" && op != "all") {
        std::fprintf(stderr, "--op %s: expected mhc, kda or all\n", v);
        return 1;
      }
      o->run_mhc = op != "kda";
      o->run_kda = op != "mhc";
    } else if (arg == "--hidden") {
      if (!list(&o->hidden)) return 1;
    } else if (arg == "--tokens") {
      if (!list(&o->tokens)) return 1;
    } else if (arg == "--heads") {
      if (!list(&o->heads)) return 1;
    } else if (arg == "--batch") {
      if (!list(&o->batch)) return 1;
    } else if (arg == "--q") {
      if (!list(&o->q)) return 1;
    } else if (arg == "--iters") {
      const char* v = value();
      if (!v || std::atoi(v) < 1) {
        std::fprintf(stderr, "--iters: expected a positive integer\n");
        return 1;
      }
      o->iters = std::atoi(v);
      iters_given = true;
    } else if (arg == "--seed") {
      const char* v = value();
      if (!v) return 1;
      o->seed = std::strtoull(v, nullptr, 10);
    } else if (arg == "--json") {
      const char* v = value();
      if (!v) return 1;
      o->json_path = v;
    } else if (arg == "--context") {
      if (!parse_choice(arg, value(), {{"bench", false}, {"layer", true}}, &o->layer_context)) return 1;
    } else if (arg == "--layers") {
      const char* v = value();
      if (!v || std::atoi(v) < 1) {
        std::fprintf(stderr, "--layers: expected a positive integer\n");
        return 1;
      }
      o->layers = std::atoi(v);
    } else if (arg == "--kda-peer-lib") {
      const char* v = value();
      if (!v) return 1;
      o->kda_peer_lib = v;
    } else if (arg == "--pdl") {
      if (!parse_choice(arg, value(), {{"0", false}, {"1", true}}, &o->pdl)) return 1;
    } else if (arg == "--mhc-two-cta") {
      o->mhc_two_cta = true;
    } else if (arg == "--mhc-wave-edge") {
      o->mhc_wave_edge = true;
    } else if (arg == "--mhc-tile") {
      if (!parse_choice(arg, value(), {{"0", 0}, {"8", 8}, {"16", 16}, {"24", 24}, {"32", 32}}, &o->mhc_tile)) {
        return 1;
      }
    } else if (arg == "--rounding") {
      if (!parse_choice(arg, value(),
                        {{"tf32-rna", WeightRounding::kTf32Rna},
                         {"tf32-rne", WeightRounding::kTf32Rne},
                         {"fp32", WeightRounding::kFp32}},
                        &o->rounding)) {
        return 1;
      }
    } else if (arg == "--conv-state-layout") {
      if (!parse_choice(arg, value(), {{"tap", false}, {"channel", true}}, &o->conv_state_channel_major)) return 1;
    } else if (arg == "--state-dtype") {
      const char* v = value();
      if (!v) return 1;
      o->kda_state_dtypes.clear();
      const std::string text = v;
      for (size_t start = 0; start <= text.size();) {
        const size_t comma = std::min(text.find(',', start), text.size());
        DType d = DType::kFp32;
        if (!parse_choice(arg, text.substr(start, comma - start).c_str(),
                          {{"fp32", DType::kFp32}, {"bf16", DType::kBf16}}, &d)) {
          return 1;
        }
        if (std::find(o->kda_state_dtypes.begin(), o->kda_state_dtypes.end(), d) == o->kda_state_dtypes.end()) {
          o->kda_state_dtypes.push_back(d);
        }
        start = comma + 1;
      }
    } else if (arg == "--kda-slots") {
      if (!parse_choice(arg, value(), {{"shuffled", false}, {"in-order", true}}, &o->kda_slots_in_order)) return 1;
    } else if (arg == "--kda-gate") {
      if (!parse_choice(arg, value(), {{"f_a", false}, {"raw_g", true}}, &o->kda_raw_gate)) return 1;
    } else if (arg == "--mhc-weight") {
      if (!parse_choice(arg, value(), {{"cold", false}, {"hot", true}}, &o->mhc_hot_weight)) return 1;
    } else if (arg == "--kda-activations") {
      if (!parse_choice(arg, value(), {{"cold", false}, {"hot", true}}, &o->kda_hot_activations)) return 1;
    } else {
      std::fprintf(stderr, "unknown option %s (see --help)\n", arg.c_str());
      return 1;
    }
  }
  if (o->quick && !iters_given) o->iters = 20;
  return 0;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

int run(int argc, char** argv) {
  const auto started = std::chrono::steady_clock::now();
  Options options;
  const int parsed = parse(argc, argv, &options);
  if (parsed == 2) {
    usage(argv[0]);
    return 0;
  }
  if (parsed != 0) return 1;

  Context ctx;
  const char* env_commit = std::getenv("FUSEDSTEP_COMMIT");
  ctx.commit = env_commit && *env_commit ? env_commit : FUSEDSTEP_BENCH_COMMIT;
  ctx.date = utc_now();
  ctx.seed = options.seed != 0
                 ? options.seed
                 : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) | 1;
  std::printf("fusedstep-bench  commit %s  date %s  seed %llu\n", ctx.commit.c_str(), ctx.date.c_str(),
              static_cast<unsigned long long>(ctx.seed));

  // Opened first: a run without a GPU still leaves an (empty) file behind.
  JsonLines json;
  if (!options.json_path.empty()) {
    if (!json.open(options.json_path)) {
      std::printf("cannot open %s for writing\n", options.json_path.c_str());
      return 1;
    }
    ctx.json = &json;
  }

  if (!options.kda_peer_lib.empty()) {  // a library that does not load leaves the peer out, the run goes on
    std::string why;
    if (load_kda_peer(options.kda_peer_lib, &why)) {
      std::printf("vllm_cuda_kda peer: loaded %s\n", options.kda_peer_lib.c_str());
    } else {
      std::printf("vllm_cuda_kda peer: not loaded (%s): the peer fields are absent\n", why.c_str());
    }
  }

  const bool reference_ok = run_reference_self_check(ctx.seed);

  int count = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&count);
  if (count_err != cudaSuccess || count == 0) {
    std::printf("no GPU found (%s): GPU measurements skipped\n",
                count_err != cudaSuccess ? cudaGetErrorString(count_err) : "no CUDA device");
    return reference_ok ? 0 : 1;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::printf("no GPU found (cudaGetDeviceProperties failed): GPU measurements skipped\n");
    return reference_ok ? 0 : 1;
  }
  ctx.gpu_name = prop.name;
  std::printf("GPU 0: %s, compute capability %d.%d, %d SMs, L2 %.0f MiB, %.1f GiB\n", prop.name,
              prop.major, prop.minor, prop.multiProcessorCount, prop.l2CacheSize / 1048576.0,
              prop.totalGlobalMem / 1073741824.0);
  if (prop.major < 9) {
    std::printf("fusedstep needs compute capability 9.0 or newer: GPU measurements skipped\n");
    return reference_ok ? 0 : 1;
  }
  cudaSetDevice(0);
  const Result info = get_device_info(0, &ctx.device);
  if (!info.ok()) {
    std::printf("get_device_info failed: %s\n", describe(info).c_str());
    return 1;
  }
  std::printf("device info: %d SMs, cluster launch %s, mHC clusters per wave %d (one CTA per SM: %d)\n",
              ctx.device.sm_count, ctx.device.cluster_launch ? "yes" : "no",
              ctx.device.mhc_clusters_per_wave, ctx.device.mhc_one_cta_clusters_per_wave);
  if (cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking) != cudaSuccess) {
    std::printf("cudaStreamCreate failed\n");
    return 1;
  }

  std::string error;
  size_t copied = 0;
  ctx.copy_gbps = measure_copy_bandwidth(kCopyBytes, options.quick ? 5 : 20, ctx.stream, &copied, &error);
  if (ctx.copy_gbps > 0) {
    std::printf("copy bandwidth: %.0f GB/s (best copy above, %zu MiB read + as many written, median)\n",
                ctx.copy_gbps, copied >> 20);
  } else {
    std::printf("copy bandwidth: not measured (%s)\n", error.c_str());
    ++ctx.failures;
  }

  std::printf("times: CUDA-graph replays over rotated buffer sets (~4x L2), median of %d, per launch;\n"
              "floor = bytes / copy bandwidth; exact = every output byte equals the composed path\n",
              options.iters);
  if (options.layer_context) {
    run_layer_context(ctx, options);
  } else {
    if (options.run_mhc) run_mhc(ctx, options);
    if (options.run_kda) run_kda(ctx, options);
  }

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf("\nsummary: %d rows measured, %d exact, %d not run (not built yet / rejected), "
              "%d failures%s, CPU reference self-check %s, %.0f s\n",
              ctx.rows_measured, ctx.rows_exact, ctx.rows_not_run, ctx.failures,
              ctx.cuda_broken ? " (a CUDA error stopped the run)" : "", reference_ok ? "ok" : "FAILED", seconds);
  cudaStreamDestroy(ctx.stream);
  return ctx.failures == 0 && reference_ok ? 0 : 1;
}

}  // namespace
}  // namespace fusedstep::bench

int main(int argc, char** argv) { return fusedstep::bench::run(argc, argv); }
