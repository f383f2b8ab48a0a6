# SPDX-License-Identifier: Apache-2.0
"""CPU, with torch (skipped where torch is not installed, as in CI): the torch layer
without a GPU. CPU tensors given to a GPU-only op raise ValueError naming the tensor and
pointing at fusedstep.reference, before any dtype or shape check; mhc_plan / kda_plan
reach the C++ plan() through the same argument path as the ops (against the hand-made
H200 DeviceInfo here, the tensors' device on a GPU)."""
import inspect

import numpy as np
import pytest

import fsdata

torch = pytest.importorskip("torch")
import fusedstep  # noqa: E402
from fusedstep import _C, ops  # noqa: E402


def cpu_tensors(bufs):
    """numpy buffers -> CPU tensors (uint16 bit patterns -> bfloat16)."""
    out = {}
    for k, a in bufs.items():
        a = np.ascontiguousarray(a)
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if a.dtype == np.uint16 else torch.from_numpy(a)
        out[k] = t
    return out


def mhc_case(tokens=3, hidden=512):
    bufs, views, s = fsdata.mhc_case(np.random.default_rng(1), tokens, hidden)
    g = views(cpu_tensors(bufs))
    g["weight"] = fusedstep.prepare_boundary_weight(g["fn"])  # the CPU op
    return g, s


def mhc_args(g, s):
    return (g["x"], g["residual"], g["pre_mix"], g["post_mix"], g["comb_res_mix"], g["weight"],
            g["scale"], g["base"], s["hc_norm_eps"], s["hc_pre_eps"], s["hc_post_scale"],
            s["sinkhorn_eps"], s["num_sinkhorn_iters"], g["norm_weight"], s["norm_eps"])


def kda_case(**case):
    bufs, views, s = fsdata.kda_case(np.random.default_rng(2), **case)
    g = views(cpu_tensors(bufs))
    kw = {k: g[k] for k in ("f_a", "f_b_weight", "raw_gate", "conv_bias", "accepted",
                            "token_counts", "record_correction", "record_key_gate",
                            "record_rows") if k in g}
    args = (g["x"], g["raw_beta"], g["output_gate"], g["conv_weight"], g["a_log"], g["dt_bias"],
            g["norm_weight"], g["conv_state"], g["state"], g["slots"])
    return g, args, dict(kw, **s)


def expect_cpu_error(fn, function, name, reference):
    with pytest.raises(ValueError) as e:
        fn()
    message = str(e.value)
    assert message.startswith(f"{function}: {name} is a CPU tensor"), message
    assert f"fusedstep.reference.{reference}" in message, message
    assert "Could not run" not in message, message


def test_cpu_tensors_to_the_mhc_op_name_the_tensor_and_the_reference():
    g, s = mhc_case()
    args = mhc_args(g, s)
    expect_cpu_error(lambda: fusedstep.mhc_shifted_post_pre_boundary(*args),
                     "mhc_shifted_post_pre_boundary", "x", "mhc_boundary")
    # the wrong dtype too: the device is named first, not the dtype
    expect_cpu_error(lambda: fusedstep.mhc_shifted_post_pre_boundary(g["x"].float(), *args[1:]),
                     "mhc_shifted_post_pre_boundary", "x", "mhc_boundary")
    outs = ops._mhc_empty_outputs(g["x"], g["residual"])
    expect_cpu_error(lambda: fusedstep.mhc_shifted_post_pre_boundary(*args, out=outs),
                     "mhc_shifted_post_pre_boundary", "x", "mhc_boundary")
    # straight through the dispatcher, as torch.compile'd or engine code calls it
    expect_cpu_error(lambda: torch.ops.fusedstep.mhc_boundary(*args, 0, False, False),
                     "mhc_shifted_post_pre_boundary", "x", "mhc_boundary")
    expect_cpu_error(lambda: fusedstep.mhc_plan(*args), "mhc_plan", "x", "mhc_boundary")


def test_cpu_tensors_to_the_kda_ops_name_the_tensor_and_the_reference():
    g, args, kw = kda_case()
    expect_cpu_error(lambda: fusedstep.kda_decode(*args, **kw), "kda_decode", "x", "kda_decode")
    expect_cpu_error(lambda: fusedstep.kda_decode(args[0].float(), *args[1:], **kw),
                     "kda_decode", "x", "kda_decode")
    expect_cpu_error(lambda: fusedstep.kda_plan(*args, **kw), "kda_plan", "x", "kda_decode")
    g, args, kw = kda_case(tokens=3, records=True)
    expect_cpu_error(lambda: fusedstep.kda_decode(*args, **kw), "kda_decode", "x", "kda_decode")
    expect_cpu_error(
        lambda: fusedstep.kda_commit(g["state"], g["slots"][:, 0].contiguous(), g["accepted"],
                                     g["record_correction"], g["record_key_gate"], g["a_log"],
                                     g["dt_bias"]),
        "kda_commit", "state", "kda_commit")


def test_the_reference_takes_the_same_cpu_tensors():
    g, s = mhc_case()
    r = fusedstep.reference.mhc_boundary(g["x"], g["residual"], g["pre_mix"], g["post_mix"],
                                         g["comb_res_mix"], g["fn"], g["scale"], g["base"],
                                         s["hc_norm_eps"], s["hc_pre_eps"], s["hc_post_scale"],
                                         s["sinkhorn_eps"], s["num_sinkhorn_iters"],
                                         g["norm_weight"], s["norm_eps"])
    assert r["residual_out"].shape == (3, 4, 512)


@pytest.fixture
def h200_plans(monkeypatch):
    """The plan path with CPU tensors: the device's plan() becomes the hand-made H200's,
    and the CPU-tensor rejection (tested above) is lifted."""
    monkeypatch.setattr(ops._C, "MODE_PLAN", _C.MODE_PLAN_H200)
    monkeypatch.setattr(ops, "_reject_cpu", lambda *a, **k: None)


@pytest.mark.parametrize("tokens,hidden", [(1, 5120), (64, 5120), (300, 4096)])
def test_mhc_plan_returns_the_plan_of_the_call(h200_plans, tokens, hidden):
    g, s = mhc_case(tokens, hidden)
    plan = fusedstep.mhc_plan(*mhc_args(g, s))
    assert plan["path"] == "fused" and plan["pdl"] is False and plan["launches"] == 1, plan
    o_res, o_post, o_comb, o_li, o_pre = ops._mhc_empty_outputs(g["x"], g["residual"])
    want = _C.mhc_boundary(g["x"], g["residual"], g["post_mix"], g["comb_res_mix"], g["pre_mix"],
                           g["weight"], g["scale"], g["base"], g["norm_weight"], o_res, o_li,
                           o_pre, o_post, o_comb, 0, s["hc_norm_eps"], s["hc_pre_eps"],
                           s["sinkhorn_eps"], s["hc_post_scale"], s["norm_eps"],
                           s["num_sinkhorn_iters"], _C.MODE_PLAN_H200, 0, None, False)
    assert {k: plan[k] for k in want} == want
    assert fusedstep.mhc_plan(*mhc_args(g, s), pdl=True)["pdl"] is True
    assert fusedstep.mhc_plan(*mhc_args(g, s), composed=True)["path"] == "composed"


@pytest.mark.parametrize("case", [dict(), dict(batch=40, heads=12), dict(tokens=4),
                                  dict(tokens=3, records=True, deferred=True)], ids=str)
def test_kda_plan_returns_the_resolved_schedule(h200_plans, case):
    g, args, kw = kda_case(**case)
    plan = fusedstep.kda_plan(*args, **kw)
    assert plan["path"] == "fused" and plan["pdl"] is False, plan
    assert plan["ctas"] >= 1 and plan["waves"] >= 1, plan
    # The resolved schedule as schedule= plans the same launch.
    again = fusedstep.kda_plan(*args, **kw, schedule=plan["schedule"])
    assert again == plan
    assert fusedstep.kda_plan(*args, **kw, composed=True) == {"path": "composed", "pdl": False}


@pytest.mark.parametrize("case", [dict(state_bf16=True), dict(tokens=3, state_bf16=True)], ids=str)
def test_kda_plan_takes_a_bf16_state(h200_plans, case):
    """A bfloat16 state (a pitched view, as fsdata makes it) is DType::kBf16: plan() accepts
    it, and its resolved schedule given back plans the same launch."""
    g, args, kw = kda_case(**case)
    assert g["state"].dtype == torch.bfloat16 and g["state"].stride(0) == 3 * 128 * 128
    plan = fusedstep.kda_plan(*args, **kw)
    assert plan["path"] == "fused" and plan["ctas"] >= 1 and plan["waves"] >= 1, plan
    assert fusedstep.kda_plan(*args, **kw, schedule=plan["schedule"]) == plan


@pytest.mark.parametrize("dtype", ["float16", "float64", "int16", "uint16"])
def test_kda_state_of_another_dtype_raises_value_error_naming_state(h200_plans, dtype):
    """Only torch.float32 and torch.bfloat16 states: any other dtype (uint16 too, which the
    binding would read as BF16 bit patterns) raises ValueError naming `state` and both."""
    if not hasattr(torch, dtype):
        pytest.skip(f"torch {torch.__version__} has no {dtype}")

    def message(function, state):
        shape = ", ".join(str(n) for n in state.shape)
        return (rf"{function}: state: shape \({shape}\), dtype torch\.{dtype}; expected dtype "
                rf"torch\.float32 or torch\.bfloat16")

    g, args, kw = kda_case()
    bad = list(args)
    bad[8] = torch.empty(g["state"].shape, dtype=getattr(torch, dtype))
    with pytest.raises(ValueError, match=message("kda_plan", bad[8])):
        fusedstep.kda_plan(*bad, **kw)
    # The ops' CUDA kernels check it before anything else (so CPU tensors and None do here).
    names = [n for n in inspect.signature(ops._kda_cuda).parameters if n != "plan"]
    with pytest.raises(ValueError, match=message("kda_decode", bad[8])):
        ops._kda_cuda(**dict(dict.fromkeys(names), state=bad[8]))
    state = torch.empty((19, 2, 128, 128), dtype=getattr(torch, dtype))
    names = list(inspect.signature(ops._commit_cuda).parameters)
    with pytest.raises(ValueError, match=message("kda_commit", state)):
        ops._commit_cuda(**dict(dict.fromkeys(names), state=state))
