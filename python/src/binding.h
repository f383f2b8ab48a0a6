// SPDX-License-Identifier: Apache-2.0
// What the operations' bindings share: argument checks (Call), error mapping, modes, host copies.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "fusedstep/fusedstep.h"
#include "fusedstep_reference/common.h"

namespace nb = nanobind;

namespace fusedstep_python {

using Array = nb::ndarray<>;
using OptArray = std::optional<nb::ndarray<>>;

constexpr int kModeLaunch = 0;
constexpr int kModeComposed = 1;
constexpr int kModeCheck = 2;
constexpr int kModeWorkspace = 3;  // return composed::workspace_bytes, run nothing
constexpr int kModePlan = 4;       // return plan() for the tensors' device as a dict, run nothing
constexpr int kModePlanH200 = 5;   // the same for the hand-made H200 DeviceInfo (no GPU needed)

// ---------------------------------------------------------------- descriptions
enum class Dt { kBf16, kF32, kF64, kI32, kU32W /* int32 or uint32 words */, kAny };

bool is_bf16(const Array& a);  // bfloat16, or uint16 bit patterns
bool is_f32(const Array& a);
bool is_f64(const Array& a);
bool is_i32(const Array& a);
bool is_words(const Array& a);  // int32 or uint32

// ValueError "op: name: shape ..., dtype ..., strides ..., device ...; expected ...".
[[noreturn]] void bad_tensor(const char* op, const char* name, const Array& a,
                             const std::string& expected);

// A failed Result as an exception: ValueError for bad arguments, NotImplementedError for
// kUnsupported, RuntimeError for the rest (kDeviceUnsupported, kCudaError).
[[noreturn]] void raise_result(const fusedstep::Result& r, const std::string& context);

// A named tensor of one call: described in error messages whose field it owns.
struct Named {
  const char* name;    // the Python argument
  const Array* array;
  const char* field;   // the params field it fills (null: the same name)
};

// Which tensor a C++ detail ("op: field = value ...") is about: the longest tensor
// name that starts the field (x_stride -> x, residual_out_stride -> residual_out).
std::string context_for(const char* detail, const std::vector<Named>& tensors);

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

inline cudaStream_t as_stream(uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

// The caller's workspace for the composed path, checked to hold `bytes` (null when none
// is needed).
void* workspace_ptr(Call& call, const OptArray& workspace, int64_t bytes);

// A plan struct as a dict (defined with its operation).
nb::dict plan_dict(const fusedstep::MhcBoundaryPlan& plan);
nb::dict plan_dict(const fusedstep::KdaDecodePlan& plan);

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

// ---------------------------------------------------------------- CPU reference
// "float64" or "float32" (ValueError otherwise).
fusedstep::reference::Precision precision_of(const std::string& s);

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

// A numpy array that owns `v`.
nb::ndarray<nb::numpy, double> to_numpy(std::vector<double>&& v, std::vector<size_t> shape);

// Each operation's functions of fusedstep._C.
void register_mhc(nb::module_& m);
void register_kda(nb::module_& m);

}  // namespace fusedstep_python
