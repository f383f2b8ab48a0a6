// SPDX-License-Identifier: Apache-2.0
// fusedstep._C: the nanobind binding of the C++ API (include/fusedstep/) and of the CPU
// reference (reference/include/fusedstep_reference/). Torch-free: tensors arrive through
// DLPack as nb::ndarray (torch, numpy, cupy, ...). This layer only
//   - checks each tensor's dtype, rank, shape and innermost strides against what the
//     params struct can describe, and raises ValueError naming the tensor, its shape,
//     dtype, strides and device and what was expected;
//   - fills the params struct (strides in elements, as the C++ API takes them);
//   - runs check() (MODE_CHECK, with a hand-made H200 DeviceInfo, no GPU needed),
//     launch() (MODE_LAUNCH) or composed::launch() (MODE_COMPOSED) on the caller's stream,
//     or plan() (MODE_PLAN for the tensors' device, MODE_PLAN_H200 for the hand-made H200
//     DeviceInfo) and returns the schedule as a dict;
//   - maps a failed Result to an exception: ValueError for bad arguments (kNullPointer,
//     kMisaligned, kInvalidShape, kInvalidStride, kInvalidValue), NotImplementedError for
//     kUnsupported, RuntimeError for kDeviceUnsupported and kCudaError.
// BF16 tensors may also be given as uint16 bit patterns (numpy has no bfloat16).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "fusedstep/build_info.h"
#include "fusedstep/fusedstep.h"
#include "fusedstep_reference/kda_decode.h"
#include "fusedstep_reference/mhc_boundary.h"

namespace nb = nanobind;
using Array = nb::ndarray<>;
using OptArray = std::optional<nb::ndarray<>>;

namespace {

constexpr int kModeLaunch = 0;
constexpr int kModeComposed = 1;
constexpr int kModeCheck = 2;
constexpr int kModeWorkspace = 3;  // return composed::workspace_bytes, run nothing
constexpr int kModePlan = 4;       // return plan() for the tensors' device as a dict, run nothing
constexpr int kModePlanH200 = 5;   // the same for the hand-made H200 DeviceInfo (no GPU needed)

// The fields of the plan structs (include/fusedstep/*.h) that MODE_PLAN returns, each
// as a dict entry of its own name. A field added to or removed from a struct is one
// entry here.
#define FS_MHC_PLAN_FIELDS(X) X(tile) X(clusters) X(waves) X(ctas_per_sm)
#define FS_KDA_PLAN_FIELDS(X) X(ctas) X(waves)
#define FS_KDA_SCHEDULE_FIELDS(X) \
  X(cluster) X(lanes_per_row) X(early) X(evict_first)

// ---------------------------------------------------------------- descriptions
enum class Dt { kBf16, kF32, kF64, kI32, kU32W /* int32 or uint32 words */, kAny };

bool is_dtype(const Array& a, nb::dlpack::dtype_code code, int bits) {
  const nb::dlpack::dtype d = a.dtype();
  return d.code == uint8_t(code) && d.bits == bits && d.lanes == 1;
}
bool is_bf16(const Array& a) {
  return is_dtype(a, nb::dlpack::dtype_code::Bfloat, 16) ||
         is_dtype(a, nb::dlpack::dtype_code::UInt, 16);
}
bool is_f32(const Array& a) { return is_dtype(a, nb::dlpack::dtype_code::Float, 32); }
bool is_f64(const Array& a) { return is_dtype(a, nb::dlpack::dtype_code::Float, 64); }
bool is_i32(const Array& a) { return is_dtype(a, nb::dlpack::dtype_code::Int, 32); }
bool is_words(const Array& a) {
  return is_i32(a) || is_dtype(a, nb::dlpack::dtype_code::UInt, 32);
}

std::string dtype_name(const Array& a) {
  const nb::dlpack::dtype d = a.dtype();
  const char* kind = "?";
  switch (nb::dlpack::dtype_code(d.code)) {
    case nb::dlpack::dtype_code::Int: kind = "int"; break;
    case nb::dlpack::dtype_code::UInt: kind = "uint"; break;
    case nb::dlpack::dtype_code::Float: kind = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: kind = "bfloat"; break;
    case nb::dlpack::dtype_code::Bool: kind = "bool"; break;
    default: break;
  }
  std::string s = std::string(kind) + std::to_string(int(d.bits));
  if (d.lanes != 1) s += "x" + std::to_string(int(d.lanes));
  return s;
}

std::string tuple_string(const Array& a, bool strides) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) {
    if (i) s += ", ";
    s += std::to_string(strides ? a.stride(i) : a.shape(i));
  }
  if (a.ndim() == 1) s += ",";
  return s + ")";
}

std::string device_name(const Array& a) {
  switch (a.device_type()) {
    case nb::device::cpu::value: return "cpu";
    case nb::device::cuda::value: return "cuda:" + std::to_string(a.device_id());
    case nb::device::cuda_host::value: return "cuda_host";
    case nb::device::cuda_managed::value: return "cuda_managed:" + std::to_string(a.device_id());
    default: return "device type " + std::to_string(a.device_type());
  }
}

std::string describe(const char* name, const Array& a) {
  return std::string(name) + ": shape " + tuple_string(a, false) + ", dtype " + dtype_name(a) +
         ", strides " + tuple_string(a, true) + " (elements), device " + device_name(a);
}

[[noreturn]] void bad_tensor(const char* op, const char* name, const Array& a,
                             const std::string& expected) {
  throw nb::value_error(
      (std::string(op) + ": " + describe(name, a) + "; expected " + expected).c_str());
}

[[noreturn]] void raise_result(const fusedstep::Result& r, const std::string& context) {
  using fusedstep::Status;
  const std::string message = std::string(r.detail()) + " [" + fusedstep::status_name(r.status()) +
                              "]" + (context.empty() ? "" : "; " + context);
  switch (r.status()) {
    case Status::kNullPointer:
    case Status::kMisaligned:
    case Status::kInvalidShape:
    case Status::kInvalidStride:
    case Status::kInvalidValue:
      throw nb::value_error(message.c_str());
    case Status::kUnsupported:
      PyErr_SetString(PyExc_NotImplementedError, message.c_str());
      throw nb::python_error();
    default:
      throw std::runtime_error(message);
  }
}

// A named tensor of one call: described in error messages whose field it owns.
struct Named {
  const char* name;    // the Python argument
  const Array* array;
  const char* field;   // the params field it fills (null: the same name)
};

// Which tensor a C++ detail ("op: field = value ...") is about: the longest tensor
// name that starts the field (x_stride -> x, residual_out_stride -> residual_out).
std::string context_for(const char* detail, const std::vector<Named>& tensors) {
  const char* colon = std::strstr(detail, ": ");
  if (colon == nullptr) return "";
  const char* field = colon + 2;
  size_t field_len = std::strcspn(field, " ,.");
  const Named* best = nullptr;
  size_t best_len = 0;
  for (const Named& t : tensors) {
    if (t.array == nullptr) continue;
    const char* key = t.field ? t.field : t.name;
    const size_t n = std::strlen(key);
    if (n <= field_len && n > best_len && std::strncmp(field, key, n) == 0 &&
        (n == field_len || field[n] == '_')) {
      best = &t;
      best_len = n;
    }
  }
  return best ? describe(best->name, *best->array) : "";
}

// ---------------------------------------------------------------- per-call checks
struct Call {
  Call(const char* op_name, int call_mode) : op(op_name), mode(call_mode) {}
  const char* op;
  int mode;
  bool device_set = false;
  int device_type = 0;
  int device_id = -1;
  std::vector<Named> tensors;

  bool launching() const { return mode == kModeLaunch || mode == kModeComposed; }
  // Modes that need every tensor on one CUDA device: the launches and the device's plan.
  bool on_device() const { return launching() || mode == kModePlan; }

  // Device placement: every tensor of a launch lives on one CUDA device.
  void place(const char* name, const Array& a, const char* field = nullptr) {
    tensors.push_back({name, &a, field});
    if (!on_device()) return;
    if (a.device_type() != nb::device::cuda::value) {
      bad_tensor(op, name, a,
                 "a CUDA tensor (the kernels read device memory; fusedstep.reference computes "
                 "the operation on the CPU)");
    }
    if (!device_set) {
      device_set = true;
      device_type = a.device_type();
      device_id = a.device_id();
    } else if (a.device_id() != device_id) {
      bad_tensor(op, name, a, "a tensor on cuda:" + std::to_string(device_id) +
                                  " like the call's other tensors");
    }
  }

  void dtype(const char* name, const Array& a, Dt dt) {
    bool ok = false;
    const char* want = "";
    switch (dt) {
      case Dt::kBf16: ok = is_bf16(a); want = "dtype bfloat16 (or uint16 bit patterns)"; break;
      case Dt::kF32: ok = is_f32(a); want = "dtype float32"; break;
      case Dt::kF64: ok = is_f64(a); want = "dtype float64"; break;
      case Dt::kI32: ok = is_i32(a); want = "dtype int32"; break;
      case Dt::kU32W: ok = is_words(a); want = "dtype int32 or uint32 (prepared weight words)"; break;
      case Dt::kAny: ok = true; break;
    }
    if (!ok) bad_tensor(op, name, a, want);
  }

  // Rank and sizes (-1: any size). `what` names the sizes for the message.
  void shape(const char* name, const Array& a, std::initializer_list<int64_t> sizes,
             const std::string& what) {
    bool ok = a.ndim() == sizes.size();
    size_t i = 0;
    for (int64_t s : sizes) {
      if (ok && s >= 0 && int64_t(a.shape(i)) != s) ok = false;
      ++i;
    }
    if (!ok) bad_tensor(op, name, a, "shape " + what);
  }

  // Elements of dimensions [first, ndim) packed row-major (sizes of 1 ignore strides).
  void dense_from(const char* name, const Array& a, size_t first, const std::string& what) {
    int64_t expect = 1;
    for (size_t d = a.ndim(); d-- > first;) {
      if (a.shape(d) != 1 && a.stride(d) != expect) bad_tensor(op, name, a, what);
      expect *= int64_t(a.shape(d));
    }
  }
  void contiguous(const char* name, const Array& a) {
    dense_from(name, a, 0, "a contiguous tensor (row-major, no gaps)");
  }
  // Row stride of a 2-D view whose rows are contiguous; a single row has no stride.
  int64_t row_stride(const char* name, const Array& a) {
    if (a.ndim() >= 2 && a.shape(a.ndim() - 1) > 1 && a.stride(a.ndim() - 1) != 1) {
      bad_tensor(op, name, a, "unit stride in the last dimension (contiguous rows)");
    }
    if (a.shape(0) <= 1) return int64_t(a.shape(1));  // the kernel never steps past row 0
    return a.stride(0);
  }

  fusedstep::DeviceInfo device_info() const {
    if (mode == kModeCheck || mode == kModePlanH200) return fusedstep::hopper_device_info_for_tests();
    fusedstep::DeviceInfo info;
    const fusedstep::Result r = fusedstep::get_device_info(device_id, &info);
    if (!r) raise_result(r, "");
    return info;
  }

  void ensure_current_device() const {
    if (!launching()) return;
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != device_id) {
      throw std::runtime_error(std::string(op) + ": the tensors are on cuda:" +
                               std::to_string(device_id) + " but the current CUDA device is " +
                               std::to_string(current) +
                               " (call inside torch.cuda.device(...) of the tensors)");
    }
  }

  void raise_if(const fusedstep::Result& r) const {
    if (!r) raise_result(r, context_for(r.detail(), tensors));
  }
};

template <class T>
T* ptr(const Array& a) { return static_cast<T*>(a.data()); }
template <class T>
T* ptr(const OptArray& a) { return a ? static_cast<T*>(a->data()) : nullptr; }

cudaStream_t as_stream(uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

void* workspace_ptr(Call& call, const OptArray& workspace, int64_t bytes) {
  if (bytes <= 0) return nullptr;
  if (!workspace) {
    throw nb::value_error((std::string(call.op) + ": the composed path needs a workspace of " +
                           std::to_string(bytes) + " bytes")
                              .c_str());
  }
  call.place("workspace", *workspace);
  const int64_t have = int64_t(workspace->nbytes());
  if (have < bytes) {
    bad_tensor(call.op, "workspace", *workspace,
               "at least " + std::to_string(bytes) + " bytes, have " + std::to_string(have));
  }
  call.contiguous("workspace", *workspace);
  return workspace->data();
}

// ---------------------------------------------------------------- mHC boundary
// A plan struct as a dict (FS_*_PLAN_FIELDS).
nb::dict plan_dict(const fusedstep::MhcBoundaryPlan& plan) {
  nb::dict d;
#define FS_FIELD(name) d[#name] = plan.name;
  FS_MHC_PLAN_FIELDS(FS_FIELD)
#undef FS_FIELD
  return d;
}

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

template <class Params>
struct PlanOf;
template <>
struct PlanOf<fusedstep::MhcBoundaryParams> { using type = fusedstep::MhcBoundaryPlan; };
template <>
struct PlanOf<fusedstep::KdaDecodeParams> { using type = fusedstep::KdaDecodePlan; };

// The modes of the mHC and KDA entry points, once filled params exist: the composed
// path's workspace size, check only, the plan (a dict), the composed path, or the fused
// launch.
template <class Params>
nb::object run_mode(Call& c, const Params& p, int mode, uintptr_t stream, const OptArray& workspace, bool pdl) {
  if (mode == kModeWorkspace) return nb::int_(fusedstep::composed::workspace_bytes(p));
  if (mode < kModeLaunch || mode > kModePlanH200) {
    throw nb::value_error((std::string(c.op) + ": mode = " + std::to_string(mode) + " is not a mode").c_str());
  }
  const fusedstep::DeviceInfo info = c.device_info();
  c.raise_if(fusedstep::check(p, info));
  if (mode == kModeCheck) return nb::int_(0);
  if (mode == kModePlan || mode == kModePlanH200) {
    typename PlanOf<Params>::type plan;
    c.raise_if(fusedstep::plan(p, info, &plan));
    return plan_dict(plan);
  }
  c.ensure_current_device();
  if (mode == kModeComposed) {
    void* w = workspace_ptr(c, workspace, fusedstep::composed::workspace_bytes(p));
    c.raise_if(fusedstep::composed::launch(p, w, as_stream(stream)));
  } else {
    fusedstep::LaunchOptions options{.pdl = pdl, .device = &info};
    c.raise_if(fusedstep::launch(p, options, as_stream(stream)));
  }
  return nb::int_(0);
}

nb::object mhc_boundary(Array x, Array residual, Array post, Array comb, Array pre_lag, Array weight,
                     Array scale, Array base, Array norm_weight, Array residual_out,
                     Array layer_input, Array pre_out, Array post_out, Array comb_out,
                     int rounding, float rms_eps, float hc_pre_eps, float sinkhorn_eps,
                     float post_mult, float norm_eps, int sinkhorn_iters, int mode,
                     uintptr_t stream, OptArray workspace, bool pdl) {
  Call c{"mhc_boundary", mode};
  // residual [tokens, 4, hidden] gives the sizes.
  c.place("residual", residual);
  c.dtype("residual", residual, Dt::kBf16);
  if (residual.ndim() != 3 || residual.shape(1) != 4) {
    bad_tensor(c.op, "residual", residual, "shape [tokens, 4, hidden]");
  }
  const int64_t T = residual.shape(0), H = residual.shape(2);
  const std::string tok = std::to_string(T), hid = std::to_string(H);
  c.dense_from("residual", residual, 1, "streams and hidden contiguous (strides (any, hidden, 1))");

  c.place("x", x);
  c.dtype("x", x, Dt::kBf16);
  c.shape("x", x, {T, H}, "[tokens, hidden] = [" + tok + ", " + hid + "]");
  const int64_t x_stride = c.row_stride("x", x);

  auto small = [&](const char* name, const Array& a, std::initializer_list<int64_t> sizes,
                   const std::string& what, const char* field = nullptr) {
    c.place(name, a, field);
    c.dtype(name, a, Dt::kF32);
    c.shape(name, a, sizes, what);
    c.contiguous(name, a);
  };
  auto per_token_4 = [&](const char* name, const Array& a, const char* field) {
    c.place(name, a, field);
    c.dtype(name, a, Dt::kF32);
    const bool ok = (a.ndim() == 2 && a.shape(0) == size_t(T) && a.shape(1) == 4) ||
                    (a.ndim() == 3 && a.shape(0) == size_t(T) && a.shape(1) == 4 && a.shape(2) == 1);
    if (!ok) bad_tensor(c.op, name, a, "shape [tokens, 4] or [tokens, 4, 1] with tokens = " + tok);
    c.contiguous(name, a);
  };
  per_token_4("post_mix", post, "post");
  small("comb_res_mix", comb, {T, 4, 4}, "[tokens, 4, 4] with tokens = " + tok, "comb");
  per_token_4("pre_mix", pre_lag, "pre_lag");

  c.place("weight", weight);
  c.dtype("weight", weight, Dt::kU32W);
  c.contiguous("weight", weight);
  if (rounding >= 0 && rounding <= 2 && H > 0 && H % 512 == 0) {  // else check() names hidden
    const int64_t words =
        fusedstep::mhc_boundary_weight_words(H, fusedstep::WeightRounding(rounding));
    if (int64_t(weight.size()) != words) {
      bad_tensor(c.op, "weight", weight,
                 std::to_string(words) + " words (prepare_boundary_weight(fn) for hidden " + hid +
                     " and rounding " + std::to_string(rounding) + ")");
    }
  }
  small("scale", scale, {3}, "[3]");
  small("base", base, {24}, "[24]");
  c.place("norm_weight", norm_weight);
  c.dtype("norm_weight", norm_weight, Dt::kBf16);
  c.shape("norm_weight", norm_weight, {H}, "[hidden] = [" + hid + "]");
  c.contiguous("norm_weight", norm_weight);

  c.place("residual_out", residual_out);
  c.dtype("residual_out", residual_out, Dt::kBf16);
  c.shape("residual_out", residual_out, {T, 4, H},
          "[tokens, 4, hidden] = [" + tok + ", 4, " + hid + "]");
  c.dense_from("residual_out", residual_out, 1,
               "streams and hidden contiguous (strides (any, hidden, 1))");
  c.place("layer_input", layer_input);
  c.dtype("layer_input", layer_input, Dt::kBf16);
  c.shape("layer_input", layer_input, {T, H}, "[tokens, hidden] = [" + tok + ", " + hid + "]");
  const int64_t li_stride = c.row_stride("layer_input", layer_input);
  per_token_4("post_out", post_out, nullptr);
  small("comb_out", comb_out, {T, 4, 4}, "[tokens, 4, 4] with tokens = " + tok);
  small("pre_out", pre_out, {T, 4}, "[tokens, 4] with tokens = " + tok);

  fusedstep::MhcBoundaryParams p;
  p.x = ptr<const __nv_bfloat16>(x);
  p.residual = ptr<const __nv_bfloat16>(residual);
  p.post = ptr<const float>(post);
  p.comb = ptr<const float>(comb);
  p.pre_lag = ptr<const float>(pre_lag);
  p.weight = ptr<const uint32_t>(weight);
  p.scale = ptr<const float>(scale);
  p.base = ptr<const float>(base);
  p.norm_weight = ptr<const __nv_bfloat16>(norm_weight);
  p.residual_out = ptr<__nv_bfloat16>(residual_out);
  p.layer_input = ptr<__nv_bfloat16>(layer_input);
  p.pre_out = ptr<float>(pre_out);
  p.post_out = ptr<float>(post_out);
  p.comb_out = ptr<float>(comb_out);
  p.tokens = T;
  p.hidden = H;
  p.x_stride = x_stride;
  p.residual_stride = T <= 1 ? 4 * H : int64_t(residual.stride(0));
  p.residual_out_stride = T <= 1 ? 4 * H : int64_t(residual_out.stride(0));
  p.layer_input_stride = li_stride;
  p.rounding = fusedstep::WeightRounding(rounding);
  p.rms_eps = rms_eps;
  p.hc_pre_eps = hc_pre_eps;
  p.sinkhorn_eps = sinkhorn_eps;
  p.post_mult = post_mult;
  p.norm_eps = norm_eps;
  p.sinkhorn_iters = sinkhorn_iters;

  return run_mode(c, p, mode, stream, workspace, pdl);
}

int64_t mhc_boundary_weight_words(int64_t hidden, int rounding) {
  if (rounding < 0 || rounding > 2) {
    throw nb::value_error(("rounding = " + std::to_string(rounding) +
                           " must be 0 (tf32_rna), 1 (tf32_rne) or 2 (fp32)")
                              .c_str());
  }
  if (hidden <= 0 || hidden % 512 != 0) {
    throw nb::value_error(("prepare_boundary_weight: hidden = " + std::to_string(hidden) +
                           " must be a positive multiple of 512 (fn is [24, 4 * hidden])")
                              .c_str());
  }
  return fusedstep::mhc_boundary_weight_words(hidden, fusedstep::WeightRounding(rounding));
}

// fn [24, 4 * hidden] float32 -> out (words): host when both are CPU arrays, enqueued on
// `stream` when both are CUDA tensors.
void prepare_boundary_weight(Array fn, Array out, int rounding, uintptr_t stream) {
  const bool on_gpu = fn.device_type() == nb::device::cuda::value;
  Call c{"prepare_boundary_weight", on_gpu ? kModeLaunch : kModeCheck};
  c.place("fn", fn);
  c.dtype("fn", fn, Dt::kF32);
  if (fn.ndim() != 2 || fn.shape(0) != 24 || fn.shape(1) % 4 != 0) {
    bad_tensor(c.op, "fn", fn, "shape [24, 4 * hidden]");
  }
  c.contiguous("fn", fn);
  const int64_t hidden = int64_t(fn.shape(1)) / 4;
  const int64_t words = mhc_boundary_weight_words(hidden, rounding);
  c.place("out", out);
  c.dtype("out", out, Dt::kU32W);
  c.contiguous("out", out);
  if (int64_t(out.size()) != words) {
    bad_tensor(c.op, "out", out, std::to_string(words) + " words");
  }
  if (!on_gpu && out.device_type() != nb::device::cpu::value) {
    bad_tensor(c.op, "out", out, "a CPU array like fn");
  }
  if (on_gpu) {
    c.ensure_current_device();
    // Usually a process's first GPU call: a GPU this build has no code for is named here
    // (get_device_info's kDeviceUnsupported) rather than by a failed kernel launch.
    (void)c.device_info();
    c.raise_if(fusedstep::prepare_mhc_boundary_weight_device(
        ptr<const float>(fn), hidden, fusedstep::WeightRounding(rounding), ptr<uint32_t>(out),
        as_stream(stream)));
  } else {
    c.raise_if(fusedstep::prepare_mhc_boundary_weight(
        ptr<const float>(fn), hidden, fusedstep::WeightRounding(rounding), ptr<uint32_t>(out)));
  }
}

// ---------------------------------------------------------------- KDA decode / verify
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
  // The two tensors that come as BF16 or FP32.
  auto bf16_or_f32 = [&](const char* name, const Array& t) {
    c.place(name, t);
    if (is_bf16(t)) return fusedstep::DType::kBf16;
    if (!is_f32(t)) bad_tensor(c.op, name, t, "dtype bfloat16 or float32");
    return fusedstep::DType::kFp32;
  };
  p.conv_weight_dtype = bf16_or_f32("conv_weight", a.conv_weight);
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
  p.norm_weight_dtype = bf16_or_f32("norm_weight", a.norm_weight);
  c.place("norm_weight", a.norm_weight);
  c.shape("norm_weight", a.norm_weight, {128}, "[128]");
  c.contiguous("norm_weight", a.norm_weight);

  // conv state: [slots, 3 * dim, taps >= tokens + 2], any strides, BF16 or FP32.
  p.conv_state_dtype = bf16_or_f32("conv_state", a.conv_state);
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

  // state: [slots, heads, 128, 128] FP32, each slot's heads contiguous.
  c.place("state", a.state);
  c.dtype("state", a.state, Dt::kF32);
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
  p.state = ptr<float>(a.state);
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
  c.place("state", state);
  c.dtype("state", state, Dt::kF32);
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
  p.state = ptr<float>(state);
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
namespace ref = fusedstep::reference;

ref::Precision precision_of(const std::string& s) {
  if (s == "float64") return ref::Precision::kFloat64;
  if (s == "float32") return ref::Precision::kFloat32;
  throw nb::value_error(("precision = '" + s + "' must be 'float64' or 'float32'").c_str());
}

// Host copy of an array in row-major order (any strides), as T. BF16 arrays (and
// uint16 bit patterns) come as their 16-bit patterns for T = uint16_t and as their
// values for floating T.
template <class T>
std::vector<T> gather(Call& c, const char* name, const Array& a) {
  if (a.device_type() != nb::device::cpu::value) {
    bad_tensor(c.op, name, a, "a CPU array (the reference runs on the host)");
  }
  c.tensors.push_back({name, &a, nullptr});
  const size_t n = a.size();
  std::vector<T> out(n);
  if (n == 0) return out;
  const size_t nd = a.ndim();
  std::vector<int64_t> index(nd, 0);
  const char* base = static_cast<const char*>(a.data());
  const size_t item = a.itemsize();
  const bool bf16 = is_bf16(a), f32 = is_f32(a), f64 = is_f64(a), i32 = is_i32(a);
  for (size_t i = 0; i < n; ++i) {
    int64_t offset = 0;
    for (size_t d = 0; d < nd; ++d) offset += index[d] * a.stride(d);
    const char* src = base + offset * int64_t(item);
    if constexpr (std::is_same_v<T, uint16_t>) {
      std::memcpy(&out[i], src, 2);
    } else if constexpr (std::is_same_v<T, int32_t>) {
      std::memcpy(&out[i], src, 4);
    } else {
      if (bf16) {
        uint16_t h;
        std::memcpy(&h, src, 2);
        const uint32_t u = uint32_t(h) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        out[i] = T(f);
      } else if (f32) {
        float f;
        std::memcpy(&f, src, 4);
        out[i] = T(f);
      } else if (f64) {
        double v;
        std::memcpy(&v, src, 8);
        out[i] = T(v);
      } else if (i32) {
        int32_t v;
        std::memcpy(&v, src, 4);
        out[i] = T(v);
      }
    }
    for (size_t d = nd; d-- > 0;) {
      if (++index[d] < int64_t(a.shape(d))) break;
      index[d] = 0;
    }
  }
  return out;
}

nb::ndarray<nb::numpy, double> to_numpy(std::vector<double>&& v, std::vector<size_t> shape) {
  auto* heap = new std::vector<double>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<double>*>(p); });
  return nb::ndarray<nb::numpy, double>(heap->data(), shape.size(), shape.data(), owner);
}

nb::dict reference_mhc_boundary(Array x, Array residual, Array post, Array comb, Array pre_lag,
                                Array fn, Array scale, Array base, Array norm_weight,
                                int rounding, float rms_eps, float hc_pre_eps,
                                float sinkhorn_eps, float post_mult, float norm_eps,
                                int sinkhorn_iters, const std::string& precision) {
  Call c{"reference.mhc_boundary", kModeCheck};
  c.dtype("residual", residual, Dt::kBf16);
  if (residual.ndim() != 3 || residual.shape(1) != 4) {
    bad_tensor(c.op, "residual", residual, "shape [tokens, 4, hidden]");
  }
  const int64_t T = residual.shape(0), H = residual.shape(2);
  c.dtype("x", x, Dt::kBf16);
  c.shape("x", x, {T, H}, "[tokens, hidden]");
  for (auto [name, arr] : {std::pair<const char*, const Array*>{"post_mix", &post}, {"pre_mix", &pre_lag}}) {
    c.dtype(name, *arr, Dt::kF32);
    if (arr->size() != size_t(T * 4) || arr->ndim() < 2 || arr->shape(0) != size_t(T)) {
      bad_tensor(c.op, name, *arr, "shape [tokens, 4] or [tokens, 4, 1]");
    }
  }
  c.dtype("comb_res_mix", comb, Dt::kF32);
  c.shape("comb_res_mix", comb, {T, 4, 4}, "[tokens, 4, 4]");
  c.dtype("fn", fn, Dt::kF32);
  c.shape("fn", fn, {24, 4 * H}, "[24, 4 * hidden]");
  c.dtype("scale", scale, Dt::kF32);
  c.shape("scale", scale, {3}, "[3]");
  c.dtype("base", base, Dt::kF32);
  c.shape("base", base, {24}, "[24]");
  c.dtype("norm_weight", norm_weight, Dt::kBf16);
  c.shape("norm_weight", norm_weight, {H}, "[hidden]");
  if (rounding < 0 || rounding > 2) {
    throw nb::value_error(("rounding = " + std::to_string(rounding) + " must be 0, 1 or 2").c_str());
  }
  const auto xs = gather<uint16_t>(c, "x", x);
  const auto rs = gather<uint16_t>(c, "residual", residual);
  const auto ps = gather<float>(c, "post_mix", post);
  const auto cs = gather<float>(c, "comb_res_mix", comb);
  const auto ls = gather<float>(c, "pre_mix", pre_lag);
  const auto fs = gather<float>(c, "fn", fn);
  const auto ss = gather<float>(c, "scale", scale);
  const auto bs = gather<float>(c, "base", base);
  const auto ns = gather<uint16_t>(c, "norm_weight", norm_weight);
  ref::MhcBoundaryProblem p;
  p.tokens = T;
  p.hidden = H;
  p.x = xs.data();
  p.residual = rs.data();
  p.post = ps.data();
  p.comb = cs.data();
  p.pre_lag = ls.data();
  p.fn = fs.data();
  p.scale = ss.data();
  p.base = bs.data();
  p.norm_weight = ns.data();
  p.rounding = fusedstep::WeightRounding(rounding);
  p.rms_eps = rms_eps;
  p.hc_pre_eps = hc_pre_eps;
  p.sinkhorn_eps = sinkhorn_eps;
  p.post_mult = post_mult;
  p.norm_eps = norm_eps;
  p.sinkhorn_iters = sinkhorn_iters;
  ref::MhcBoundaryResult r = ref::mhc_boundary(p, precision_of(precision));
  const size_t t = size_t(T), h = size_t(H);
  nb::dict out;
  out["residual_out"] = to_numpy(std::move(r.residual_out), {t, 4, h});
  out["layer_input"] = to_numpy(std::move(r.layer_input), {t, h});
  out["pre"] = to_numpy(std::move(r.pre), {t, 4});
  out["post"] = to_numpy(std::move(r.post), {t, 4});
  out["comb"] = to_numpy(std::move(r.comb), {t, 4, 4});
  out["mix"] = to_numpy(std::move(r.mix), {t, 24});
  out["ssq"] = to_numpy(std::move(r.ssq), {t});
  out["ssq_li"] = to_numpy(std::move(r.ssq_li), {t});
  out["li"] = to_numpy(std::move(r.li), {t, h});
  return out;
}

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
  const bool conv_bf16 = is_bf16(conv_state);
  std::vector<uint16_t> cs16;
  std::vector<float> cs32;
  if (conv_bf16) cs16 = gather<uint16_t>(c, "conv_state", conv_state);
  else cs32 = gather<float>(c, "conv_state", conv_state);
  const auto st = gather<float>(c, "state", state);
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
  p.conv_state = conv_bf16 ? static_cast<const void*>(cs16.data()) : static_cast<const void*>(cs32.data());
  p.conv_state_bf16 = conv_bf16;
  p.conv_state_slot_stride = channels * taps; p.conv_state_channel_stride = taps; p.conv_state_tap_stride = 1;
  p.conv_state_slots = conv_slots;
  p.state = st.data(); p.state_slot_stride = heads_guess * 16384; p.state_slots = state.shape(0);
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
  c.dtype("state", state, Dt::kF32);
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
  const auto st = gather<float>(c, "state", state);
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

nb::dict build_info() {
  const fusedstep::BuildInfo& b = fusedstep::build_info();
  nb::dict d;
  d["version"] = b.version;
  d["commit"] = b.commit;
  d["cuda_version"] = b.cuda_version;
  nb::list archs;
  std::string all = b.architectures;
  for (size_t start = 0; start <= all.size();) {
    size_t end = all.find(';', start);
    if (end == std::string::npos) end = all.size();
    if (end > start) archs.append(all.substr(start, end - start));
    start = end + 1;
  }
  d["architectures"] = archs;
  d["cuda_runtime"] = b.cuda_runtime;
  return d;
}

nb::dict device_info(int device) {
  fusedstep::DeviceInfo info;
  const fusedstep::Result r = fusedstep::get_device_info(device, &info);
  if (!r) raise_result(r, "");
  nb::dict d;
  d["device"] = info.device;
  d["cc_major"] = info.cc_major;
  d["cc_minor"] = info.cc_minor;
  d["sm_count"] = info.sm_count;
  d["l2_bytes"] = info.l2_bytes;
  d["max_smem_per_block_optin"] = info.max_smem_per_block_optin;
  d["cluster_launch"] = info.cluster_launch;
  d["mhc_clusters_per_wave"] = info.mhc_clusters_per_wave;
  d["mhc_one_cta_clusters_per_wave"] = info.mhc_one_cta_clusters_per_wave;
  return d;
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "fusedstep C++ API binding (torch-free; tensors through DLPack)";
  m.attr("MODE_LAUNCH") = kModeLaunch;
  m.attr("MODE_COMPOSED") = kModeComposed;
  m.attr("MODE_CHECK") = kModeCheck;
  m.attr("MODE_WORKSPACE") = kModeWorkspace;
  m.attr("MODE_PLAN") = kModePlan;
  m.attr("MODE_PLAN_H200") = kModePlanH200;
  m.attr("KDA_MAX_TOKENS") = fusedstep::kKdaMaxTokens;
  m.attr("KDA_MAX_BATCH") = fusedstep::kKdaMaxBatch;
  m.attr("MHC_MAX_TOKENS") = fusedstep::kMhcMaxTokens;

  m.def("mhc_boundary", &mhc_boundary, nb::arg("x"), nb::arg("residual"), nb::arg("post_mix"),
        nb::arg("comb_res_mix"), nb::arg("pre_mix"), nb::arg("weight"), nb::arg("scale"),
        nb::arg("base"), nb::arg("norm_weight"), nb::arg("residual_out"), nb::arg("layer_input"),
        nb::arg("pre_out"), nb::arg("post_out"), nb::arg("comb_out"), nb::arg("rounding"),
        nb::arg("rms_eps"), nb::arg("hc_pre_eps"), nb::arg("sinkhorn_eps"), nb::arg("post_mult"),
        nb::arg("norm_eps"), nb::arg("sinkhorn_iters"), nb::arg("mode"), nb::arg("stream"),
        nb::arg("workspace").none(), nb::arg("pdl"));
  m.def("mhc_boundary_weight_words", &mhc_boundary_weight_words, nb::arg("hidden"),
        nb::arg("rounding"));
  m.def("prepare_boundary_weight", &prepare_boundary_weight, nb::arg("fn"), nb::arg("out"),
        nb::arg("rounding"), nb::arg("stream"));
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
  m.def("reference_mhc_boundary", &reference_mhc_boundary, nb::arg("x"), nb::arg("residual"),
        nb::arg("post_mix"), nb::arg("comb_res_mix"), nb::arg("pre_mix"), nb::arg("fn"),
        nb::arg("scale"), nb::arg("base"), nb::arg("norm_weight"), nb::arg("rounding"),
        nb::arg("rms_eps"), nb::arg("hc_pre_eps"), nb::arg("sinkhorn_eps"), nb::arg("post_mult"),
        nb::arg("norm_eps"), nb::arg("sinkhorn_iters"), nb::arg("precision"));
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
  m.def("device_info", &device_info, nb::arg("device"));
  m.def("build_info", &build_info);
}
