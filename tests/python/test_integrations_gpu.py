# SPDX-License-Identifier: Apache-2.0
"""GPU: each vLLM drop-in (fusedstep.integrations.vllm) with engine-layout tensors gives the
bits of the direct fusedstep call: the KDA ones (row-strided views of one input
projection, SD and DS conv-state layouts, state slots pitched in a page, slot 0 /
PAD_SLOT_ID padding, BF16 norm weight, verify via query_start_loc) those of
fusedstep.kda_decode on packed copies, the DeepSeek-V4.1 mHC ones (vLLM's [T, 4, 1] post,
[T, 4] pre, the fp32 fn as an nn.Parameter, a side stream passed) those of
fusedstep.mhc_shifted_post_pre_boundary with the prepared weight; and the vLLM plugin's
patched seam, on a stand-in of vLLM's modules, runs the same launch."""
import pytest

from bitwise import bits, same  # noqa: F401

pytestmark = pytest.mark.gpu

HEADS, D = 2, 128
DIM = HEADS * D


def projection(torch, rows, gen):
    """One [rows, q|k|v | g | beta | pad] bf16 projection, as the layer's merged GEMM."""
    width = 3 * DIM + DIM + HEADS + 14
    return (torch.randn(rows, width, generator=gen, device="cuda") * 0.5).bfloat16()


def caches(torch, slots, taps, layout, gen, page_pad=64):
    """conv_state [slots, 3 * dim, taps] view ("SD": [slot, tap, channel] storage, "DS":
    [slot, channel, tap]) and a state [slots, heads, 128, 128] pitched in a page."""
    if layout == "SD":
        conv = torch.randn(slots, taps, 3 * DIM, generator=gen, device="cuda").bfloat16().transpose(1, 2)
    else:
        conv = torch.randn(slots, 3 * DIM, taps, generator=gen, device="cuda").bfloat16()
    page = HEADS * D * D + page_pad
    storage = torch.randn(slots * page, generator=gen, device="cuda") * 0.05
    state = storage.as_strided((slots, HEADS, D, D), (page, D * D, D, 1))
    return conv, state


def weights(torch, gen):
    return dict(A_log=torch.randn(HEADS, generator=gen, device="cuda") * 0.5,
                dt_bias=torch.randn(DIM, generator=gen, device="cuda") * 0.1,
                norm_weight=(1 + 0.1 * torch.randn(D, generator=gen, device="cuda")).bfloat16())


@pytest.mark.parametrize("layout", ["SD", "DS"])
@pytest.mark.parametrize("pad", [0, -1])
@pytest.mark.parametrize("forms", ["schema", "layer"])  # raw_beta [1, B, H] / [B, H], A_log [H] / [1, 1, H, 1]
def test_fused_kda_decode_equals_the_direct_call(torch, fs, layout, pad, forms):
    from fusedstep.integrations import vllm as fv
    gen = torch.Generator(device="cuda").manual_seed(7)
    batch, slots = 5, 9
    proj = projection(torch, batch, gen)
    raw_g = (torch.randn(1, batch, HEADS, D, generator=gen, device="cuda")).bfloat16()
    conv_weight = torch.randn(3, 4, DIM, generator=gen, device="cuda") * 0.3
    w = weights(torch, gen)
    idx = torch.tensor([3, pad, 1, 7, 5], dtype=torch.int32, device="cuda")
    conv, state = caches(torch, slots, 3, layout, gen)
    conv_ref, state_ref = conv.clone(), state.clone()
    x, g2 = proj[:, :3 * DIM], proj[:, 3 * DIM:4 * DIM].view(batch, HEADS, D)
    beta = proj[:, 4 * DIM:4 * DIM + HEADS].unsqueeze(0)
    out = torch.full((1, batch, HEADS, D), 3.0, dtype=torch.bfloat16, device="cuda")
    layer_forms = forms == "layer"
    got = fv.fused_kda_decode(x=x, weight=conv_weight, bias=None, conv_state=conv, raw_g=raw_g,
                              raw_beta=beta[0] if layer_forms else beta,
                              A_log=w["A_log"].view(1, 1, HEADS, 1) if layer_forms else w["A_log"],
                              dt_bias=w["dt_bias"],
                              state_indices=idx, state=state, out=out, lower_bound=-5.0,
                              output_gate=g2, norm_weight=w["norm_weight"].float(),
                              norm_eps=1e-5)
    assert got is out
    ref = fs.kda_decode(x.contiguous(), beta[0].contiguous(), g2.reshape(batch, DIM).contiguous(),
                        conv_weight, w["A_log"], w["dt_bias"], w["norm_weight"].float(), conv_ref,
                        state_ref, idx, raw_gate=raw_g.reshape(batch, DIM).contiguous(),
                        lower_bound=-5.0, norm_eps=1e-5)
    same(torch, out.view(batch, DIM), ref, "out")
    same(torch, conv, conv_ref, "conv_state")
    same(torch, state, state_ref, "state")
    if pad == -1:
        assert not out[0, 1].any()


@pytest.mark.parametrize("layout", ["SD", "DS"])
def test_kda_spec_verify_equals_the_direct_call(torch, fs, layout):
    from fusedstep.integrations import vllm as fv
    gen = torch.Generator(device="cuda").manual_seed(11)
    batch, q, slots = 4, 3, 20
    rows = batch * q
    proj = projection(torch, rows + 2, gen)  # graph-padded rows past B * q
    g1 = torch.randn(1, rows + 2, HEADS, D, generator=gen, device="cuda").bfloat16()
    conv_weights = torch.randn(3 * DIM, 4, generator=gen, device="cuda") * 0.3
    w = weights(torch, gen)
    spec = torch.tensor([[1, 2, 3], [4, 5, 6], [0, 0, 0], [7, 8, 9], [-1, -1, -1]],
                        dtype=torch.int32, device="cuda")  # row 2: NULL_BLOCK_ID padding
    accepted = torch.tensor([1, 3, 1, 2, 1], dtype=torch.int32, device="cuda")
    # the last request has 2 of its 3 tokens: query_start_loc maps to token_counts
    qsl = torch.tensor([0, 3, 6, 9, 11, 11], dtype=torch.int32, device="cuda")
    conv, state = caches(torch, slots, q + 2, layout, gen)
    conv_ref, state_ref = conv.clone(), state.clone()
    out = torch.full((1, rows + 2, HEADS, D), 3.0, dtype=torch.bfloat16, device="cuda")
    mixed_qkv, g2 = proj[:, :3 * DIM], proj[:, 3 * DIM:4 * DIM].view(rows + 2, HEADS, D)
    beta = proj[:, 4 * DIM:4 * DIM + HEADS].unsqueeze(0)
    got = fv.kda_spec_verify(mixed_qkv, g1, g2, beta, conv, conv_weights, None, w["A_log"],
                             w["dt_bias"], -5.0, state, spec, accepted, qsl, batch,
                             w["norm_weight"], 1e-5, out)
    assert got is out
    counts = torch.tensor([3, 3, 3, 2], dtype=torch.int32, device="cuda")
    ref = fs.kda_decode(mixed_qkv[:rows].contiguous(), beta[0, :rows].contiguous(),
                        g2[:rows].reshape(rows, DIM).contiguous(), conv_weights, w["A_log"],
                        w["dt_bias"], w["norm_weight"], conv_ref, state_ref,
                        spec[:batch].contiguous(), raw_gate=g1[0, :rows].reshape(rows, DIM).contiguous(),
                        accepted=accepted[:batch].contiguous(), token_counts=counts, tokens=q,
                        lower_bound=-5.0, norm_eps=1e-5)
    same(torch, out[0, :rows].reshape(rows, DIM), ref, "core_attn_out")
    assert torch.equal(bits(torch, out[0, rows:]), bits(torch, torch.full_like(out[0, rows:], 3.0)))
    same(torch, conv, conv_ref, "conv_state")
    same(torch, state, state_ref, "recurrent_state")


# ---------------------------------------------------------------- DeepSeek-V4.1 mHC
MHC_SCALARS = dict(rms_eps=1e-6, hc_pre_eps=1e-6, hc_sinkhorn_eps=1e-6, hc_post_mult_value=2.0,
                   sinkhorn_repeat=20, norm_eps=1e-6)


def mhc_seam(torch, tokens, hidden, seed):
    """One seam's inputs as DeepseekV4DecoderLayer holds them."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen, device="cuda") * std

    comb = torch.softmax(randn(tokens, 4, 4), dim=-1)
    return dict(
        x=randn(tokens, hidden).bfloat16(),
        residual=randn(tokens, 4, hidden).bfloat16(),
        post_layer_mix=2 * torch.sigmoid(randn(tokens, 4, 1)),
        comb_res_mix=comb,
        fn=torch.nn.Parameter(randn(24, 4 * hidden, std=0.02), requires_grad=False),
        hc_scale=randn(3, std=0.1).abs() + 0.5,
        hc_base=randn(24, std=0.1),
        pre_mix=torch.sigmoid(randn(tokens, 4)) + 1e-6,
        norm_weight=(1 + 0.1 * randn(hidden)).bfloat16())


def mhc_direct(fs, a):
    return fs.mhc_shifted_post_pre_boundary(
        a["x"], a["residual"], a["pre_mix"], a["post_layer_mix"], a["comb_res_mix"],
        fs.prepare_boundary_weight(a["fn"].detach(), "tf32_rna"), a["hc_scale"], a["hc_base"],
        MHC_SCALARS["rms_eps"], MHC_SCALARS["hc_pre_eps"], MHC_SCALARS["hc_post_mult_value"],
        MHC_SCALARS["hc_sinkhorn_eps"], MHC_SCALARS["sinkhorn_repeat"], a["norm_weight"],
        MHC_SCALARS["norm_eps"])


MHC_OUTPUTS = ("residual", "post_mix", "comb_mix", "layer_input", "next_pre")


def mhc_args(a):
    return (a["x"], a["residual"], a["post_layer_mix"], a["comb_res_mix"], a["fn"], a["hc_scale"],
            a["hc_base"], MHC_SCALARS["rms_eps"], MHC_SCALARS["hc_pre_eps"],
            MHC_SCALARS["hc_sinkhorn_eps"], MHC_SCALARS["hc_post_mult_value"],
            MHC_SCALARS["sinkhorn_repeat"])


@pytest.mark.parametrize("tokens,hidden", [(1, 5120), (7, 5120), (20, 4096)])
@pytest.mark.parametrize("side_stream", [False, True])
def test_mhc_shifted_post_pre_equals_the_direct_call(torch, fs, tokens, hidden, side_stream):
    from fusedstep.integrations import vllm as fv
    a = mhc_seam(torch, tokens, hidden, seed=tokens)
    stream = torch.cuda.Stream() if side_stream else None
    got = fv.mhc_shifted_post_pre(*mhc_args(a), pre_mix=a["pre_mix"], norm_weight=a["norm_weight"],
                                  norm_eps=MHC_SCALARS["norm_eps"], stream=stream)
    assert len(got) == 6
    if stream is not None:  # the engine's join before it reads the coefficients
        torch.cuda.current_stream().wait_stream(stream)
    for name, g, r in zip(MHC_OUTPUTS, got, mhc_direct(fs, a)):
        same(torch, g, r, name)
    assert got[1].shape == (tokens, 4, 1) and got[4].shape == (tokens, 4)
    assert got[5].shape == (0, hidden) and got[5].dtype == torch.bfloat16


def test_mhc_shifted_post_pre_deep_gemm_equals_the_direct_call(torch, fs):
    from fusedstep.integrations import vllm as fv
    a = mhc_seam(torch, 5, 5120, seed=3)
    got = fv.mhc_shifted_post_pre_deep_gemm(
        a["x"], a["residual"], a["pre_mix"], a["post_layer_mix"], a["comb_res_mix"], a["fn"],
        a["hc_scale"], a["hc_base"], MHC_SCALARS["rms_eps"], MHC_SCALARS["hc_pre_eps"],
        MHC_SCALARS["hc_post_mult_value"], MHC_SCALARS["hc_sinkhorn_eps"],
        MHC_SCALARS["sinkhorn_repeat"], a["norm_weight"], MHC_SCALARS["norm_eps"])
    assert len(got) == 5
    for name, g, r in zip(MHC_OUTPUTS, got, mhc_direct(fs, a)):
        same(torch, g, r, name)


def test_boundary_weight_is_prepared_once_per_weight(torch, fs):
    from fusedstep.integrations import vllm as fv
    a = mhc_seam(torch, 1, 4096, seed=5)
    fn = a["fn"]
    first = fv.boundary_weight(fn)
    assert fv.boundary_weight(fn) is first
    same(torch, first, fs.prepare_boundary_weight(fn.detach(), "tf32_rna"), "prepared")
    with torch.no_grad():
        fn.mul_(1.5)  # an in-place reload: a new version, prepared again
    again = fv.boundary_weight(fn)
    assert again is not first
    same(torch, again, fs.prepare_boundary_weight(fn.detach(), "tf32_rna"), "re-prepared")
    assert fv.boundary_weight(fn, "fp32").shape == fs.weight_shape(4096, "fp32")
    assert fv.boundary_weight(again) is again  # a prepared (int32) weight passes through


def test_mhc_drop_in_refuses_engine_shapes_it_cannot_take(torch, fs):
    from fusedstep.integrations import vllm as fv
    a = mhc_seam(torch, 3, 4096, seed=9)
    with pytest.raises(ValueError, match="^mhc_shifted_post_pre: pre_mix"):
        fv.mhc_shifted_post_pre(*mhc_args(a), pre_mix=a["pre_mix"].unsqueeze(-1),
                                norm_weight=a["norm_weight"])
    with pytest.raises(ValueError, match="^mhc_shifted_post_pre: fn"):
        args = list(mhc_args(a))
        args[4] = a["fn"][:, :4096]
        fv.mhc_shifted_post_pre(*args, pre_mix=a["pre_mix"], norm_weight=a["norm_weight"])


def test_the_plugins_seam_runs_fusedstep_on_this_gpu(torch, fs, monkeypatch):
    import sys
    from fusedstep.integrations import vllm_plugin
    import test_vllm_plugin as stand_in
    for name in list(sys.modules):
        if name == "vllm" or name.startswith("vllm."):
            monkeypatch.delitem(sys.modules, name)
    mods = stand_in.build_vllm()
    for name, m in mods.items():
        monkeypatch.setitem(sys.modules, name, m)
    monkeypatch.setenv(vllm_plugin.ENV, "1")
    vllm_plugin.register()
    seam = mods["vllm.models.deepseek_v41.nvidia.model"].mhc_shifted_post_pre
    a = mhc_seam(torch, 4, 5120, seed=13)
    got = seam(*mhc_args(a), pre_mix=a["pre_mix"], norm_weight=a["norm_weight"],
               norm_eps=MHC_SCALARS["norm_eps"])
    assert got != "vllm mhc_shifted_post_pre", "the patch fell back to the stand-in"
    for name, g, r in zip(MHC_OUTPUTS, got, mhc_direct(fs, a)):
        same(torch, g, r, name)
