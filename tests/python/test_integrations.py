# SPDX-License-Identifier: Apache-2.0
"""CPU: the vLLM drop-ins (fusedstep.integrations.vllm) have the engine's signatures and
refuse, with ValueError naming the argument, what fusedstep cannot take. The signature
tests need no torch; the refusals use CPU tensors (skipped without torch): every check
runs before a kernel is reached."""
import inspect

import pytest

from fusedstep.integrations import vllm as fv

# vLLM's ops.fused_kda_decode (vllm/_custom_ops.py), called by keyword from
# KimiK3DeltaAttention._forward (vllm/models/kimi_k3/nvidia/kda.py); the torch op
# torch.ops._C.fused_kda_decode takes them in this order.
VLLM_FUSED_KDA_DECODE = ("x", "weight", "bias", "conv_state", "raw_g", "raw_beta", "A_log",
                         "dt_bias", "state_indices", "state", "out", "lower_bound",
                         "output_gate", "norm_weight", "norm_eps")
VLLM_FUSED_KDA_DECODE_DEFAULTS = {"out": None, "lower_bound": None, "output_gate": None,
                                  "norm_weight": None, "norm_eps": 1e-5}


def test_fused_kda_decode_has_vllms_signature():
    params = inspect.signature(fv.fused_kda_decode).parameters
    assert tuple(params) == VLLM_FUSED_KDA_DECODE == fv.FUSED_KDA_DECODE_PARAMETERS
    for name, p in params.items():
        assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, name
        expected = VLLM_FUSED_KDA_DECODE_DEFAULTS.get(name, inspect.Parameter.empty)
        assert p.default == expected, name


def test_kda_spec_verify_takes_the_layers_names():
    params = inspect.signature(fv.kda_spec_verify).parameters
    assert tuple(params) == fv.KDA_SPEC_VERIFY_PARAMETERS
    assert all(p.default is inspect.Parameter.empty for p in params.values())


# ---------------------------------------------------------------- refusals (torch, CPU)
HEADS, D = 2, 128
DIM = HEADS * D


def decode_args(torch, batch=3, slots=5, **over):
    proj = torch.zeros(batch, 3 * DIM + DIM + 16, dtype=torch.bfloat16)
    a = dict(
        x=proj[:, :3 * DIM],
        weight=torch.zeros(3, 4, DIM),
        bias=None,
        conv_state=torch.zeros(slots, 3, 3 * DIM, dtype=torch.bfloat16).transpose(1, 2),
        raw_g=torch.zeros(1, batch, HEADS, D, dtype=torch.bfloat16),
        raw_beta=proj[:, 4 * DIM:4 * DIM + HEADS].unsqueeze(0),
        A_log=torch.zeros(HEADS),
        dt_bias=torch.zeros(DIM),
        state_indices=torch.arange(1, batch + 1, dtype=torch.int32),
        state=torch.zeros(slots, HEADS, D, D),
        out=None,
        lower_bound=-5.0,
        output_gate=proj[:, 3 * DIM:4 * DIM].view(batch, HEADS, D),
        norm_weight=torch.ones(D),
        norm_eps=1e-5)
    a.update(over)
    return a


def expect(fn, kwargs, function, name, *words):
    with pytest.raises(ValueError) as e:
        fn(**kwargs)
    message = str(e.value)
    assert message.startswith(f"{function}: {name}"), message
    for w in words:
        assert w in message, message


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def test_decode_refuses_a_transposed_state(torch):
    state = torch.zeros(5, HEADS, D, D).transpose(-1, -2)
    expect(fv.fused_kda_decode, decode_args(torch, state=state), "fused_kda_decode", "state",
           "[k, v]", "cannot express")


def test_decode_refuses_a_state_with_padded_heads(torch):
    state = torch.zeros(5, HEADS, D, D + 4)[..., :D]
    expect(fv.fused_kda_decode, decode_args(torch, state=state), "fused_kda_decode", "state")


@pytest.mark.parametrize("name", ["lower_bound", "output_gate", "norm_weight"])
def test_decode_refuses_none_where_fusedstep_needs_a_value(torch, name):
    expect(fv.fused_kda_decode, decode_args(torch, **{name: None}), "fused_kda_decode", name,
           "None")


def test_decode_refuses_int64_state_indices(torch):
    expect(fv.fused_kda_decode, decode_args(torch, state_indices=torch.arange(3)),
           "fused_kda_decode", "state_indices", "int32")


def test_decode_refuses_views_that_would_need_a_copy(torch):
    raw_g = torch.zeros(1, 3, D, HEADS, dtype=torch.bfloat16).transpose(-1, -2)
    expect(fv.fused_kda_decode, decode_args(torch, raw_g=raw_g), "fused_kda_decode", "raw_g",
           "copy")
    expect(fv.fused_kda_decode, decode_args(torch, raw_g=torch.zeros(3, HEADS, D)),
           "fused_kda_decode", "raw_g", "shape")


def verify_args(torch, batch=2, q=3, slots=9, **over):
    rows = batch * q
    proj = torch.zeros(rows, 4 * DIM + HEADS + 14, dtype=torch.bfloat16)
    spec = torch.arange(1, batch * q + 1, dtype=torch.int32).view(batch, q)
    a = dict(
        mixed_qkv=proj[:, :3 * DIM],
        g1=torch.zeros(1, rows, HEADS, D, dtype=torch.bfloat16),
        g2=proj[:, 3 * DIM:4 * DIM].view(rows, HEADS, D),
        beta=proj[:, 4 * DIM:4 * DIM + HEADS].unsqueeze(0),
        conv_state=torch.zeros(slots, q + 2, 3 * DIM, dtype=torch.bfloat16).transpose(1, 2),
        conv_weights=torch.zeros(3 * DIM, 4),
        conv_bias=None,
        A_log=torch.zeros(HEADS),
        dt_bias=torch.zeros(DIM),
        lower_bound=-5.0,
        recurrent_state=torch.zeros(slots, HEADS, D, D),
        spec_state_indices_tensor=spec,
        num_accepted_tokens=torch.ones(batch, dtype=torch.int32),
        spec_query_start_loc=torch.arange(0, rows + 1, q, dtype=torch.int32),
        num_spec_decodes=batch,
        norm_weight=torch.ones(D, dtype=torch.bfloat16),
        norm_eps=1e-5,
        core_attn_out=torch.zeros(1, rows, HEADS, D, dtype=torch.bfloat16))
    a.update(over)
    return a


def test_verify_refuses_a_varlen_layout_that_does_not_map(torch):
    qsl = torch.tensor([0, 2, 5], dtype=torch.int32)  # request 1 starts at row 2, not 3
    expect(fv.kda_spec_verify, verify_args(torch, spec_query_start_loc=qsl), "kda_spec_verify",
           "spec_query_start_loc", "b * 3")
    qsl = torch.tensor([0, 4, 6], dtype=torch.int32)  # 4 tokens for q = 3
    expect(fv.kda_spec_verify, verify_args(torch, spec_query_start_loc=qsl), "kda_spec_verify",
           "spec_query_start_loc")


def test_verify_refuses_too_few_conv_taps_and_rows(torch):
    conv = torch.zeros(9, 4, 3 * DIM, dtype=torch.bfloat16).transpose(1, 2)
    expect(fv.kda_spec_verify, verify_args(torch, conv_state=conv), "kda_spec_verify",
           "conv_state", "q + 2")
    expect(fv.kda_spec_verify, verify_args(torch, num_spec_decodes=3), "kda_spec_verify",
           "spec_state_indices_tensor")
    a = verify_args(torch)
    a["mixed_qkv"] = a["mixed_qkv"][:5]
    expect(fv.kda_spec_verify, a, "kda_spec_verify", "mixed_qkv", "rows")


def test_verify_refuses_a_transposed_state_and_no_lower_bound(torch):
    state = torch.zeros(9, HEADS, D, D).transpose(-1, -2)
    expect(fv.kda_spec_verify, verify_args(torch, recurrent_state=state), "kda_spec_verify",
           "recurrent_state", "[k, v]")
    expect(fv.kda_spec_verify, verify_args(torch, lower_bound=None), "kda_spec_verify",
           "lower_bound")


def test_verify_refuses_q_outside_2_to_8(torch):
    spec = torch.arange(1, 19, dtype=torch.int32).view(2, 9)
    expect(fv.kda_spec_verify, verify_args(torch, spec_state_indices_tensor=spec),
           "kda_spec_verify", "spec_state_indices_tensor", "2..8")
