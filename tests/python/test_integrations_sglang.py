# SPDX-License-Identifier: Apache-2.0
"""CPU: the SGLang drop-in (fusedstep.integrations.sglang) has the signatures of SGLang's
sglang.kernels.ops.attention.kda_fused_decode module and refuses, with ValueError naming the
argument, what fusedstep cannot take. The signature tests need no torch; the refusals use
CPU tensors (skipped without torch): every check runs before a kernel is reached."""
import inspect

import pytest

from fusedstep.integrations import sglang as fsg

# kda_fused_decode(...) and covered(...) of sglang/kernels/ops/attention/kda_fused_decode.py,
# as KDAAttnBackend.forward_decode (sglang/srt/layers/attention/linear/kda_backend.py)
# calls them.
SGLANG_KDA_FUSED_DECODE = ("mixed_qkv", "a", "b", "conv_states", "w_q_t", "w_k_t", "w_v_t",
                           "conv_bias", "A_log", "dt_bias", "onorm_g", "onorm_weight",
                           "ssm_states", "cache_indices", "scale", "onorm_eps", "lower_bound")
SGLANG_COVERED = ("mixed_qkv", "a", "b", "conv_states", "ssm_states", "cache_indices",
                  "onorm_g")


def test_kda_fused_decode_has_sglangs_signature():
    params = inspect.signature(fsg.kda_fused_decode).parameters
    assert tuple(params) == SGLANG_KDA_FUSED_DECODE == fsg.KDA_FUSED_DECODE_PARAMETERS
    for name, p in params.items():
        assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, name
        expected = None if name == "lower_bound" else inspect.Parameter.empty
        assert p.default == expected, name


def test_covered_has_sglangs_signature():
    params = inspect.signature(fsg.covered).parameters
    assert tuple(params) == SGLANG_COVERED == fsg.COVERED_PARAMETERS
    assert all(p.default is inspect.Parameter.empty for p in params.values())


def test_the_package_exports_both_engines():
    from fusedstep import integrations
    assert integrations.sglang is fsg and "sglang" in integrations.__all__


# ---------------------------------------------------------------- refusals (torch, CPU)
HEADS, D = 2, 128
DIM = HEADS * D


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def decode_args(torch, batch=3, slots=5, **over):
    """SGLang's K3 decode tensors: q|k|v and g row-strided views of the merged projection,
    b a column slice of the [f_a | b] GEMV, the [slots, 3, 3 dim] conv pool, the conv taps
    staged as the rows of one [3, 4, dim] buffer."""
    proj = torch.zeros(batch, 4 * DIM + 16, dtype=torch.bfloat16)
    bfa = torch.zeros(batch, D + HEADS + 6, dtype=torch.bfloat16)
    w3 = torch.zeros(3, 4, DIM)
    a = dict(
        mixed_qkv=proj[:, :3 * DIM],
        a=torch.zeros(batch, DIM, dtype=torch.bfloat16),
        b=bfa[:, D:D + HEADS],
        conv_states=torch.zeros(slots, 3, 3 * DIM, dtype=torch.bfloat16),
        w_q_t=w3[0], w_k_t=w3[1], w_v_t=w3[2],
        conv_bias=torch.zeros(3 * DIM),
        A_log=torch.zeros(1, 1, HEADS, 1),
        dt_bias=torch.zeros(DIM),
        onorm_g=proj[:, 3 * DIM:4 * DIM],
        onorm_weight=torch.ones(D),
        ssm_states=torch.zeros(slots, HEADS, D, D),
        cache_indices=torch.tensor([1, -1, 3], dtype=torch.int32)[:batch],
        scale=D ** -0.5,
        onorm_eps=1e-5,
        lower_bound=-5.0)
    a.update(over)
    return a


def expect(kwargs, name, *words):
    with pytest.raises(ValueError) as e:
        fsg.kda_fused_decode(**kwargs)
    message = str(e.value)
    assert message.startswith(f"kda_fused_decode: {name}"), message
    for w in words:
        assert w in message, message


def test_refuses_the_unbounded_gate(torch):
    expect(decode_args(torch, lower_bound=None), "lower_bound", "None", "softplus")


def test_refuses_a_transposed_or_padded_state(torch):
    state = torch.zeros(5, HEADS, D, D).transpose(-1, -2)
    expect(decode_args(torch, ssm_states=state), "ssm_states", "[k, v]", "cannot express")
    state = torch.zeros(5, HEADS, D, D + 4)[..., :D]
    expect(decode_args(torch, ssm_states=state), "ssm_states")


def test_refuses_a_state_dtype_fusedstep_has_no_kernel_for(torch):
    state = torch.zeros(5, HEADS, D, D, dtype=torch.float16)
    expect(decode_args(torch, ssm_states=state), "ssm_states", "float32", "bfloat16")


def test_refuses_int64_indices_and_a_batch_mismatch(torch):
    expect(decode_args(torch, cache_indices=torch.arange(3)), "cache_indices", "int32")
    expect(decode_args(torch, cache_indices=torch.arange(2, dtype=torch.int32)),
           "cache_indices", "(3,)")


def test_refuses_conv_taps_from_separate_allocations(torch):
    sections = [torch.zeros(4, DIM) for _ in range(3)]
    kwargs = decode_args(torch, w_q_t=sections[0], w_k_t=sections[1], w_v_t=sections[2])
    expect(kwargs, "w_k_t", "equally spaced", "copy")
    w3 = torch.zeros(3, 4, DIM)
    expect(decode_args(torch, w_q_t=w3[0], w_k_t=w3[2], w_v_t=w3[1]), "w_v_t", "in that order")
    expect(decode_args(torch, w_q_t=w3[0], w_k_t=w3[1], w_v_t=torch.zeros(4, DIM)), "w_v_t")


def test_refuses_conv_taps_of_another_shape_or_dtype(torch):
    w = torch.zeros(3 * DIM, 4)
    expect(decode_args(torch, w_q_t=w), "w_q_t", "[4, 256]")
    w3 = torch.zeros(3, 4, DIM)
    expect(decode_args(torch, w_q_t=w3[0], w_k_t=w3[1].bfloat16(), w_v_t=w3[2]), "w_k_t",
           "dtype")


def test_refuses_the_conv_pool_in_another_layout(torch):
    conv = torch.zeros(5, 3 * DIM, 3, dtype=torch.bfloat16)  # [slot, channel, tap]
    expect(decode_args(torch, conv_states=conv), "conv_states", "[slot, tap, channel]")


def test_refuses_beta_with_the_leading_dim(torch):
    b = torch.zeros(1, 3, HEADS, dtype=torch.bfloat16)  # the backend passes b[0]
    expect(decode_args(torch, b=b), "b", "(3, 2)")


def test_refuses_other_shapes(torch):
    a = torch.zeros(1, 3, HEADS, D, dtype=torch.bfloat16)  # the extend path's [1, T, H, D]
    expect(decode_args(torch, a=a), "a", "shape (3, 256)")
    expect(decode_args(torch, A_log=torch.zeros(HEADS + 1)), "A_log", "one per head")
    expect(decode_args(torch, onorm_weight=torch.ones(DIM)), "onorm_weight", "[128]")


def test_covered_is_false_off_the_gpu(torch):
    kwargs = decode_args(torch)
    args = {name: kwargs[name] for name in fsg.COVERED_PARAMETERS}
    assert fsg.covered(**args) is False
