// SPDX-License-Identifier: Apache-2.0
// The helpers of binding.h: dtype checks, tensor descriptions, error mapping, workspace.
#include "binding.h"

namespace fusedstep_python {

namespace {

bool is_dtype(const Array& a, nb::dlpack::dtype_code code, int bits) {
  const nb::dlpack::dtype d = a.dtype();
  return d.code == uint8_t(code) && d.bits == bits && d.lanes == 1;
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

}  // namespace

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

namespace ref = fusedstep::reference;

ref::Precision precision_of(const std::string& s) {
  if (s == "float64") return ref::Precision::kFloat64;
  if (s == "float32") return ref::Precision::kFloat32;
  throw nb::value_error(("precision = '" + s + "' must be 'float64' or 'float32'").c_str());
}

nb::ndarray<nb::numpy, double> to_numpy(std::vector<double>&& v, std::vector<size_t> shape) {
  auto* heap = new std::vector<double>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<double>*>(p); });
  return nb::ndarray<nb::numpy, double>(heap->data(), shape.size(), shape.data(), owner);
}

}  // namespace fusedstep_python
