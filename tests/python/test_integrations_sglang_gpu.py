# SPDX-License-Identifier: Apache-2.0
"""GPU: the SGLang drop-in (fusedstep.integrations.sglang) with SGLang-layout tensors (q|k|v
and the norm gate as row-strided views of one projection, beta a column slice of the
[f_a | b] GEMV, the [slots, 3, 3 dim] conv pool and the state both pitched in a unified
pool, the conv taps staged as three [4, dim] sections of one buffer, slot -1 / reserved
slot 0 padding, FP32 and BF16 states) gives the bits of the direct fusedstep.kda_decode
call on packed copies, also replayed from a CUDA graph."""
import pytest

from bitwise import bits, same  # noqa: F401

pytestmark = pytest.mark.gpu

HEADS, D = 2, 128
DIM = HEADS * D
SLOTS = 9  # MambaPool: allocator size + 1, slot 0 the reserved padding target


def layer(torch, gen, weights):
    """The layer's statics as KimiK3DeltaAttention._prepare_fused_decode stages them:
    conv_weights [3 dim, 4] float32, its taps as three [4, dim] sections ("stacked": the rows
    of one [3, 4, dim] buffer, each contiguous; "views": column blocks of w.t().contiguous()),
    a dense zero conv bias, A_log [heads], dt_bias [dim], the float32 o_norm weight."""
    conv_weights = torch.randn(3 * DIM, 4, generator=gen, device="cuda") * 0.3
    wt = conv_weights.t().contiguous()
    blocks = [wt[:, s * DIM:(s + 1) * DIM] for s in range(3)]
    if weights == "stacked":
        blocks = list(torch.stack(blocks).unbind(0))
    return dict(
        conv_weights=conv_weights, w_q_t=blocks[0], w_k_t=blocks[1], w_v_t=blocks[2],
        conv_bias=torch.zeros(3 * DIM, device="cuda"),
        A_log=torch.randn(1, 1, HEADS, 1, generator=gen, device="cuda") * 0.5,
        dt_bias=torch.randn(DIM, generator=gen, device="cuda") * 0.1,
        onorm_weight=(1 + 0.1 * torch.randn(D, generator=gen, device="cuda")).float())


def activations(torch, batch, gen):
    """mixed_qkv / onorm_g: views of the merged [q, k, v, g] projection; b: a slice of the
    [f_a | b | pad] GEMV; a: the f_b GEMM output [B, dim]."""
    proj = (torch.randn(batch, 4 * DIM + 16, generator=gen, device="cuda") * 0.5).bfloat16()
    bfa = (torch.randn(batch, D + HEADS + 6, generator=gen, device="cuda") * 0.5).bfloat16()
    a = torch.randn(batch, DIM, generator=gen, device="cuda").bfloat16()
    return dict(mixed_qkv=proj[:, :3 * DIM], onorm_g=proj[:, 3 * DIM:4 * DIM],
                b=bfa[:, D:D + HEADS], a=a)


def pools(torch, state_dtype, gen, pad=64):
    """conv_states [slots, 3, 3 dim] bf16 and ssm_states [slots, heads, 128, 128], each
    slot pitched as in a unified pool."""
    conv_pitch = 3 * 3 * DIM + pad
    conv = (torch.randn(SLOTS * conv_pitch, generator=gen, device="cuda")).bfloat16()
    conv = conv.as_strided((SLOTS, 3, 3 * DIM), (conv_pitch, 3 * DIM, 1))
    page = HEADS * D * D + pad
    state = (torch.randn(SLOTS * page, generator=gen, device="cuda") * 0.05).to(state_dtype)
    state = state.as_strided((SLOTS, HEADS, D, D), (page, D * D, D, 1))
    return conv, state


def call(fsg, act, w, conv, state, idx):
    return fsg.kda_fused_decode(
        act["mixed_qkv"], act["a"], act["b"], conv, w["w_q_t"], w["w_k_t"], w["w_v_t"],
        w["conv_bias"], w["A_log"].reshape(-1), w["dt_bias"], act["onorm_g"],
        w["onorm_weight"], state, idx, scale=D ** -0.5, onorm_eps=1e-5, lower_bound=-5.0)


@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("pad", [-1, 0])
@pytest.mark.parametrize("weights", ["stacked", "views"])
def test_kda_fused_decode_equals_the_direct_call(torch, fs, state_dtype, pad, weights):
    from fusedstep.integrations import sglang as fsg
    gen = torch.Generator(device="cuda").manual_seed(5)
    batch = 5
    w = layer(torch, gen, weights)
    act = activations(torch, batch, gen)
    conv, state = pools(torch, getattr(torch, state_dtype), gen)
    idx = torch.tensor([3, pad, 1, 8, 5], dtype=torch.int32, device="cuda")
    conv_ref, state_ref = conv.clone(), state.clone()
    conv0, state0 = conv[0].clone(), state[0].clone()
    assert fsg.covered(act["mixed_qkv"], act["a"], act["b"], conv, state, idx, act["onorm_g"])
    got = call(fsg, act, w, conv, state, idx)
    ref = fs.kda_decode(act["mixed_qkv"].contiguous(), act["b"].contiguous(),
                        act["onorm_g"].contiguous(), w["conv_weights"], w["A_log"].view(-1),
                        w["dt_bias"], w["onorm_weight"], conv_ref.transpose(-1, -2), state_ref,
                        idx, raw_gate=act["a"].contiguous(), conv_bias=w["conv_bias"],
                        lower_bound=-5.0, q_scale=D ** -0.5, norm_eps=1e-5)
    assert got.shape == (1, batch, HEADS, D) and got.dtype == torch.bfloat16
    same(torch, got.view(batch, DIM), ref, "output")
    same(torch, conv, conv_ref, "conv_states")
    same(torch, state, state_ref, "ssm_states")
    assert not got[0, 1].any()  # the padding row
    same(torch, conv[0], conv0, "reserved conv slot 0")
    same(torch, state[0], state0, "reserved state slot 0")


def test_covered_answers_for_fusedstep(torch):
    from fusedstep.integrations import sglang as fsg
    gen = torch.Generator(device="cuda").manual_seed(3)
    act = activations(torch, 4, gen)
    conv, state = pools(torch, torch.float32, gen)
    idx = torch.tensor([1, 2, -1, 4], dtype=torch.int32, device="cuda")

    def covered(**over):
        t = dict(act, conv_states=conv, ssm_states=state, cache_indices=idx)
        t.update(over)
        return fsg.covered(**{name: t[name] for name in fsg.COVERED_PARAMETERS})

    assert covered()
    assert covered(ssm_states=state.bfloat16())  # --mamba-ssm-dtype bfloat16
    assert not covered(ssm_states=state.half())
    assert not covered(ssm_states=state.transpose(-1, -2))
    assert not covered(conv_states=conv.transpose(-1, -2))  # [slot, channel, tap]
    assert not covered(a=act["a"].float())
    assert not covered(cache_indices=idx.long())
    assert not covered(cache_indices=idx[:3])


def test_kda_fused_decode_replays_in_a_cuda_graph(torch, fs):
    from fusedstep.integrations import sglang as fsg
    gen = torch.Generator(device="cuda").manual_seed(9)
    w = layer(torch, gen, "stacked")
    act = activations(torch, 4, gen)
    conv, state = pools(torch, torch.bfloat16, gen)
    idx = torch.tensor([2, 6, -1, 3], dtype=torch.int32, device="cuda")
    conv0, state0 = conv.clone(), state.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture
        call(fsg, act, w, conv, state, idx)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        assert fsg.covered(act["mixed_qkv"], act["a"], act["b"], conv, state, idx,
                           act["onorm_g"])
        got = call(fsg, act, w, conv, state, idx)
    conv.copy_(conv0)
    state.copy_(state0)
    graph.replay()
    conv_e, state_e = conv0.clone(), state0.clone()
    ref = call(fsg, act, w, conv_e, state_e, idx)
    torch.cuda.synchronize()
    same(torch, got, ref, "output")
    same(torch, conv, conv_e, "conv_states")
    same(torch, state, state_e, "ssm_states")
