# SPDX-License-Identifier: Apache-2.0
"""GPU (torch + an sm_90 GPU; run by scripts/gpu-check.sh): the torch ops bitwise
against the composed reference paths and within docs/numerics.md's lines of the CPU
reference, CUDA graph capture / replay, torch.compile(fullgraph=True), opcheck, and
launches on the current (non-default) stream. Deselected in CI (-m 'not gpu')."""
import numpy as np
import pytest

import fsdata

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def torch():
    import torch as torch_module
    return torch_module


@pytest.fixture(scope="module")
def fs(torch):
    import fusedstep
    assert fusedstep.has_torch
    return fusedstep


def gpu_bufs(torch, bufs):
    """numpy buffers -> CUDA tensors (uint16 bit patterns -> bfloat16)."""
    out = {}
    for k, a in bufs.items():
        if a.dtype == np.uint16:
            t = torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(np.ascontiguousarray(a))
        out[k] = t.to("cuda")
    return out


def bits(torch, t):
    """A tensor's bytes as integers, for bitwise comparison (NaN and -0 included)."""
    t = t.contiguous()
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_bitwise(torch, a, b, what=""):
    assert a.shape == b.shape and a.dtype == b.dtype, what
    diff = (bits(torch, a) != bits(torch, b)).sum().item()
    assert diff == 0, f"{what}: {diff} of {a.numel()} elements differ"


def host(torch, t):
    """CUDA tensor -> float64 numpy values."""
    return t.detach().float().cpu().double().numpy() if t.dtype == torch.bfloat16 else t.cpu().double().numpy()


# ---------------------------------------------------------------- mHC
def mhc_inputs(torch, fs, tokens, hidden, rounding, seed, **kw):
    rng = np.random.default_rng(seed)
    bufs, views, s = fsdata.mhc_case(rng, tokens, hidden, **kw)
    g = views(gpu_bufs(torch, bufs))
    g["weight"] = fs.prepare_boundary_weight(g["fn"], rounding)
    return bufs, views, s, g


def mhc_call(fs, g, s, **kw):
    return fs.mhc_shifted_post_pre_boundary(
        g["x"], g["residual"], g["pre_mix"], g["post_mix"], g["comb_res_mix"], g["weight"],
        g["scale"], g["base"], s["hc_norm_eps"], s["hc_pre_eps"], s["hc_post_scale"],
        s["sinkhorn_eps"], s["num_sinkhorn_iters"], g["norm_weight"], s["norm_eps"], **kw)


MHC_NAMES = ("new_residual", "new_post", "new_comb", "layer_input", "new_pre")


@pytest.mark.parametrize("rounding", ["tf32_rna", "tf32_rne", "fp32"])
def test_prepare_boundary_weight_gpu_equals_host(torch, fs, rounding):
    fn = torch.randn(24, 4 * 4096, device="cuda") * 0.02
    gpu = fs.prepare_boundary_weight(fn, rounding)
    cpu = fs.prepare_boundary_weight(fn.cpu(), rounding)
    assert gpu.dtype == torch.int32 and gpu.shape == fs.weight_shape(4096, rounding)
    assert_bitwise(torch, gpu.cpu(), cpu, "prepared weight")
    assert_bitwise(torch, cpu, torch.from_numpy(fs.reference.prepare_boundary_weight(fn.cpu().numpy(), rounding)))


@pytest.mark.parametrize("rounding", ["tf32_rna", "tf32_rne", "fp32"])
@pytest.mark.parametrize("tokens,hidden", [(1, 4096), (7, 5120), (64, 5120), (3, 7168)])
def test_mhc_fused_bitwise_equals_composed_and_meets_reference(torch, fs, rounding, tokens, hidden):
    bufs, views, s, g = mhc_inputs(torch, fs, tokens, hidden, rounding, tokens * 131 + hidden,
                                   x_pad=8, residual_pad=64)
    fused = mhc_call(fs, g, s)
    composed = mhc_call(fs, g, s, composed=True)
    assert fused[0].shape == (tokens, 4, hidden) and fused[1].shape == (tokens, 4, 1)
    assert fused[2].shape == (tokens, 4, 4) and fused[3].shape == (tokens, hidden)
    assert fused[4].shape == (tokens, 4)
    for name, a, b in zip(MHC_NAMES, fused, composed):
        assert_bitwise(torch, a, b, name)
    again = mhc_call(fs, g, s)
    for name, a, b in zip(MHC_NAMES, fused, again):
        assert_bitwise(torch, a, b, name + " (run to run)")
    # the CPU reference (docs/numerics.md, "GPU composed path" lines)
    v = views(bufs)
    args = (v["x"], v["residual"], v["pre_mix"], v["post_mix"], v["comb_res_mix"], v["fn"],
            v["scale"], v["base"], s["hc_norm_eps"], s["hc_pre_eps"], s["hc_post_scale"],
            s["sinkhorn_eps"], s["num_sinkhorn_iters"], v["norm_weight"], s["norm_eps"])
    r32 = fs.reference.mhc_boundary(*args, rounding=rounding, precision="float32")
    r64 = fs.reference.mhc_boundary(*args, rounding=rounding, precision="float64")
    res = host(torch, fused[0])
    np.testing.assert_array_equal(res, r32["residual_out"])
    np.testing.assert_allclose(res, r64["residual_out"], atol=1e-5, rtol=2 ** -8)
    li = host(torch, fused[3])
    np.testing.assert_allclose(li, r64["layer_input"], atol=3e-2, rtol=2 ** -7)
    ulp = np.abs(r32["layer_input"]) * 2.0 ** -7 + 1e-30
    assert np.all(np.abs(li - r32["layer_input"]) <= ulp)  # within one BF16 ulp of float32 mode
    for name, out, key, atol in ((MHC_NAMES[4], fused[4], "pre", 1.5e-2),
                                 (MHC_NAMES[1], fused[1].reshape(tokens, 4), "post", 3e-2),
                                 (MHC_NAMES[2], fused[2], "comb", 1.5e-2)):
        np.testing.assert_allclose(host(torch, out), r32[key], atol=5e-6, rtol=5e-6, err_msg=name)
        np.testing.assert_allclose(host(torch, out), r64[key], atol=atol, rtol=0, err_msg=name)


def test_mhc_out_variant_views_and_fallbacks(torch, fs):
    T, H = 5, 4096
    bufs, views, s, g = mhc_inputs(torch, fs, T, H, "tf32_rna", 3)
    want = mhc_call(fs, g, s)
    # out= into caller-owned strided views (layer_input rows padded, post as [T, 4, 1])
    li_buf = torch.full((T, H + 64), 7.0, dtype=torch.bfloat16, device="cuda")
    out = (torch.empty(T, 4, H, dtype=torch.bfloat16, device="cuda"),
           torch.empty(T, 4, 1, device="cuda"), torch.empty(T, 4, 4, device="cuda"),
           li_buf[:, :H], torch.empty(T, 4, device="cuda"))
    got = mhc_call(fs, g, s, out=out)
    assert all(a is b for a, b in zip(got, out))
    for name, a, b in zip(MHC_NAMES, got, want):
        assert_bitwise(torch, a, b, name + " (out=)")
    assert torch.all(li_buf[:, H:] == 7.0)  # nothing past the view
    # views the kernel cannot address run through an aligned copy (never None)
    xb = torch.empty(T, H + 1, dtype=torch.bfloat16, device="cuda")
    xb[:, 1:] = g["x"]
    g2 = dict(g, x=xb[:, 1:], pre_mix=g["pre_mix"].t().contiguous().t())
    got2 = mhc_call(fs, g2, s)
    for name, a, b in zip(MHC_NAMES, got2, want):
        assert_bitwise(torch, a, b, name + " (fallback)")
    misaligned_out = torch.empty(T * 4 * H + 1, dtype=torch.bfloat16, device="cuda")[1:].view(T, 4, H)
    got3 = mhc_call(fs, g, s, out=(misaligned_out,) + out[1:])
    assert_bitwise(torch, got3[0], want[0], "misaligned out")
    # empty call
    e = dict(g, x=g["x"][:0], residual=g["residual"][:0], pre_mix=g["pre_mix"][:0],
             post_mix=g["post_mix"][:0], comb_res_mix=g["comb_res_mix"][:0])
    empty = mhc_call(fs, e, s)
    assert empty[0].shape == (0, 4, H) and empty[3].shape == (0, H)


def test_mhc_errors_raise(torch, fs):
    bufs, views, s, g = mhc_inputs(torch, fs, 2, 4096, "tf32_rna", 4)
    with pytest.raises(ValueError, match=r"weight.*words"):
        mhc_call(fs, dict(g, weight=g["weight"][:-1].contiguous()), s)
    with pytest.raises(ValueError, match=r"x: shape \(2, 4095\)"):
        mhc_call(fs, dict(g, x=g["x"][:, :4095]), s)
    with pytest.raises(ValueError, match="sinkhorn_iters"):
        mhc_call(fs, g, dict(s, num_sinkhorn_iters=0))
    with pytest.raises(ValueError, match="expected dtype bfloat16"):
        mhc_call(fs, dict(g, x=g["x"].float()), s)


def test_mhc_plan_is_the_schedule_of_the_device(torch, fs):
    """mhc_plan: the plan() of the tensors' device (the GPU's facts), the call's arguments."""
    bufs, views, s, g = mhc_inputs(torch, fs, 8, 5120, "tf32_rna", 21)
    args = (g["x"], g["residual"], g["pre_mix"], g["post_mix"], g["comb_res_mix"], g["weight"],
            g["scale"], g["base"], s["hc_norm_eps"], s["hc_pre_eps"], s["hc_post_scale"],
            s["sinkhorn_eps"], s["num_sinkhorn_iters"], g["norm_weight"], s["norm_eps"])
    plan = fs.mhc_plan(*args)
    assert plan["path"] == "fused" and plan["pdl"] is False and plan["launches"] == 1, plan
    assert plan["clusters"] * plan["tile"] >= 8 and plan["waves"] >= 1, plan
    assert plan["ctas_per_sm"] in (1, 2), plan
    assert fs.mhc_plan(*args, pdl=True)["pdl"] is True
    with pytest.raises(ValueError, match="mhc_plan: x is a CPU tensor"):
        fs.mhc_plan(g["x"].cpu(), *args[1:])


def test_build_info_covers_this_gpu(torch, fs):
    """The build has code for this GPU: get_device_info succeeds (for a GPU it has no code
    for it raises RuntimeError naming the compute capability and the built architectures)."""
    info = fs._C.device_info(torch.cuda.current_device())
    assert (info["cc_major"], info["cc_minor"]) == torch.cuda.get_device_capability()
    assert fs.build_info()["architectures"]


# ---------------------------------------------------------------- KDA
KDA_GPU_CASES = [
    dict(tokens=1, heads=3),
    dict(tokens=1, heads=12, batch=9, conv_weight_layout="k3", conv_state_layout="tap"),
    dict(tokens=1, heads=2, raw_gate=True, conv_bias=True, conv_weight_bf16=True, conv_state_bf16=False),
    dict(tokens=3, heads=3, token_counts=True, conv_state_layout="tap"),
    dict(tokens=4, heads=2, records=True),
    dict(tokens=2, heads=4, records=True, deferred=True, conv_weight_layout="tap", extra_taps=1),
]
GATE_MODES = {1: ["one_chain", "four_chains", "fma_tree"], 0: ["one_chain", "four_chains"]}


def kda_kwargs(g):
    return {k: g[k] for k in ("f_a", "f_b_weight", "raw_gate", "conv_bias", "accepted",
                              "token_counts", "record_correction", "record_key_gate",
                              "record_rows") if k in g}


def kda_run(fs, g, s, **kw):
    return fs.kda_decode(g["x"], g["raw_beta"], g["output_gate"], g["conv_weight"], g["a_log"],
                         g["dt_bias"], g["norm_weight"], g["conv_state"], g["state"], g["slots"],
                         **kda_kwargs(g), **s, **kw)


def kda_fresh(torch, case, seed):
    bufs, views, s = fsdata.kda_case(np.random.default_rng(seed), **case)
    return bufs, views, s


@pytest.mark.parametrize("case", KDA_GPU_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_kda_fused_bitwise_equals_composed_and_meets_reference(torch, fs, case):
    bufs, views, s = kda_fresh(torch, case, len(str(case)) * 17)
    for gate_mode in GATE_MODES[int(case["tokens"] == 1)]:
        if case.get("raw_gate") and gate_mode != "one_chain":
            continue
        gf = views(gpu_bufs(torch, bufs))
        gc = views(gpu_bufs(torch, bufs))
        out_f = kda_run(fs, gf, s, gate_mode=gate_mode)
        out_c = kda_run(fs, gc, s, gate_mode=gate_mode, composed=True)
        what = f"{case} {gate_mode}"
        assert_bitwise(torch, out_f, out_c, "output " + what)
        for key in ("state", "conv_state", "record_correction", "record_key_gate"):
            if key in gf:
                assert_bitwise(torch, gf[key], gc[key], key + " " + what)
        # the CPU reference, float64 (docs/numerics.md "GPU, composed path vs float64")
        v = views(bufs)
        kw = {k: v[k] for k in ("f_a", "f_b_weight", "raw_gate", "conv_bias", "accepted",
                                "token_counts", "record_rows") if k in v}
        if "record_correction" in v:
            kw["record_slots"] = v["record_correction"].shape[0]
        r = fs.reference.kda_decode(v["x"], v["raw_beta"], v["output_gate"], v["conv_weight"],
                                    v["a_log"], v["dt_bias"], v["norm_weight"], v["conv_state"],
                                    v["state"], v["slots"], gate_mode=gate_mode, **kw, **s)
        heads = v["a_log"].shape[0]
        fo = host(torch, out_f).reshape(-1, heads, 128)
        do = r["output"].reshape(-1, heads, 128)
        rms = np.sqrt((do * do).mean(axis=2))
        assert np.all(np.abs(fo - do).max(axis=2) <= 0.15 * np.maximum(rms, 0.1)), what
        np.testing.assert_array_equal(host(torch, gf["conv_state"]), r["conv_state"])
        fs_, ds = host(torch, gf["state"]), r["state"]
        scale = np.abs(ds).max(axis=(2, 3))
        assert np.all(np.abs(fs_ - ds).max(axis=(2, 3)) <= 5e-2 * scale + 1e-30), what
        if "record_correction" in v:
            rc, dc = host(torch, gf["record_correction"]), r["record_correction"]
            written = ~np.isnan(dc)
            assert np.array_equal(written, ~np.isnan(rc)), what
            per = np.abs(np.where(written, dc, 0)).max(axis=3, keepdims=True)
            assert np.all(np.abs(np.where(written, rc - dc, 0)) <= 2e-2 * per + 1e-30), what
            kg, dk = host(torch, gf["record_key_gate"]), r["record_key_gate"]
            kw_ = ~np.isnan(dk)
            assert np.array_equal(kw_, ~np.isnan(kg)), what
            assert np.all(np.abs(np.where(kw_, kg - dk, 0)) <= 2 ** -7 * np.abs(np.where(kw_, dk, 0)) + 1e-3), what


@pytest.mark.parametrize("schedule", [
    {"cluster": 1, "lanes_per_row": 16, "early": 3},
    {"cluster": 1, "lanes_per_row": 16, "early": 2, "evict_first": 1},
    (4, 16, 1),
])
def test_kda_explicit_schedules_give_the_composed_bits(torch, fs, schedule):
    """A schedule dict or sequence reaches the kernel and gives the composed path's bits."""
    bufs, views, s = kda_fresh(torch, {"batch": 9, "heads": 3, "tokens": 1}, 4242)
    gf = views(gpu_bufs(torch, bufs))
    gc = views(gpu_bufs(torch, bufs))
    out_f = kda_run(fs, gf, s, schedule=schedule)
    out_c = kda_run(fs, gc, s, composed=True)
    assert_bitwise(torch, out_f, out_c, f"output {schedule}")
    for key in ("state", "conv_state"):
        assert_bitwise(torch, gf[key], gc[key], f"{key} {schedule}")


def test_kda_bf16_norm_weight_gives_the_fp32_bits(torch, fs):
    """Kimi K3's module holds the norm weight in BF16: the op takes it as it is and gives
    the bits of the same values in FP32 (q = 1 and a verify)."""
    for case, seed in (({"batch": 9, "heads": 3, "tokens": 1}, 4243), ({"batch": 5, "heads": 3, "tokens": 3}, 4244)):
        bufs, views, s = kda_fresh(torch, case, seed)
        bufs["norm_weight"] = torch.from_numpy(bufs["norm_weight"]).bfloat16().float().numpy()  # BF16 values
        g32 = views(gpu_bufs(torch, bufs))
        g16 = views(gpu_bufs(torch, bufs))
        g16["norm_weight"] = g16["norm_weight"].bfloat16()
        out32 = kda_run(fs, g32, s)
        out16 = kda_run(fs, g16, s)
        assert_bitwise(torch, out16, out32, f"output {case}")
        for key in ("state", "conv_state"):
            assert_bitwise(torch, g16[key], g32[key], f"{key} {case}")


def test_kda_plan_schedule_given_back_runs_the_same(torch, fs):
    """kda_plan: the schedule of the tensors' device with every default resolved; given
    back as schedule=, the call plans and computes the same."""
    bufs, views, s = kda_fresh(torch, {"batch": 9, "heads": 12, "tokens": 1}, 77)
    gd = views(gpu_bufs(torch, bufs))
    ge = views(gpu_bufs(torch, bufs))
    args = lambda g: (g["x"], g["raw_beta"], g["output_gate"], g["conv_weight"], g["a_log"],  # noqa: E731
                      g["dt_bias"], g["norm_weight"], g["conv_state"], g["state"], g["slots"])
    plan = fs.kda_plan(*args(gd), **kda_kwargs(gd), **s)
    assert plan["path"] == "fused" and plan["ctas"] >= 1 and plan["waves"] >= 1, plan
    assert fs.kda_plan(*args(gd), **kda_kwargs(gd), **s, schedule=plan["schedule"]) == plan
    out_default = kda_run(fs, gd, s)
    out_explicit = kda_run(fs, ge, s, schedule=plan["schedule"])
    assert_bitwise(torch, out_default, out_explicit, "output")
    assert_bitwise(torch, gd["state"], ge["state"], "state")


def test_kda_commit_matches_reference(torch, fs):
    case = dict(tokens=4, heads=3, records=True, deferred=True)
    bufs, views, s = kda_fresh(torch, case, 99)
    g = views(gpu_bufs(torch, bufs))
    kda_run(fs, g, s)
    commit_slots = g["slots"][:, 0].contiguous()
    accepted = torch.tensor([4, 2, 3, 1, 0], dtype=torch.int32, device="cuda")
    before = g["state"].clone()
    fs.kda_commit(g["state"], commit_slots, accepted, g["record_correction"], g["record_key_gate"],
                  g["a_log"], g["dt_bias"], record_rows=g["record_rows"])
    want = fs.reference.kda_commit(before, commit_slots, accepted, g["record_correction"],
                                   g["record_key_gate"], g["a_log"], g["dt_bias"], tokens=4,
                                   record_rows=g["record_rows"])
    got = host(torch, g["state"])
    ok = np.isfinite(want)
    scale = np.abs(np.where(ok, want, 0)).max(axis=(2, 3), keepdims=True)
    assert np.all(np.abs(np.where(ok, got - want, 0)) <= 1e-4 * scale + 1e-30)
    assert not torch.equal(before, g["state"])


# ---------------------------------------------------------------- KDA, BF16 state
KDA_BF16_CASES = [
    dict(tokens=1, heads=3, batch=9),
    dict(tokens=1, heads=12, batch=6, conv_weight_layout="k3", conv_state_layout="tap"),
    dict(tokens=2, heads=2, batch=5),
    dict(tokens=4, heads=3, batch=5, token_counts=True, conv_state_layout="tap"),
    dict(tokens=8, heads=2, batch=5, raw_gate=True),
]


def poisoned_output(torch, g, pattern):
    """[rows, dim] BF16 filled with one NaN bit pattern: a row the call writes loses it."""
    rows, dim = g["x"].shape[0], g["a_log"].shape[0] * 128
    return torch.full((rows, dim), pattern - (1 << 16), dtype=torch.int16, device="cuda").view(torch.bfloat16)


def kda_step(torch, fs, bufs, views, s, poison, **kw):
    """One call on fresh CUDA copies of the buffers, into a poisoned output: (buffers,
    views, output). The buffers hold the whole state (the views' pitch included)."""
    b = gpu_bufs(torch, bufs)
    g = views(b)
    return b, g, kda_run(fs, g, s, out=poisoned_output(torch, g, poison), **kw)


def fp32_values(bufs):
    """The buffers with the BF16 state as FP32 values (the same values, exactly)."""
    return dict(bufs, state=fsdata.bf16_value(bufs["state"]))


def u16(torch, t):
    """A BF16 CUDA tensor's bit patterns as a numpy uint16 array."""
    return bits(torch, t).cpu().numpy().view(np.uint16)


def reference_kda(fs, v, s, **kw):
    kw.update({k: v[k] for k in ("f_a", "f_b_weight", "raw_gate", "conv_bias", "accepted",
                                 "token_counts", "record_rows") if k in v})
    if "record_correction" in v:
        kw["record_slots"] = v["record_correction"].shape[0]
    return fs.reference.kda_decode(v["x"], v["raw_beta"], v["output_gate"], v["conv_weight"],
                                   v["a_log"], v["dt_bias"], v["norm_weight"], v["conv_state"],
                                   v["state"], v["slots"], **kw, **s)


@pytest.mark.parametrize("case", KDA_BF16_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_kda_bf16_state_bitwise_equals_composed_and_the_fp32_state(torch, fs, case):
    """A BF16 recurrent state (a pitched view: the buffer holds one head more per slot),
    fresh random values: the fused op bitwise equal to the composed path from differently
    poisoned outputs (output, state, conv state; q = 1 and verify q = 2-8 with a state
    write per token); the FP32 state of the same values gives the same output and conv
    state, and its states rounded to BF16 (nearest even) are the BF16 run's, pitch
    included; slots the step does not write keep their bytes; docs/numerics.md's float64
    lines hold (output within 0.15 of the head's rms, state within 5e-2 of the head's
    largest element: the BF16 rounding of a stored state, 2^-9 relative, is far inside)."""
    heads, q = case["heads"], case["tokens"]
    bufs, views, s = kda_fresh(torch, dict(case, state_bf16=True), 600 + len(str(case)))
    bf, gf, of = kda_step(torch, fs, bufs, views, s, 0xFFFF)
    bc, gc, oc = kda_step(torch, fs, bufs, views, s, 0xFFFE, composed=True)
    what = str(case)
    assert gf["state"].dtype == torch.bfloat16 and gf["state"].stride(0) == (heads + 1) * 16384
    assert_bitwise(torch, of, oc, "output " + what)
    assert_bitwise(torch, gf["state"], gc["state"], "state " + what)
    assert_bitwise(torch, gf["conv_state"], gc["conv_state"], "conv_state " + what)
    assert torch.isfinite(of.float()).all() and (of[q:2 * q].float() == 0).all(), what  # request 1: padding
    b32, g32, o32 = kda_step(torch, fs, fp32_values(bufs), views, s, 0xFFFF)
    assert_bitwise(torch, of, o32, "output vs the FP32 state " + what)
    assert_bitwise(torch, gf["conv_state"], g32["conv_state"], "conv_state vs the FP32 state " + what)
    assert_bitwise(torch, bf["state"], b32["state"].bfloat16(), "state vs the FP32 state's, rounded " + what)
    # the float64 reference (a BF16 state: stores rounded to BF16 once)
    v = views(bufs)
    r = reference_kda(fs, v, s)
    after, before = u16(torch, bf["state"]), bufs["state"]
    written = np.any(r["state"] != fsdata.bf16_value(v["state"]), axis=(1, 2, 3))
    assert written.any() and not written.all(), what
    assert np.array_equal(after[~written], before[~written]), "unwritten slots changed " + what
    assert np.array_equal(after[:, heads], before[:, heads]), "the pitch changed " + what
    fo, do = host(torch, of).reshape(-1, heads, 128), r["output"].reshape(-1, heads, 128)
    rms = np.sqrt((do * do).mean(axis=2))
    assert np.all(np.abs(fo - do).max(axis=2) <= 0.15 * np.maximum(rms, 0.1)), what
    np.testing.assert_array_equal(host(torch, gf["conv_state"]), r["conv_state"])
    fs_, ds = host(torch, gf["state"]), r["state"]
    scale = np.abs(ds).max(axis=(2, 3))
    assert np.all(np.abs(fs_ - ds).max(axis=(2, 3)) <= 5e-2 * scale + 1e-30), what


def test_kda_bf16_checkpoint_records_and_commit(torch, fs):
    """RecoverSSM with a BF16 checkpoint: the verify's records and output bitwise equal to
    the composed path's and to the FP32 checkpoint's of the same values, written for the
    active requests (NaN-poisoned otherwise), every state slot's bytes unchanged; the commit
    equals the FP32 checkpoint's commit rounded to BF16, leaves the slots it does not fold
    into byte-identical, and is within 1e-4 of the head's largest element plus one BF16
    ulp (2^-7 relative) of the float64 reference."""
    case = dict(tokens=4, heads=3, batch=7, records=True, deferred=True, state_bf16=True)
    bufs, views, s = kda_fresh(torch, case, 611)
    bf, gf, of = kda_step(torch, fs, bufs, views, s, 0xFFFF)
    bc, gc, oc = kda_step(torch, fs, bufs, views, s, 0xFFFE, composed=True)
    b32, g32, o32 = kda_step(torch, fs, fp32_values(bufs), views, s, 0xFFFF)
    assert_bitwise(torch, of, oc, "output")
    assert_bitwise(torch, of, o32, "output vs the FP32 checkpoint")
    for key in ("conv_state", "record_correction", "record_key_gate"):
        assert_bitwise(torch, gf[key], gc[key], key)
        assert_bitwise(torch, gf[key], g32[key], key + " vs the FP32 checkpoint")
    for b in (bf, bc):
        assert np.array_equal(u16(torch, b["state"]), bufs["state"]), "a verify with records wrote a state"
    v = views(bufs)
    r = reference_kda(fs, v, s)
    for key in ("record_correction", "record_key_gate"):
        assert np.array_equal(np.isnan(host(torch, gf[key])), np.isnan(r[key])), key
    assert np.isfinite(r["record_correction"]).any()

    commit_slots = gf["slots"][:, 0].contiguous()
    accepted = torch.tensor([4, 0, 3, 0, 2, 4, 1], dtype=torch.int32, device="cuda")  # 1, 3: padding
    checkpoint = gf["state"].clone()
    for g in (gf, g32):
        fs.kda_commit(g["state"], commit_slots, accepted, g["record_correction"], g["record_key_gate"],
                      g["a_log"], g["dt_bias"], record_rows=g["record_rows"])
    assert_bitwise(torch, bf["state"], b32["state"].bfloat16(), "commit vs the FP32 checkpoint's, rounded")
    want = fs.reference.kda_commit(checkpoint, commit_slots, accepted, gf["record_correction"],
                                   gf["record_key_gate"], gf["a_log"], gf["dt_bias"], tokens=4,
                                   record_rows=gf["record_rows"])
    folded = np.any(want != fsdata.bf16_value(v["state"]), axis=(1, 2, 3))
    assert folded.sum() == 3, folded  # requests 4, 5 and 6
    after = u16(torch, bf["state"])
    assert np.array_equal(after[~folded], bufs["state"][~folded]), "the commit changed other slots"
    assert np.array_equal(after[:, 3], bufs["state"][:, 3]), "the commit changed the pitch"
    got = host(torch, gf["state"])
    scale = np.abs(want).max(axis=(2, 3), keepdims=True)
    assert np.all(np.abs(got - want) <= 1e-4 * scale + 2 ** -7 * np.abs(want) + 1e-30)


def test_kda_state_dtype_errors_on_the_gpu(torch, fs):
    """A CUDA state of another dtype: ValueError naming `state` and both dtypes, from the
    decode, the plan and the commit, before anything runs."""
    bufs, views, s = kda_fresh(torch, dict(tokens=3, heads=2, records=True), 612)
    g = views(gpu_bufs(torch, bufs))
    half = g["state"].half()
    message = r"state: shape \([0-9]+, 2, 128, 128\), dtype torch\.float16; expected dtype torch\.float32 or torch\.bfloat16"
    with pytest.raises(ValueError, match="kda_decode: " + message):
        kda_run(fs, dict(g, state=half), s)
    with pytest.raises(ValueError, match="kda_plan: " + message):
        fs.kda_plan(g["x"], g["raw_beta"], g["output_gate"], g["conv_weight"], g["a_log"], g["dt_bias"],
                    g["norm_weight"], g["conv_state"], half, g["slots"], **kda_kwargs(g), **s)
    with pytest.raises(ValueError, match="kda_commit: " + message):
        fs.kda_commit(half, g["slots"][:, 0].contiguous(), g["accepted"], g["record_correction"],
                      g["record_key_gate"], g["a_log"], g["dt_bias"])
    assert torch.isnan(g["record_correction"]).all()  # nothing ran


# ---------------------------------------------------------------- trainable parameters
def test_ops_accept_trainable_parameters(torch, fs):
    """Weights held as nn.Parameters (requires_grad=True) outside inference mode, as a
    model's modules hold them: DLPack refuses to export such tensors, so the ops pass
    them to the binding as detached aliases. Same bits as plain tensors, for both ops,
    fused and composed, and the parameters stay the caller's (trainable, same storage)."""
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    P = torch.nn.Parameter
    # mHC: fn (weight preparation on the GPU and the CPU), scale, base, norm_weight; and
    # an activation that requires grad (x).
    T, H = 5, 4096
    bufs, views, s, g = mhc_inputs(torch, fs, T, H, "tf32_rna", 21)
    want = mhc_call(fs, g, s)
    fn = P(g["fn"].clone())
    assert_bitwise(torch, fs.prepare_boundary_weight(fn, "tf32_rna"), g["weight"], "weight from a parameter")
    assert_bitwise(torch, fs.prepare_boundary_weight(P(g["fn"].cpu()), "tf32_rna"), g["weight"].cpu(),
                   "weight from a CPU parameter")
    params = {k: P(g[k].clone()) for k in ("scale", "base", "norm_weight")}
    gp = dict(g, x=g["x"].clone().requires_grad_(), **params)
    for composed in (False, True):
        got = mhc_call(fs, gp, s, composed=composed)
        for name, a, b in zip(MHC_NAMES, got, want):
            assert_bitwise(torch, a, b, f"{name} (parameters, composed={composed})")
    outs = tuple(torch.empty_like(t) for t in want)
    mhc_call(fs, gp, s, out=outs)
    for name, a, b in zip(MHC_NAMES, outs, want):
        assert_bitwise(torch, a, b, name + " (parameters, out=)")
    for k, p in params.items():
        assert p.requires_grad and p.grad is None and p.is_leaf, k
    # KDA: every weight a parameter (conv weight as a strided [4, 3 dim] view).
    case = dict(tokens=1, heads=3, conv_bias=True, conv_weight_layout="tap")
    kb, kviews, ks = kda_fresh(torch, case, 22)
    plain = kviews(gpu_bufs(torch, kb))
    out_plain = kda_run(fs, plain, ks)
    for composed in (False, True):
        trained = kviews(gpu_bufs(torch, kb))
        for k in ("conv_weight", "conv_bias", "f_b_weight", "a_log", "dt_bias", "norm_weight"):
            before = trained[k]
            trained[k] = P(before)
            assert trained[k].data_ptr() == before.data_ptr() and trained[k].stride() == before.stride()
        out = kda_run(fs, trained, ks, composed=composed)
        what = f"(parameters, composed={composed})"
        assert_bitwise(torch, out, out_plain, "kda output " + what)
        assert_bitwise(torch, trained["state"], plain["state"], "kda state " + what)
        assert_bitwise(torch, trained["conv_state"], plain["conv_state"], "kda conv state " + what)
    # verify with records, then the commit, with parameter weights
    case = dict(tokens=3, heads=2, records=True, deferred=True)
    kb, kviews, ks = kda_fresh(torch, case, 23)
    plain, trained = kviews(gpu_bufs(torch, kb)), kviews(gpu_bufs(torch, kb))
    for k in ("conv_weight", "f_b_weight", "a_log", "dt_bias", "norm_weight"):
        trained[k] = P(trained[k])
    assert_bitwise(torch, kda_run(fs, trained, ks), kda_run(fs, plain, ks), "kda verify output (parameters)")
    for g_ in (plain, trained):
        fs.kda_commit(g_["state"], g_["slots"][:, 0].contiguous(), g_["accepted"], g_["record_correction"],
                      g_["record_key_gate"], g_["a_log"], g_["dt_bias"], record_rows=g_["record_rows"])
    assert_bitwise(torch, trained["state"], plain["state"], "kda state after commit (parameters)")


# ---------------------------------------------------------------- graphs, compile, streams
def test_cuda_graph_capture_and_replay(torch, fs):
    # mHC: out= into static outputs; KDA: in-place state, two steps replayed.
    T, H = 4, 4096
    b1, views, s, g = mhc_inputs(torch, fs, T, H, "tf32_rna", 10)
    b2, _, _, g2 = mhc_inputs(torch, fs, T, H, "tf32_rna", 11)
    shared = {k: g[k] for k in ("weight", "scale", "base", "norm_weight")}
    want1, want2 = mhc_call(fs, g, s), mhc_call(fs, dict(g2, **shared), s)
    static = {k: g[k].clone() for k in ("x", "residual", "pre_mix", "post_mix", "comb_res_mix")}
    static.update({k: g[k] for k in ("weight", "scale", "base", "norm_weight")})
    outs = tuple(torch.empty_like(t) for t in want1)

    case = dict(tokens=1, heads=3, batch=6)
    kb, kviews, ks = kda_fresh(torch, case, 5)
    kb2, _, _ = kda_fresh(torch, case, 6)
    eager = kviews(gpu_bufs(torch, kb))
    step2_inputs = kviews(gpu_bufs(torch, kb2))
    e1 = kda_run(fs, eager, ks).clone()
    for k in ("x", "f_a", "raw_beta", "output_gate"):
        eager[k].copy_(step2_inputs[k])
    e2 = kda_run(fs, eager, ks).clone()
    kg = kviews(gpu_bufs(torch, kb))
    state0, conv0 = kg["state"].clone(), kg["conv_state"].clone()
    kout = torch.empty_like(e1)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mhc_call(fs, static, s, out=outs)
        kda_run(fs, kg, ks, out=kout)
    kg["state"].copy_(state0)
    kg["conv_state"].copy_(conv0)
    graph.replay()
    for name, a, b in zip(MHC_NAMES, outs, want1):
        assert_bitwise(torch, a, b, name + " (replay 1)")
    assert_bitwise(torch, kout, e1, "kda output (replay 1)")
    for k in ("x", "residual", "pre_mix", "post_mix", "comb_res_mix"):
        static[k].copy_(g2[k])
    for k in ("x", "f_a", "raw_beta", "output_gate"):
        kg[k].copy_(step2_inputs[k])
    graph.replay()
    for name, a, b in zip(MHC_NAMES, outs, want2):
        assert_bitwise(torch, a, b, name + " (replay 2)")
    assert_bitwise(torch, kout, e2, "kda output (replay 2)")
    assert_bitwise(torch, kg["state"], eager["state"], "kda state after two replays")
    assert_bitwise(torch, kg["conv_state"], eager["conv_state"], "kda conv state after two replays")


def test_kda_bf16_state_cuda_graph(torch, fs):
    """BF16 states inside one CUDA graph: a q = 1 decode, then a verify with records and
    its commit; captured once, replayed twice with the second step's activations copied
    in, bitwise equal to the same calls run eagerly."""
    dec = dict(tokens=1, heads=3, batch=6, state_bf16=True)
    ver = dict(tokens=3, heads=2, batch=6, records=True, state_bf16=True)
    (db, dviews, ds), (db2, _, _) = kda_fresh(torch, dec, 620), kda_fresh(torch, dec, 621)
    (vb, vviews, vs), (vb2, _, _) = kda_fresh(torch, ver, 622), kda_fresh(torch, ver, 623)
    accepted = torch.tensor([3, 0, 2, 0, 1, 2], dtype=torch.int32, device="cuda")  # 1, 3: padding
    activations = ("x", "f_a", "raw_beta", "output_gate")

    def step(d, v, d_out, v_out):
        kda_run(fs, d, ds, out=d_out)
        kda_run(fs, v, vs, out=v_out)
        fs.kda_commit(v["state"], v["slots"][:, 0].contiguous(), accepted, v["record_correction"],
                      v["record_key_gate"], v["a_log"], v["dt_bias"])

    def calls():
        d, v = dviews(gpu_bufs(torch, db)), vviews(gpu_bufs(torch, vb))
        return d, v, poisoned_output(torch, d, 0xFFFF), poisoned_output(torch, v, 0xFFFF)

    second_d, second_v = dviews(gpu_bufs(torch, db2)), vviews(gpu_bufs(torch, vb2))
    ed, ev, ed_out, ev_out = calls()
    step(ed, ev, ed_out, ev_out)
    first = (ed_out.clone(), ev_out.clone())
    for k in activations:
        ed[k].copy_(second_d[k])
        ev[k].copy_(second_v[k])
    step(ed, ev, ed_out, ev_out)

    gd, gv, gd_out, gv_out = calls()
    saved = {k: t.clone() for k, t in (("d", gd["state"]), ("dc", gd["conv_state"]), ("v", gv["state"]),
                                        ("vc", gv["conv_state"]), ("rc", gv["record_correction"]),
                                        ("kg", gv["record_key_gate"]))}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(gd, gv, gd_out, gv_out)
    for k, t in (("d", gd["state"]), ("dc", gd["conv_state"]), ("v", gv["state"]), ("vc", gv["conv_state"]),
                 ("rc", gv["record_correction"]), ("kg", gv["record_key_gate"])):
        t.copy_(saved[k])
    graph.replay()
    assert_bitwise(torch, gd_out, first[0], "decode output (replay 1)")
    assert_bitwise(torch, gv_out, first[1], "verify output (replay 1)")
    for k in activations:
        gd[k].copy_(second_d[k])
        gv[k].copy_(second_v[k])
    graph.replay()
    assert_bitwise(torch, gd_out, ed_out, "decode output (replay 2)")
    assert_bitwise(torch, gv_out, ev_out, "verify output (replay 2)")
    for key in ("state", "conv_state"):
        assert_bitwise(torch, gd[key], ed[key], f"decode {key} after two replays")
    for key in ("state", "conv_state", "record_correction", "record_key_gate"):
        assert_bitwise(torch, gv[key], ev[key], f"verify {key} after two replays")
    assert not torch.equal(gv["state"], vviews(gpu_bufs(torch, vb))["state"])  # the commits folded


def test_torch_compile_fullgraph(torch, fs):
    T, H = 3, 4096
    b, views, s, g = mhc_inputs(torch, fs, T, H, "tf32_rna", 12)
    case = dict(tokens=2, heads=2, batch=4)
    kb, kviews, ks = kda_fresh(torch, case, 13)
    kb16, kviews16, _ = kda_fresh(torch, dict(tokens=1, heads=2, batch=4, state_bf16=True), 19)

    def step(x, residual, pre_mix, post_mix, comb, weight, scale, base, norm_weight, kd, k16):
        new_res, new_post, new_comb, li, new_pre = fs.mhc_shifted_post_pre_boundary(
            x, residual, pre_mix, post_mix, comb, weight, scale, base, 1e-6, 1e-6, 2.0, 1e-6, 20,
            norm_weight, 1e-6)
        o = fs.kda_decode(kd["x"], kd["raw_beta"], kd["output_gate"], kd["conv_weight"],
                          kd["a_log"], kd["dt_bias"], kd["norm_weight"], kd["conv_state"],
                          kd["state"], kd["slots"], f_a=kd["f_a"], f_b_weight=kd["f_b_weight"],
                          accepted=kd["accepted"], tokens=2)
        o16 = fs.kda_decode(k16["x"], k16["raw_beta"], k16["output_gate"], k16["conv_weight"],
                            k16["a_log"], k16["dt_bias"], k16["norm_weight"], k16["conv_state"],
                            k16["state"], k16["slots"], f_a=k16["f_a"], f_b_weight=k16["f_b_weight"])
        return new_res, new_post * 2, new_comb, li.float() + 1, new_pre, o, o16

    args = [g[k] for k in ("x", "residual", "pre_mix", "post_mix", "comb_res_mix", "weight",
                           "scale", "base", "norm_weight")]
    ke, ke16 = kviews(gpu_bufs(torch, kb)), kviews16(gpu_bufs(torch, kb16))
    kc, kc16 = kviews(gpu_bufs(torch, kb)), kviews16(gpu_bufs(torch, kb16))
    want = step(*args, ke, ke16)
    compiled = torch.compile(step, fullgraph=True)
    got = compiled(*args, kc, kc16)
    for i, (a, b_) in enumerate(zip(got, want)):
        assert_bitwise(torch, a, b_, f"compiled output {i}")
    assert_bitwise(torch, kc["state"], ke["state"], "compiled kda state (in place)")
    assert_bitwise(torch, kc["conv_state"], ke["conv_state"], "compiled kda conv state")
    assert kc16["state"].dtype == torch.bfloat16
    assert_bitwise(torch, kc16["state"], ke16["state"], "compiled kda BF16 state (in place)")


def test_opcheck(torch, fs):
    from torch.library import opcheck
    T, H = 2, 4096
    b, views, s, g = mhc_inputs(torch, fs, T, H, "tf32_rna", 14)
    mhc_args = (g["x"], g["residual"], g["pre_mix"], g["post_mix"], g["comb_res_mix"],
                g["weight"], g["scale"], g["base"], 1e-6, 1e-6, 2.0, 1e-6, 20, g["norm_weight"],
                1e-6, 0, False, False)
    opcheck(torch.ops.fusedstep.mhc_boundary.default, mhc_args)
    outs = tuple(torch.empty_like(t) for t in torch.ops.fusedstep.mhc_boundary(*mhc_args))
    opcheck(torch.ops.fusedstep.mhc_boundary_out.default, mhc_args + outs)
    opcheck(torch.ops.fusedstep.prepare_boundary_weight.default, (g["fn"], 0))
    opcheck(torch.ops.fusedstep.prepare_boundary_weight.default, (g["fn"].cpu(), 2))

    def kda_args(kv, records):
        a = (kv["x"], kv.get("f_a"), kv.get("raw_gate"), kv["raw_beta"], kv["output_gate"],
             kv["conv_weight"], kv.get("conv_bias"), kv.get("f_b_weight"), kv["a_log"],
             kv["dt_bias"], kv["norm_weight"], kv["conv_state"], kv["state"], kv["slots"],
             kv.get("accepted"), kv.get("token_counts"),
             torch.empty(kv["x"].shape[0], kv["a_log"].shape[0] * 128, dtype=torch.bfloat16,
                         device="cuda"))
        if records:
            a += (kv["record_correction"], kv["record_key_gate"], kv.get("record_rows"))
        return a + (kv_s["tokens"], -5.0, 128 ** -0.5, 1e-5, 0, [0, 0, -1, 0, 0], False, False)

    kb, kviews, kv_s = kda_fresh(torch, dict(tokens=1, heads=2), 15)
    opcheck(torch.ops.fusedstep.kda_decode.default, kda_args(kviews(gpu_bufs(torch, kb)), False))
    kb, kviews, kv_s = kda_fresh(torch, dict(tokens=3, heads=2, records=True, deferred=True), 16)
    kv = kviews(gpu_bufs(torch, kb))
    opcheck(torch.ops.fusedstep.kda_decode_records.default, kda_args(kv, True))
    torch.ops.fusedstep.kda_decode_records(*kda_args(kv, True))
    opcheck(torch.ops.fusedstep.kda_commit.default,
            (kv["state"], kv["slots"][:, 0].contiguous(), kv["accepted"], kv["record_correction"],
             kv["record_key_gate"], kv["record_rows"], kv["a_log"], kv["dt_bias"], 3, -5.0, False))
    # The KDA ops with a BF16 state (the same schemas and fake impls).
    kb, kviews, kv_s = kda_fresh(torch, dict(tokens=1, heads=2, state_bf16=True), 24)
    opcheck(torch.ops.fusedstep.kda_decode.default, kda_args(kviews(gpu_bufs(torch, kb)), False))
    kb, kviews, kv_s = kda_fresh(torch, dict(tokens=3, heads=2, records=True, deferred=True, state_bf16=True), 25)
    kv = kviews(gpu_bufs(torch, kb))
    assert kv["state"].dtype == torch.bfloat16
    opcheck(torch.ops.fusedstep.kda_decode_records.default, kda_args(kv, True))
    torch.ops.fusedstep.kda_decode_records(*kda_args(kv, True))
    opcheck(torch.ops.fusedstep.kda_commit.default,
            (kv["state"], kv["slots"][:, 0].contiguous(), kv["accepted"], kv["record_correction"],
             kv["record_key_gate"], kv["record_rows"], kv["a_log"], kv["dt_bias"], 3, -5.0, False))


def test_ops_run_on_the_current_stream(torch, fs):
    """On a non-default stream held by a long sleep, the ops' results appear only after
    the sleep: they were enqueued on that stream, not on the legacy default stream."""
    T, H = 3, 4096
    b, views, s, g = mhc_inputs(torch, fs, T, H, "tf32_rna", 17)
    want = mhc_call(fs, g, s)
    case = dict(tokens=1, heads=2)
    kb, kviews, ks = kda_fresh(torch, case, 18)
    ke = kviews(gpu_bufs(torch, kb))
    kwant = kda_run(fs, ke, ks)
    kg = kviews(gpu_bufs(torch, kb))
    torch.cuda.synchronize()
    outs = tuple(torch.full_like(t, 3.0) for t in want)
    kout = torch.full_like(kwant, 3.0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s at 2 GHz
        mhc_call(fs, g, s, out=outs)
        kda_run(fs, kg, ks, out=kout)
    early = [t.clone() for t in outs] + [kout.clone()]  # on the default stream, during the sleep
    torch.cuda.synchronize()
    for t in early:
        assert torch.all(t == 3.0), "an op ran before the sleep on its stream ended"
    for name, a, b_ in zip(MHC_NAMES, outs, want):
        assert_bitwise(torch, a, b_, name + " (side stream)")
    assert_bitwise(torch, kout, kwant, "kda output (side stream)")


def test_example_decode_loop(torch, fs):
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "decode_loop.py")
    spec = importlib.util.spec_from_file_location("decode_loop", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    summary = module.main(layers=2, steps=3, quiet=True)
    assert summary["checked"] > 0 and summary["failed"] == 0, summary
