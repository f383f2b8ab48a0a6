# SPDX-License-Identifier: Apache-2.0
"""CPU: the binding itself. Argument checks run without a GPU (MODE_CHECK uses a
hand-made H200 DeviceInfo): every rejection is a ValueError naming the tensor, its
shape, dtype and strides and what was expected; valid arguments pass."""
import re

import numpy as np
import pytest

import fusedstep
from fusedstep import _C
import fsdata

SCALARS_MHC = dict(rounding=0, rms_eps=1e-6, hc_pre_eps=1e-6, sinkhorn_eps=1e-6, post_mult=2.0,
                   norm_eps=1e-6, sinkhorn_iters=20)


def aligned_empty(shape, dtype, offset_bytes=0):
    """A numpy array whose data starts offset_bytes past a 64-byte boundary."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    raw = np.zeros(n + 128, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64 + offset_bytes
    return raw[start:start + n].view(dtype).reshape(shape)


class Mhc:
    """Valid mHC arguments (numpy, BF16 as uint16) for tokens x hidden."""

    def __init__(self, tokens=3, hidden=512, rounding=0):
        T, H = tokens, hidden
        try:
            words = _C.mhc_boundary_weight_words(H, rounding)
        except ValueError:  # an unsupported hidden: check() reports it
            words = 128
        self.a = dict(
            x=aligned_empty((T, H), np.uint16), residual=aligned_empty((T, 4, H), np.uint16),
            post_mix=aligned_empty((T, 4, 1), np.float32), comb_res_mix=aligned_empty((T, 4, 4), np.float32),
            pre_mix=aligned_empty((T, 4), np.float32), weight=aligned_empty((words,), np.int32),
            scale=aligned_empty((3,), np.float32), base=aligned_empty((24,), np.float32),
            norm_weight=aligned_empty((H,), np.uint16),
            residual_out=aligned_empty((T, 4, H), np.uint16), layer_input=aligned_empty((T, H), np.uint16),
            pre_out=aligned_empty((T, 4), np.float32), post_out=aligned_empty((T, 4, 1), np.float32),
            comb_out=aligned_empty((T, 4, 4), np.float32))
        self.s = dict(SCALARS_MHC, rounding=rounding)

    def call(self, mode=_C.MODE_CHECK, **override):
        a = dict(self.a, **{k: v for k, v in override.items() if k in self.a})
        s = dict(self.s, **{k: v for k, v in override.items() if k in self.s})
        return _C.mhc_boundary(**a, **s, mode=mode, stream=0, workspace=None, pdl=False)


def expect_value_error(fn, *patterns):
    with pytest.raises(ValueError) as e:
        fn()
    message = str(e.value)
    for p in patterns:
        assert re.search(p, message), f"{p!r} not in {message!r}"
    return message


def test_module_constants():
    assert _C.KDA_MAX_TOKENS == 8 and _C.MHC_MAX_TOKENS == 1 << 20
    assert fusedstep.weight_shape(5120) == (16, 80, 3, 32, 4)
    assert fusedstep.weight_shape(5120, "fp32") == (16, 80, 5, 32, 4)
    assert np.prod(fusedstep.weight_shape(4096, "tf32_rne")) == _C.mhc_boundary_weight_words(4096, 1)
    with pytest.raises(ValueError, match="rounding"):
        fusedstep.rounding_index("tf32")
    expect_value_error(lambda: fusedstep.weight_shape(1000), "hidden = 1000", "multiple of 512")


def test_mhc_valid_arguments_pass_the_check():
    assert Mhc().call() == 0
    assert Mhc(tokens=1, hidden=1024, rounding=2).call() == 0
    assert Mhc(tokens=0).call() == 0  # an empty call is valid


def test_mhc_strided_rows_pass_and_bad_strides_fail():
    m = Mhc(tokens=3, hidden=512)
    xb = aligned_empty((3, 520), np.uint16)
    assert m.call(x=xb[:, :512]) == 0                      # row stride 520: a multiple of 8
    xb = aligned_empty((3, 516), np.uint16)
    expect_value_error(lambda: m.call(x=xb[:, :512]), r"x_stride = 516", r"multiple of 8",
                       r"x: shape \(3, 512\), dtype uint16, strides \(516, 1\)")
    expect_value_error(lambda: m.call(x=aligned_empty((512, 3), np.uint16).T),
                       r"x: shape \(3, 512\)", r"strides \(1, 3\)", "unit stride")


@pytest.mark.parametrize("name,bad,patterns", [
    ("x", lambda m: aligned_empty((3, 512), np.float32), [r"x: shape \(3, 512\), dtype float32", "expected dtype bfloat16"]),
    ("residual", lambda m: aligned_empty((3, 3, 512), np.uint16), [r"residual: shape \(3, 3, 512\)", r"\[tokens, 4, hidden\]"]),
    ("x", lambda m: aligned_empty((2, 512), np.uint16), [r"x: shape \(2, 512\)", r"expected shape \[tokens, hidden\] = \[3, 512\]"]),
    ("post_mix", lambda m: aligned_empty((3, 5), np.float32), ["post_mix", r"\[tokens, 4\] or \[tokens, 4, 1\]"]),
    ("comb_res_mix", lambda m: aligned_empty((4, 4, 3), np.float32).transpose(2, 0, 1), ["comb_res_mix", "contiguous"]),
    ("weight", lambda m: aligned_empty((100,), np.int32), [r"weight: shape \(100,\)", r"49152 words", "prepare_boundary_weight"]),
    ("weight", lambda m: aligned_empty((49152,), np.float32), ["weight", "int32 or uint32"]),
    ("scale", lambda m: aligned_empty((4,), np.float32), [r"scale: shape \(4,\)", r"shape \[3\]"]),
    ("norm_weight", lambda m: aligned_empty((512,), np.float32), ["norm_weight", "bfloat16"]),
    ("layer_input", lambda m: aligned_empty((3, 1024), np.uint16), ["layer_input", r"\[3, 512\]"]),
    ("comb_out", lambda m: aligned_empty((3, 16), np.float32), ["comb_out", r"\[tokens, 4, 4\]"]),
])
def test_mhc_argument_errors_name_the_tensor(name, bad, patterns):
    m = Mhc()
    expect_value_error(lambda: m.call(**{name: bad(m)}), *patterns)


def test_mhc_misaligned_pointer_is_named():
    m = Mhc()
    expect_value_error(lambda: m.call(pre_mix=aligned_empty((3, 4), np.float32, offset_bytes=4)),
                       "pre_lag", "16-byte aligned", "kMisaligned", r"pre_mix: shape \(3, 4\)")
    expect_value_error(lambda: m.call(residual_out=aligned_empty((3, 4, 512), np.uint16, offset_bytes=2)),
                       "residual_out", "16-byte aligned", r"residual_out: shape \(3, 4, 512\)")


def test_mhc_scalar_and_shape_errors_from_check():
    expect_value_error(lambda: Mhc(hidden=256).call(), "hidden = 256", "kInvalidShape")
    expect_value_error(lambda: Mhc().call(sinkhorn_iters=0), "sinkhorn_iters = 0", "kInvalidValue")
    expect_value_error(lambda: Mhc().call(norm_eps=-1.0), "norm_eps", "kInvalidValue")
    expect_value_error(lambda: Mhc().call(rms_eps=float("nan")), "rms_eps")


def test_launch_modes_need_cuda_tensors():
    m = Mhc()
    for mode in (_C.MODE_LAUNCH, _C.MODE_COMPOSED):
        expect_value_error(lambda: m.call(mode=mode), r"residual: shape \(3, 4, 512\)", "device cpu",
                           "expected a CUDA tensor")


def test_prepare_boundary_weight_errors():
    fn = np.zeros((24, 2048), np.float32)
    expect_value_error(lambda: _C.prepare_boundary_weight(fn, np.zeros(10, np.int32), 0, 0),
                       r"out: shape \(10,\)", "49152 words")
    expect_value_error(lambda: fusedstep.reference.prepare_boundary_weight(np.zeros((23, 2048), np.float32)),
                       r"\[24, 4 \* hidden\]")
    expect_value_error(lambda: fusedstep.reference.prepare_boundary_weight(np.zeros((24, 2000), np.float32)),
                       "hidden = 500")
    expect_value_error(lambda: fusedstep.reference.prepare_boundary_weight(fn, "bf16"), "rounding")


# ---------------------------------------------------------------- KDA
def kda_args(case=None, **kw):
    bufs, views, s = fsdata.kda_case(np.random.default_rng(0), **(case or {}))
    v = views(bufs)
    heads = v["a_log"].shape[0]
    rows = v["x"].shape[0]
    out = aligned_empty((rows, heads * 128), np.uint16)
    a = dict(x=v["x"], f_a=v.get("f_a"), raw_gate=v.get("raw_gate"), raw_beta=v["raw_beta"],
             output_gate=v["output_gate"], conv_weight=v["conv_weight"],
             conv_bias=v.get("conv_bias"), f_b_weight=v.get("f_b_weight"), a_log=v["a_log"],
             dt_bias=v["dt_bias"], norm_weight=v["norm_weight"], conv_state=v["conv_state"],
             state=v["state"], slots=v["slots"], accepted=v.get("accepted"),
             token_counts=v.get("token_counts"), output=out,
             record_correction=v.get("record_correction"), record_key_gate=v.get("record_key_gate"),
             record_rows=v.get("record_rows"), tokens=s["tokens"], lower_bound=-5.0,
             q_scale=s["q_scale"], norm_eps=1e-5, gate_mode=0, cluster=0, lanes_per_row=0,
             early=-1, evict_first=False,
             mode=_C.MODE_CHECK, stream=0,
             workspace=None, pdl=False)
    a.update(kw)
    return a


def numpy_aligned(arr):
    """A copy of arr (same strides) at a 64-byte aligned address."""
    out = aligned_empty(arr.shape, arr.dtype)
    out[...] = arr
    return out


KDA_VALID = [dict(), dict(tokens=4), dict(tokens=3, records=True, deferred=True),
             dict(raw_gate=True, conv_weight_layout="k3", conv_state_layout="tap"),
             dict(tokens=2, conv_weight_layout="tap", conv_state_bf16=False, token_counts=True),
             dict(state_bf16=True), dict(tokens=4, records=True, state_bf16=True)]


@pytest.mark.parametrize("case", KDA_VALID, ids=str)
def test_kda_valid_arguments_pass_the_check(case):
    a = kda_args(case)
    for k in ("x", "f_a", "raw_gate", "output_gate", "output", "record_correction",
              "record_key_gate", "f_b_weight", "dt_bias", "norm_weight", "state"):
        if a[k] is not None:
            a[k] = numpy_aligned(a[k])
    assert _C.kda_decode(**a) == 0
    a["mode"] = _C.MODE_WORKSPACE
    assert _C.kda_decode(**a) > 0


def _aligned_kda(case=None, **kw):
    a = kda_args(case, **kw)
    for k in ("x", "f_a", "raw_gate", "output_gate", "output", "record_correction",
              "record_key_gate", "f_b_weight", "dt_bias", "norm_weight", "state"):
        if a[k] is not None and k not in kw:
            a[k] = numpy_aligned(a[k])
    return a


@pytest.mark.parametrize("change,patterns", [
    (lambda a: dict(x=a["x"].astype(np.float32)), [r"x: shape \(5, 768\), dtype float32", "bfloat16"]),
    (lambda a: dict(raw_beta=np.zeros((5, 3), np.uint16)), [r"raw_beta: shape \(5, 3\)", r"\[5, 2\]"]),
    (lambda a: dict(slots=a["slots"].astype(np.int64)), [r"slots: shape \(5,\), dtype int64", "int32"]),
    (lambda a: dict(slots=np.zeros((5, 2), np.int32)), ["slots", r"shape \[batch\] with tokens = 1"]),
    (lambda a: dict(state=np.zeros((4, 2, 128, 64), np.float32)), [r"state: shape \(4, 2, 128, 64\)", r"\[slots, heads, 128, 128\]"]),
    (lambda a: dict(state=np.zeros((4, 128, 128, 2), np.float32).transpose(0, 3, 1, 2)), ["state", "contiguous"]),
    (lambda a: dict(conv_weight=np.zeros((768, 3), np.float32)), ["conv_weight", r"\[768, 4\] or \[3, 4, heads \* 128\]"]),
    (lambda a: dict(conv_state=np.zeros((4, 768, 2), np.uint16)), ["conv_state", r">= tokens \+ 2 = 3"]),
    (lambda a: dict(conv_state=np.zeros((4, 768, 3), np.int32)), ["conv_state", "bfloat16 or float32"]),
    (lambda a: dict(conv_weight=np.zeros((768, 4), np.int32)), ["conv_weight", "bfloat16 or float32"]),
    (lambda a: dict(norm_weight=np.zeros(128, np.int32)), ["norm_weight", "bfloat16 or float32"]),
    (lambda a: dict(a_log=np.zeros((2, 1), np.float32)), ["a_log", r"shape \[heads\]"]),
    (lambda a: dict(dt_bias=np.zeros(128, np.float32)), [r"dt_bias: shape \(128,\)", r"\[256\]"]),
    (lambda a: dict(tokens=9), ["tokens = 9"]),
    (lambda a: dict(output=aligned_empty((5, 256), np.uint16, offset_bytes=2)), ["output", "16-byte aligned", r"output: shape \(5, 256\)"]),
    (lambda a: dict(raw_gate=aligned_empty((5, 256), np.uint16)), ["f_a", "raw_gate", "exactly one"]),
    (lambda a: dict(f_b_weight=None), ["f_b_weight is null"]),
    (lambda a: dict(lower_bound=1.0), ["lower_bound = 1", "kInvalidValue"]),
    (lambda a: dict(cluster=3), ["schedule.cluster = 3"]),
    (lambda a: dict(accepted=np.ones(5, np.int32)), ["accepted", "tokens = 1"]),
])
def test_kda_argument_errors_name_the_tensor(change, patterns):
    a = _aligned_kda()
    a.update(change(a))
    expect_value_error(lambda: _C.kda_decode(**a), *patterns)


def test_kda_takes_the_norm_weight_in_bf16_or_fp32():
    a = _aligned_kda()
    _C.kda_decode(**a)  # MODE_CHECK: FP32 accepted
    a["norm_weight"] = aligned_empty((128,), np.uint16)
    a["norm_weight"][:] = 0x3F80  # BF16 1.0
    _C.kda_decode(**a)  # BF16 bit patterns accepted too


def pitched_state(slots, heads, dtype, pad):
    """A [slots, heads, 128, 128] view whose slots are heads * 16384 + pad elements apart."""
    n = heads * 128 * 128
    return aligned_empty((slots, n + pad), dtype)[:, :n].reshape(slots, heads, 128, 128)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int16])
def test_kda_state_dtype_is_float32_or_bfloat16(dtype):
    """The state's dtype picks state_dtype: float32 or bfloat16 (uint16 bit patterns); any
    other is a ValueError naming the state and both dtypes, in the decode and the commit."""
    a = _aligned_kda()
    bad = aligned_empty(a["state"].shape, dtype)
    name = np.dtype(dtype).name
    expect_value_error(lambda: _C.kda_decode(**dict(a, state=bad)),
                       rf"kda_decode: state: shape \(9, 2, 128, 128\), dtype {name}",
                       "expected dtype bfloat16 or float32")
    c = _commit_args()
    expect_value_error(lambda: _C.kda_commit(**dict(c, state=aligned_empty((6, 2, 128, 128), dtype))),
                       rf"kda_commit: state: shape \(6, 2, 128, 128\), dtype {name}",
                       "expected dtype bfloat16 or float32")


def test_kda_state_slot_stride_is_pitched_in_16_bytes():
    """Each slot's [heads, 128, 128] is contiguous and the slot stride free (pitched) in
    multiples of 16 bytes: 4 FP32 or 8 BF16 elements."""
    a = _aligned_kda()
    assert _C.kda_decode(**dict(a, state=pitched_state(9, 2, np.float32, 4))) == 0
    assert _C.kda_decode(**dict(a, state=pitched_state(9, 2, np.uint16, 8))) == 0
    expect_value_error(lambda: _C.kda_decode(**dict(a, state=pitched_state(9, 2, np.uint16, 4))),
                       "state_slot_stride = 32772", "multiple of 8 elements", "BF16",
                       r"state: shape \(9, 2, 128, 128\), dtype uint16, strides \(32772,")
    c = _commit_args()
    _C.kda_commit(**dict(c, state=pitched_state(9, 2, np.uint16, 8)))
    expect_value_error(lambda: _C.kda_commit(**dict(c, state=pitched_state(9, 2, np.uint16, 4))),
                       "state_slot_stride = 32772", "multiple of 8 elements")
    expect_value_error(lambda: _C.kda_decode(**dict(a, state=aligned_empty((9, 2, 128, 256), np.uint16)[..., :128])),
                       "state", "contiguous")


def test_kda_verify_argument_errors():
    a = _aligned_kda(dict(tokens=3, records=True))
    a["record_key_gate"] = aligned_empty((7, 2, 3, 128), np.uint16)
    expect_value_error(lambda: _C.kda_decode(**a), "record_key_gate", r"\[7, 2, 3, 256\]")
    a = _aligned_kda(dict(tokens=3))
    a["accepted"] = None
    expect_value_error(lambda: _C.kda_decode(**a), "accepted is null", "kNullPointer")
    a = _aligned_kda(dict(tokens=3))
    a["slots"] = np.zeros((5, 2), np.int32)
    expect_value_error(lambda: _C.kda_decode(**a), r"slots: shape \(5, 2\)", r"\[batch, >= tokens\]")
    a = _aligned_kda(dict(tokens=3))
    a["x"] = numpy_aligned(np.zeros((14, 768), np.uint16))
    expect_value_error(lambda: _C.kda_decode(**a), r"x: shape \(14, 768\)", r"\[batch \* tokens, 3 \* heads \* 128\] = \[15, 768\]")


def _commit_args():
    """Valid kda_commit arguments (heads 2, 6 state slots, 3 tokens of records)."""
    return dict(state=aligned_empty((6, 2, 128, 128), np.float32), slots=np.array([1, 2, 0], np.int32),
                accepted=np.array([1, 3, 2], np.int32),
                record_correction=aligned_empty((4, 2, 3, 128), np.float32),
                record_key_gate=aligned_empty((4, 2, 3, 256), np.uint16), record_rows=None,
                a_log=np.zeros(2, np.float32), dt_bias=aligned_empty((256,), np.float32), tokens=3,
                lower_bound=-5.0, mode=_C.MODE_CHECK, stream=0, pdl=False)


def test_kda_commit_checks():
    base = _commit_args()
    acc, kg = base["accepted"], base["record_key_gate"]
    _C.kda_commit(**base)
    _C.kda_commit(**dict(base, state=aligned_empty((6, 2, 128, 128), np.uint16)))  # a BF16 checkpoint
    expect_value_error(lambda: _C.kda_commit(**dict(base, tokens=1)), "tokens", r"\[record_slots, heads, tokens, 128\]")
    expect_value_error(lambda: _C.kda_commit(**dict(base, accepted=acc[:2])), r"accepted: shape \(2,\)", r"\[batch\] = \[3\]")
    expect_value_error(lambda: _C.kda_commit(**dict(base, record_key_gate=kg.astype(np.float32))), "record_key_gate", "bfloat16")
    expect_value_error(lambda: _C.kda_commit(**dict(base, mode=_C.MODE_LAUNCH)), "expected a CUDA tensor")


def test_reference_rejects_bad_arguments():
    bufs, views, s = fsdata.kda_case(np.random.default_rng(1))
    v = views(bufs)
    args = (v["x"], v["raw_beta"], v["output_gate"], v["conv_weight"], v["a_log"], v["dt_bias"],
            v["norm_weight"], v["conv_state"], v["state"], v["slots"])
    expect_value_error(lambda: fusedstep.reference.kda_decode(*args, f_a=v["f_a"]), "f_b_weight")
    expect_value_error(lambda: fusedstep.reference.kda_decode(*args, f_a=v["f_a"], f_b_weight=v["f_b_weight"], precision="half"), "precision")
    expect_value_error(lambda: fusedstep.reference.kda_decode(*args, f_a=v["f_a"], f_b_weight=v["f_b_weight"], gate_mode="tree"), "gate_mode")
    bad = list(args)
    bad[0] = v["x"][:3]
    expect_value_error(lambda: fusedstep.reference.kda_decode(*bad, f_a=v["f_a"], f_b_weight=v["f_b_weight"]), r"x: shape \(3, 768\)")


class TrainableLike:
    """Stands in for a torch tensor that requires grad (an nn.Parameter; CI has no
    torch): it refuses DLPack export as torch does, and detach() is its alias."""
    requires_grad = True

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, *args, **kwargs):
        raise RuntimeError("Can't export tensors that require gradient, use tensor.detach()")

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()

    def detach(self):
        return self.array


def test_tensors_that_require_grad_cross_the_binding_detached():
    fn = (np.random.default_rng(3).standard_normal((24, 2048)) * 0.02).astype(np.float32)
    param = TrainableLike(fn)
    with pytest.raises((RuntimeError, TypeError)):  # nanobind: "incompatible function arguments"
        _C.prepare_boundary_weight(param, np.empty(_C.mhc_boundary_weight_words(512, 0), np.int32), 0, 0)
    assert fusedstep._common.exportable(param) is fn        # an alias, never a copy
    assert fusedstep._common.exportable(fn) is fn
    assert fusedstep._common.exportable(None) is None
    np.testing.assert_array_equal(fusedstep.reference.prepare_boundary_weight(param),
                                  fusedstep.reference.prepare_boundary_weight(fn))


def test_torch_parameters_cross_the_binding_on_the_cpu():
    """With torch (the GPU machine; CI has none): an nn.Parameter outside inference mode
    through the CPU torch op and the reference, without a copy of the parameter."""
    torch = pytest.importorskip("torch")
    fn = (np.random.default_rng(4).standard_normal((24, 2048)) * 0.02).astype(np.float32)
    param = torch.nn.Parameter(torch.from_numpy(fn.copy()))
    assert torch.is_grad_enabled() and param.requires_grad
    want = fusedstep.reference.prepare_boundary_weight(fn, "fp32")
    np.testing.assert_array_equal(fusedstep.prepare_boundary_weight(param, "fp32").numpy(), want)
    np.testing.assert_array_equal(fusedstep.reference.prepare_boundary_weight(param, "fp32"), want)
    detached = fusedstep._common.exportable(param)
    assert detached.data_ptr() == param.data_ptr() and not detached.requires_grad
    assert param.requires_grad and param.grad is None


def test_package_without_torch_exposes_the_reference():
    assert callable(fusedstep.reference.mhc_boundary)
    assert callable(fusedstep.prepare_boundary_weight)
    if not fusedstep.has_torch:
        assert not hasattr(fusedstep, "kda_decode")
        with pytest.raises(AttributeError, match="needs torch.*fusedstep.reference"):
            fusedstep.mhc_plan  # noqa: B018


# ---------------------------------------------------------------- build info, plans
def test_build_info_names_version_commit_toolkit_and_architectures():
    b = fusedstep.build_info()
    assert set(b) == {"version", "commit", "cuda_version", "architectures", "cuda_runtime"}
    assert b["version"] == fusedstep.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", b["version"]), b
    assert re.fullmatch(r"[0-9a-f]{7,40}(-dirty)?|unknown|\S+", b["commit"]), b
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", b["cuda_version"]), b
    assert b["architectures"], b
    for arch in b["architectures"]:
        assert re.fullmatch(r"\d{2,3}[af]?(-real|-virtual)?|all|all-major|native", arch), b
    assert b["cuda_runtime"] in ("static", "shared")
    try:  # an installed package (a wheel) carries the same version in its metadata
        from importlib.metadata import PackageNotFoundError, version
        assert version("fusedstep") == b["version"]
    except PackageNotFoundError:  # the build tree's package (PYTHONPATH=<build>/python)
        pass


def test_python_m_fusedstep_reports_the_build():
    import json
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "fusedstep"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout[:r.stdout.index("}") + 1])
    assert report["version"] == fusedstep.__version__
    assert report["architectures"] == fusedstep.build_info()["architectures"]


@pytest.mark.parametrize("tokens,hidden", [(1, 5120), (8, 4096), (64, 5120), (300, 7168)])
def test_mhc_plan_mode_returns_the_schedule(tokens, hidden):
    plan = Mhc(tokens=tokens, hidden=hidden).call(mode=_C.MODE_PLAN_H200)
    assert {"tile", "clusters", "waves", "ctas_per_sm"} <= set(plan), plan
    assert plan["tile"] >= 1 and plan["clusters"] * plan["tile"] >= tokens, plan
    assert plan["waves"] >= 1 and plan["ctas_per_sm"] in (1, 2), plan


def test_plans_check_their_arguments_and_need_cuda_tensors():
    expect_value_error(lambda: Mhc(hidden=256).call(mode=_C.MODE_PLAN_H200), "hidden = 256")
    expect_value_error(lambda: Mhc().call(mode=_C.MODE_PLAN), "expected a CUDA tensor",
                       "fusedstep.reference")
    expect_value_error(lambda: _C.kda_decode(**_aligned_kda(mode=_C.MODE_PLAN)),
                       "expected a CUDA tensor")
    expect_value_error(lambda: _C.kda_decode(**_aligned_kda(mode=_C.MODE_PLAN_H200, cluster=3)),
                       "schedule.cluster = 3")
    expect_value_error(lambda: Mhc().call(mode=17), "mode = 17")


@pytest.mark.parametrize("case", KDA_VALID, ids=str)
def test_kda_plan_mode_returns_the_resolved_schedule(case):
    a = _aligned_kda(case)
    plan = _C.kda_decode(**dict(a, mode=_C.MODE_PLAN_H200))
    assert {"schedule", "ctas", "waves"} <= set(plan), plan
    schedule = plan["schedule"]
    assert schedule["cluster"] in (1, 2, 4, 8, 16) and schedule["lanes_per_row"] in (8, 16), plan
    assert schedule["early"] >= 0 and plan["ctas"] >= 1 and plan["waves"] >= 1, plan
    # Every default resolved: the schedule given back explicitly plans the same launch.
    assert _C.kda_decode(**dict(a, mode=_C.MODE_PLAN_H200, **schedule)) == plan
