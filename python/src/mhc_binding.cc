// SPDX-License-Identifier: Apache-2.0
// The mHC boundary functions of fusedstep._C: the op, weight preparation, plan, CPU reference.
#include <string>
#include <utility>

#include "binding.h"
#include "fusedstep_reference/mhc_boundary.h"

namespace fusedstep_python {

namespace ref = fusedstep::reference;

namespace {

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

// ---------------------------------------------------------------- CPU reference
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

}  // namespace

// The fields of MhcBoundaryPlan (include/fusedstep/mhc_boundary.h) that MODE_PLAN returns,
// each as a dict entry of its own name. A field added to or removed from the struct is one
// entry here.
#define FS_MHC_PLAN_FIELDS(X) X(tile) X(clusters) X(waves) X(ctas_per_sm)

nb::dict plan_dict(const fusedstep::MhcBoundaryPlan& plan) {
  nb::dict d;
#define FS_FIELD(name) d[#name] = plan.name;
  FS_MHC_PLAN_FIELDS(FS_FIELD)
#undef FS_FIELD
  return d;
}

void register_mhc(nb::module_& m) {
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
  m.def("reference_mhc_boundary", &reference_mhc_boundary, nb::arg("x"), nb::arg("residual"),
        nb::arg("post_mix"), nb::arg("comb_res_mix"), nb::arg("pre_mix"), nb::arg("fn"),
        nb::arg("scale"), nb::arg("base"), nb::arg("norm_weight"), nb::arg("rounding"),
        nb::arg("rms_eps"), nb::arg("hc_pre_eps"), nb::arg("sinkhorn_eps"), nb::arg("post_mult"),
        nb::arg("norm_eps"), nb::arg("sinkhorn_iters"), nb::arg("precision"));
}

}  // namespace fusedstep_python
