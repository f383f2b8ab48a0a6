# SPDX-License-Identifier: Apache-2.0
"""CPU: the CPU reference through the binding against a float64 numpy implementation of
docs/numerics.md (independent code), in every layout the binding accepts."""
import numpy as np
import pytest

import fusedstep
from fusedstep import reference as ref
import fsdata


def close64(a, b, rtol=1e-9, atol=1e-11):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


# ---------------------------------------------------------------- mHC
@pytest.mark.parametrize("rounding", ["tf32_rna", "tf32_rne", "fp32"])
@pytest.mark.parametrize("tokens,hidden", [(1, 512), (3, 1024)])
def test_mhc_float64_matches_numpy(rounding, tokens, hidden):
    rng = np.random.default_rng(tokens * 7 + hidden)
    bufs, views, s = fsdata.mhc_case(rng, tokens, hidden, x_pad=8, residual_pad=16)
    v = views(bufs)
    r = ref.mhc_boundary(v["x"], v["residual"], v["pre_mix"], v["post_mix"], v["comb_res_mix"],
                         v["fn"], v["scale"], v["base"], s["hc_norm_eps"], s["hc_pre_eps"],
                         s["hc_post_scale"], s["sinkhorn_eps"], s["num_sinkhorn_iters"],
                         v["norm_weight"], s["norm_eps"], rounding=rounding)
    want = fsdata.mhc_numpy64(v, s, fusedstep.rounding_index(rounding))
    for key in ("residual_out", "li", "layer_input", "mix", "ssq", "pre", "post", "comb"):
        close64(r[key], want[key])
    assert r["residual_out"].shape == (tokens, 4, hidden)
    assert r["post"].shape == (tokens, 4) and r["comb"].shape == (tokens, 4, 4)


@pytest.mark.parametrize("rounding", ["tf32_rna", "fp32"])
def test_mhc_float32_within_documented_lines(rounding):
    rng = np.random.default_rng(11)
    bufs, views, s = fsdata.mhc_case(rng, 4, 1024)
    v = views(bufs)
    args = (v["x"], v["residual"], v["pre_mix"], v["post_mix"], v["comb_res_mix"], v["fn"],
            v["scale"], v["base"], s["hc_norm_eps"], s["hc_pre_eps"], s["hc_post_scale"],
            s["sinkhorn_eps"], s["num_sinkhorn_iters"], v["norm_weight"], s["norm_eps"])
    f = ref.mhc_boundary(*args, rounding=rounding, precision="float32")
    d = fsdata.mhc_numpy64(v, s, fusedstep.rounding_index(rounding))
    # residual_out is a BF16 value: within the half ulp plus the FP32 FMAs (numerics.md).
    x = fsdata.bf16_value(v["x"]).astype(np.float64)
    r = fsdata.bf16_value(v["residual"]).astype(np.float64)
    M = (np.abs(v["post_mix"].reshape(-1, 4, 1) * x[:, None, :]) +
         np.einsum("tjs,tjh->tsh", np.abs(v["comb_res_mix"]), np.abs(r)))
    bound = 2.0 ** -8 * np.abs(d["residual_out"]) + 6 * 2.0 ** -24 * M + 2.0 ** -120
    assert np.all(np.abs(f["residual_out"] - d["residual_out"]) <= bound)
    assert np.all(fsdata.bf16_value(fsdata.bf16_bits(f["residual_out"])) == f["residual_out"])
    # the GPU's lines against float64 (docs/numerics.md, mHC "against float64")
    np.testing.assert_allclose(f["layer_input"], d["layer_input"], atol=3e-2, rtol=2 ** -7)
    np.testing.assert_allclose(f["pre"], d["pre"], atol=1.5e-2, rtol=0)
    np.testing.assert_allclose(f["post"], d["post"], atol=3e-2, rtol=0)
    np.testing.assert_allclose(f["comb"], d["comb"], atol=1.5e-2, rtol=0)
    # Sinkhorn: the last pass normalizes columns
    np.testing.assert_allclose(f["comb"].sum(axis=1), 1.0, atol=4 * s["sinkhorn_eps"] + 1e-5)


def test_mhc_float32_bf16_outputs_are_bf16_values():
    rng = np.random.default_rng(5)
    bufs, views, s = fsdata.mhc_case(rng, 2, 512)
    v = views(bufs)
    f = ref.mhc_boundary(v["x"], v["residual"], v["pre_mix"], v["post_mix"], v["comb_res_mix"],
                         v["fn"], v["scale"], v["base"], s["hc_norm_eps"], s["hc_pre_eps"],
                         s["hc_post_scale"], s["sinkhorn_eps"], s["num_sinkhorn_iters"],
                         v["norm_weight"], s["norm_eps"], precision="float32")
    li = f["layer_input"]
    assert np.all(fsdata.bf16_value(fsdata.bf16_bits(li)) == li)
    assert np.all(np.isfinite(li)) and np.abs(li).max() > 0


@pytest.mark.parametrize("rounding,parts", [("tf32_rna", 2), ("tf32_rne", 2), ("fp32", 3)])
def test_prepared_weight_holds_the_rounded_weight_parts(rounding, parts):
    """The prepared words are a permutation of the exact BF16 parts of the rounded
    weights plus zero padding (layout-free check of rounding and split)."""
    rng = np.random.default_rng(3)
    hidden = 512
    fn = (rng.standard_normal((24, 4 * hidden)) * 0.02).astype(np.float32)
    # ties of both TF32 roundings, tiny values flushed, exact values
    fn[0, :8] = np.array([0x3F801000, 0x3F803000, 0xBF801000, 0x3F800FFF, 0x0C000000,
                          0x3F800000, 0x00000001, 0x80000000], dtype=np.uint32).view(np.float32)
    w = ref.prepare_boundary_weight(fn, rounding)
    assert w.dtype == np.int32 and w.shape == fusedstep.weight_shape(hidden, rounding)
    halves = np.sort(fsdata.bf16_value(w.view(np.uint16).ravel()).astype(np.float64))
    rounded = fsdata.round_weight(fn, fusedstep.rounding_index(rounding))
    expect = np.concatenate([fsdata.bf16_value(p).ravel() for p in fsdata.split_parts(rounded, parts)])
    expect = np.concatenate([expect, np.zeros(halves.size - expect.size)])
    np.testing.assert_array_equal(halves, np.sort(expect.astype(np.float64)))
    # the two TF32 roundings differ exactly on the ties
    other = ref.prepare_boundary_weight(fn, "tf32_rne" if rounding == "tf32_rna" else "tf32_rna")
    if parts == 2:
        assert not np.array_equal(w, other)


# ---------------------------------------------------------------- KDA
KDA_CASES = [
    dict(tokens=1),
    dict(tokens=1, raw_gate=True, conv_bias=True, conv_weight_layout="tap", conv_state_layout="tap"),
    dict(tokens=1, conv_weight_layout="k3", conv_weight_bf16=True, conv_state_bf16=False),
    dict(tokens=3, token_counts=True),
    dict(tokens=4, conv_state_layout="tap", extra_taps=2, heads=3),
    dict(tokens=2, records=True),
    dict(tokens=3, records=True, deferred=True, conv_weight_layout="k3"),
]


def _kda_ref(v, s, precision, case, gate_mode="one_chain"):
    kw = {k: v[k] for k in ("f_a", "f_b_weight", "raw_gate", "conv_bias", "accepted",
                            "token_counts", "record_rows") if k in v}
    if "record_correction" in v:
        kw["record_slots"] = v["record_correction"].shape[0]
    return ref.kda_decode(v["x"], v["raw_beta"], v["output_gate"], v["conv_weight"], v["a_log"],
                          v["dt_bias"], v["norm_weight"], v["conv_state"], v["state"],
                          v["slots"], precision=precision, gate_mode=gate_mode, **kw, **s)


def _case_flags(case):
    return dict(conv_weight_bf16=case.get("conv_weight_bf16", False),
                conv_state_bf16=case.get("conv_state_bf16", True))


@pytest.mark.parametrize("case", KDA_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_kda_float64_matches_numpy(case):
    rng = np.random.default_rng(len(str(case)))
    bufs, views, s = fsdata.kda_case(rng, **case)
    v = views(bufs)
    r = _kda_ref(v, s, "float64", case)
    want = fsdata.kda_numpy64(v, s, **_case_flags(case))
    for key in ("output", "raw_g", "conv_out", "conv_state"):
        close64(r[key], want[key])
    close64(r["state"], want["state"], rtol=1e-8, atol=1e-10)
    if case.get("records"):
        for key in ("record_correction", "record_key_gate"):
            np.testing.assert_allclose(r[key], want[key], rtol=1e-8, atol=1e-10, equal_nan=True)
        # the checkpoint slots stay unchanged with records
        np.testing.assert_array_equal(r["state"], v["state"].astype(np.float64))
    # padding requests: zero output rows, and something was computed
    assert np.abs(r["output"]).max() > 0
    q = s["tokens"]
    assert np.all(r["output"][1 * q:2 * q] == 0)  # request 1 is padding in every case
    # the inputs are not modified
    np.testing.assert_array_equal(views(bufs)["state"], v["state"])


@pytest.mark.parametrize("case", KDA_CASES[:5], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_kda_float32_within_documented_lines(case):
    rng = np.random.default_rng(100 + len(str(case)))
    bufs, views, s = fsdata.kda_case(rng, **case)
    v = views(bufs)
    for gate_mode in (["one_chain", "four_chains", "fma_tree"] if case["tokens"] == 1 else ["four_chains"]):
        f = _kda_ref(v, s, "float32", case, gate_mode)
        d = fsdata.kda_numpy64(v, s, **_case_flags(case))
        np.testing.assert_array_equal(f["conv_state"], d["conv_state"])  # copied values
        # q|k|v post-conv: the BF16 half ulp plus the FP32 FMAs
        assert np.all(np.abs(f["conv_out"] - d["conv_out"]) <= 2 ** -8 * np.abs(d["conv_out"]) * 1.01 + 2 ** -20)
        heads = v["a_log"].shape[0]
        fo = f["output"].reshape(-1, heads, 128)
        do = d["output"].reshape(-1, heads, 128)
        rms = np.sqrt((do * do).mean(axis=2))
        assert np.all(np.abs(fo - do).max(axis=2) <= 0.15 * np.maximum(rms, 0.1))
        fs, ds = f["state"], d["state"]
        scale = np.abs(ds).max(axis=(2, 3))
        assert np.all(np.abs(fs - ds).max(axis=(2, 3)) <= 5e-2 * np.maximum(scale, 1e-30))


@pytest.mark.parametrize("deferred", [False, True])
def test_kda_commit_float64_matches_numpy(deferred):
    rng = np.random.default_rng(21 + deferred)
    bufs, views, s = fsdata.kda_case(rng, tokens=4, records=True, deferred=deferred, heads=2)
    v = views(bufs)
    r = _kda_ref(v, s, "float64", {})
    commit_slots = np.ascontiguousarray(v["slots"][:, 0])
    accepted = rng.integers(-1, 6, commit_slots.shape[0]).astype(np.int32)
    rr = v.get("record_rows")
    got = ref.kda_commit(v["state"], commit_slots, accepted, r["record_correction"],
                         r["record_key_gate"], v["a_log"], v["dt_bias"], tokens=4,
                         record_rows=rr, lower_bound=s["lower_bound"])
    want = fsdata.kda_commit_numpy64(v["state"], commit_slots, accepted,
                                     r["record_correction"], r["record_key_gate"], v["a_log"],
                                     v["dt_bias"].astype(np.float64), 4, s["lower_bound"], rr)
    # requests that were padding in the verify left NaN records: committing them gives NaN
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-10, equal_nan=True)
    assert np.isfinite(got).sum() > got.size // 2
    assert not np.array_equal(got, v["state"].astype(np.float64))  # something was committed


def test_kda_commit_of_all_tokens_equals_the_sequential_verify():
    """Committing every token's records reproduces the state the plain verify writes to
    its last slot (float64: the two orders agree up to rounding)."""
    rng = np.random.default_rng(8)
    bufs, views, s = fsdata.kda_case(rng, tokens=3, records=True, padding=False, batch=3)
    v = views(bufs)
    v["accepted"] = np.ones(3, dtype=np.int32)
    rec = _kda_ref(v, s, "float64", {})
    plain_v = {k: val for k, val in v.items() if k not in ("record_correction", "record_key_gate")}
    plain = _kda_ref(plain_v, s, "float64", {})
    slots0 = np.ascontiguousarray(v["slots"][:, 0])
    committed = ref.kda_commit(v["state"], slots0, np.full(3, 3, np.int32), rec["record_correction"],
                               rec["record_key_gate"], v["a_log"], v["dt_bias"], tokens=3)
    for b in range(3):
        np.testing.assert_allclose(committed[slots0[b]], plain["state"][v["slots"][b, 2]],
                                   rtol=1e-9, atol=1e-11)


def test_kda_layouts_give_the_same_bits():
    """The binding reads every layout of the conv weight and conv state the same way."""
    outs = []
    for wl, sl in [("channel", "channel"), ("tap", "tap"), ("k3", "channel"), ("channel", "tap")]:
        rng = np.random.default_rng(77)
        bufs, views, s = fsdata.kda_case(rng, tokens=2, conv_weight_layout="channel",
                                         conv_state_layout="channel")
        v = views(bufs)
        cw = v["conv_weight"]  # [3 dim, 4]
        dim = cw.shape[0] // 3
        if wl == "tap":
            v["conv_weight"] = np.ascontiguousarray(cw.T).T
        elif wl == "k3":
            v["conv_weight"] = np.ascontiguousarray(cw.reshape(3, dim, 4).transpose(0, 2, 1))
        if sl == "tap":
            v["conv_state"] = np.ascontiguousarray(v["conv_state"].swapaxes(1, 2)).swapaxes(1, 2)
        outs.append(_kda_ref(v, s, "float32", {}))
    for o in outs[1:]:
        for key in ("output", "state", "conv_state"):
            np.testing.assert_array_equal(o[key], outs[0][key])


# ---------------------------------------------------------------- KDA, BF16 state
BF16_STATE_CASES = [
    dict(tokens=1, state_bf16=True),
    dict(tokens=1, raw_gate=True, conv_state_layout="tap", state_bf16=True),
    dict(tokens=3, token_counts=True, state_bf16=True),
    dict(tokens=8, heads=1, batch=4, state_bf16=True),
]


@pytest.mark.parametrize("case", BF16_STATE_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_kda_bf16_state_matches_numpy_and_the_fp32_state(case):
    """A BF16 state (bit patterns, a pitched view): float64 against the numpy truth that
    reads it exactly and rounds each stored copy to BF16 once; float32 equal to the same
    step on the FP32 state of the same values with its stored states rounded to BF16."""
    rng = np.random.default_rng(300 + len(str(case)))
    bufs, views, s = fsdata.kda_case(rng, **case)
    v = views(bufs)
    assert v["state"].dtype == np.uint16
    r = _kda_ref(v, s, "float64", case)
    want = fsdata.kda_numpy64(v, s, state_bf16=True, **_case_flags(case))
    for key in ("output", "raw_g", "conv_out", "conv_state"):
        close64(r[key], want[key])
    close64(r["state"], want["state"], rtol=1e-8, atol=1e-10)
    assert np.array_equal(fsdata.bf16_round64(r["state"]), r["state"])  # every element a BF16 value
    values = fsdata.bf16_value(v["state"]).astype(np.float64)
    written = np.any(r["state"] != values, axis=(1, 2, 3))
    assert written.any() and not written.all() and not written[0]
    # float32: the FP32 state of the same values computes the same, its stores rounded once
    f16 = _kda_ref(v, s, "float32", case)
    f32 = _kda_ref(dict(v, state=fsdata.bf16_value(v["state"])), s, "float32", case)
    for key in ("output", "conv_state", "raw_g", "conv_out"):
        np.testing.assert_array_equal(f16[key], f32[key])
    np.testing.assert_array_equal(f16["state"], fsdata.bf16_value(fsdata.bf16_bits(f32["state"])))


def test_kda_bf16_checkpoint_records_and_commit():
    """Records with a BF16 checkpoint: the records equal the FP32 state's (the checkpoint
    values are the same), the checkpoint stays exact; the commit reads it exactly and
    rounds the folded state once (float64: numpy; float32: bf16 of the FP32 commit)."""
    rng = np.random.default_rng(31)
    bufs, views, s = fsdata.kda_case(rng, tokens=4, records=True, deferred=True, heads=2, batch=7,
                                     state_bf16=True)
    v = views(bufs)
    v32 = dict(v, state=fsdata.bf16_value(v["state"]))
    r = _kda_ref(v, s, "float64", {})
    r32 = _kda_ref(v32, s, "float64", {})
    for key in ("output", "record_correction", "record_key_gate"):
        np.testing.assert_array_equal(r[key], r32[key])
    np.testing.assert_array_equal(r["state"], v32["state"].astype(np.float64))
    commit_slots = np.ascontiguousarray(v["slots"][:, 0])
    accepted = np.array([4, 0, 3, 0, 2, 4, 1], np.int32)  # requests 1 and 3 were padding
    rr = v["record_rows"]
    args = (commit_slots, accepted, r["record_correction"], r["record_key_gate"], v["a_log"], v["dt_bias"])
    got = ref.kda_commit(v["state"], *args, tokens=4, record_rows=rr, lower_bound=s["lower_bound"])
    want = fsdata.kda_commit_numpy64(v["state"], commit_slots, accepted, r["record_correction"],
                                     r["record_key_gate"], v["a_log"], v["dt_bias"].astype(np.float64),
                                     4, s["lower_bound"], rr, state_bf16=True)
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-10)
    assert np.array_equal(fsdata.bf16_round64(got), got)
    assert not np.array_equal(got, v32["state"].astype(np.float64))  # something was committed
    g16 = ref.kda_commit(v["state"], *args, tokens=4, record_rows=rr, precision="float32")
    g32 = ref.kda_commit(v32["state"], *args, tokens=4, record_rows=rr, precision="float32")
    np.testing.assert_array_equal(g16, fsdata.bf16_value(fsdata.bf16_bits(g32)))


def test_kda_reference_state_dtype_errors():
    bufs, views, s = fsdata.kda_case(np.random.default_rng(3))
    v = views(bufs)
    args = [v["x"], v["raw_beta"], v["output_gate"], v["conv_weight"], v["a_log"], v["dt_bias"],
            v["norm_weight"], v["conv_state"], v["state"].astype(np.float16), v["slots"]]
    with pytest.raises(ValueError, match=r"reference.kda_decode: state: .*dtype float16.*expected dtype bfloat16 or float32"):
        ref.kda_decode(*args, f_a=v["f_a"], f_b_weight=v["f_b_weight"], **s)
    with pytest.raises(ValueError, match=r"reference.kda_commit: state: .*dtype float64.*expected dtype bfloat16 or float32"):
        ref.kda_commit(v["state"].astype(np.float64), np.array([1], np.int32), np.array([1], np.int32),
                       np.zeros((1, 2, 1, 128)), np.zeros((1, 2, 1, 256)), v["a_log"], v["dt_bias"], tokens=1)
