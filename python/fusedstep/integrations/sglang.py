# SPDX-License-Identifier: Apache-2.0
"""fusedstep behind SGLang's Kimi K3 KDA decode call site (``KDAAttnBackend.forward_decode``).

SGLang's backend (python/sglang/srt/layers/attention/linear/kda_backend.py) intercepts a
q = 1 decode batch with two functions of its module
``sglang.kernels.ops.attention.kda_fused_decode``: ``covered(...)`` decides, and
``kda_fused_decode(...)`` runs the conv update, the delta rule and the gated RMSNorm in one
launch. This module has both, with SGLang's signatures and tensor layouts, so the backend
takes it in place of that module:

- ``kda_fused_decode``: ``mixed_qkv`` [B, 3 * dim] (the q|k|v columns of the merged
  projection), ``a`` [B, dim] (the raw forget gate, F_B applied by the engine), ``b`` [B,
  heads] (the raw beta), ``conv_states`` the pool's [slots, 3, 3 * dim] ([slot, tap,
  channel]), ``w_q_t`` / ``w_k_t`` / ``w_v_t`` [4, dim] each (the transposed conv taps of
  the q, k, v sections), ``ssm_states`` [slots, heads, 128 (v), 128 (k)] float32 or
  bfloat16 (``--mamba-ssm-dtype bfloat16``), slot stride free, ``cache_indices`` [B] int32
  (slot <= 0: padding); returns the gated-normed output [1, B, heads, 128] bf16.
- ``covered``: SGLang's predicate, answering for what fusedstep takes (any head count up to
  256, FP32 or BF16 state, a GPU this build runs on).

``kda_fused_decode`` is a thin call into ``fusedstep.kda_decode``: every engine tensor goes
in as a view (the three conv-weight sections as one strided [3, 4, dim] view, the conv pool
transposed), nothing the kernel can address is copied, and what fusedstep cannot take
raises ValueError naming the argument. SGLang's speculative verify
(``_forward_target_verify``) and its DeepSeek-V4 mHC do not map: docs/integration.md,
"SGLang", says why and where the semantics differ.
"""

from ._common import (HEAD_DIM, MAX_HEADS, _check_indices, _check_lower_bound, _check_state, _fail,
                      _per_head, _rows_view, _tensor_device_runs)

__all__ = ["kda_fused_decode", "covered", "KDA_FUSED_DECODE_PARAMETERS", "COVERED_PARAMETERS"]

# sglang.kernels.ops.attention.kda_fused_decode.kda_fused_decode, as
# KDAAttnBackend.forward_decode calls it (positionally, scale / onorm_eps / lower_bound by
# keyword).
KDA_FUSED_DECODE_PARAMETERS = (
    "mixed_qkv", "a", "b", "conv_states", "w_q_t", "w_k_t", "w_v_t", "conv_bias", "A_log",
    "dt_bias", "onorm_g", "onorm_weight", "ssm_states", "cache_indices", "scale", "onorm_eps",
    "lower_bound")

# sglang.kernels.ops.attention.kda_fused_decode.covered.
COVERED_PARAMETERS = ("mixed_qkv", "a", "b", "conv_states", "ssm_states", "cache_indices",
                      "onorm_g")

CONV_TAPS = 3  # the pool's conv window: kernel width 4 -> 3 cached inputs


def covered(mixed_qkv, a, b, conv_states, ssm_states, cache_indices, onorm_g):
    """SGLang's ``covered()`` for fusedstep: True when ``kda_fused_decode`` takes these
    tensors as they are (one token per request, heads of 128 up to 256 of them, bf16
    activations with packed rows, the [slots, 3, 3 * dim] conv pool in bf16 or float32, a
    float32 or bfloat16 [slots, heads, 128, 128] state with only the slot stride free,
    int32 slots, all on one CUDA device this build runs on). Reads no tensor values: safe
    inside CUDA-graph capture."""
    import torch

    tensors = (mixed_qkv, a, b, conv_states, ssm_states, cache_indices, onorm_g)
    if not all(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors):
        return False
    if any(t.device != mixed_qkv.device for t in tensors):
        return False
    if ssm_states.dim() != 4 or mixed_qkv.dim() != 2:
        return False
    heads, v, k = ssm_states.shape[1:]
    batch = mixed_qkv.shape[0]
    dim = heads * HEAD_DIM
    bf16 = torch.bfloat16
    rows = ((mixed_qkv, 3 * dim), (a, dim), (b, heads), (onorm_g, dim))
    state_elems = 16 // ssm_states.element_size()
    return (
        1 <= heads <= MAX_HEADS and v == HEAD_DIM and k == HEAD_DIM
        and all(t.dim() == 2 and tuple(t.shape) == (batch, width) and t.dtype == bf16
                and t.stride(-1) == 1 for t, width in rows)
        and conv_states.dim() == 3 and tuple(conv_states.shape[1:]) == (CONV_TAPS, 3 * dim)
        and conv_states.dtype in (bf16, torch.float32)
        and ssm_states.dtype in (torch.float32, bf16)
        and ssm_states.stride()[1:] == (HEAD_DIM * HEAD_DIM, HEAD_DIM, 1)
        and ssm_states.stride(0) % state_elems == 0 and ssm_states.data_ptr() % 16 == 0
        and cache_indices.dtype == torch.int32 and tuple(cache_indices.shape) == (batch,)
        and _tensor_device_runs(mixed_qkv))


def _conv_weight(function, w_q_t, w_k_t, w_v_t, dim):
    """The three [4, dim] sections as one [3, 4, dim] view of their storage (section
    stride = the distance between them), which fusedstep reads as its conv weight."""
    sections = (("w_q_t", w_q_t), ("w_k_t", w_k_t), ("w_v_t", w_v_t))
    for name, w in sections:
        if w.dim() != 2 or tuple(w.shape) != (4, dim):
            _fail(function, name, w, f"[4, {dim}] (the transposed taps of one conv section)")
        if w.dtype != w_q_t.dtype or w.device != w_q_t.device or w.stride() != w_q_t.stride():
            _fail(function, name, w, f"w_q_t's dtype {w_q_t.dtype}, strides "
                  f"{tuple(w_q_t.stride())} and device {w_q_t.device}")
    size = w_q_t.element_size()
    base = w_q_t.untyped_storage().data_ptr()
    step = w_k_t.data_ptr() - w_q_t.data_ptr()
    for name, w, previous in (("w_k_t", w_k_t, w_q_t), ("w_v_t", w_v_t, w_k_t)):
        if (w.untyped_storage().data_ptr() != base or step <= 0 or step % size
                or w.data_ptr() - previous.data_ptr() != step):
            _fail(function, name, w,
                  "w_q_t, w_k_t, w_v_t to be three equally spaced views of one tensor, in that "
                  "order (e.g. w3.unbind(0) of one [3, 4, dim] tensor): fusedstep reads the conv "
                  "weight as one [3, 4, dim] tensor, and separate allocations would need a copy "
                  "(docs/integration.md, \"SGLang\": stage them from one buffer)")
    return w_q_t.as_strided((3, 4, dim), (step // size, w_q_t.stride(0), w_q_t.stride(1)))


def kda_fused_decode(mixed_qkv, a, b, conv_states, w_q_t, w_k_t, w_v_t, conv_bias, A_log,
                     dt_bias, onorm_g, onorm_weight, ssm_states, cache_indices, scale,
                     onorm_eps, lower_bound=None):
    """SGLang's ``kda_fused_decode`` on fusedstep: the K3 q = 1 decode step (conv, q/k L2
    norm, gate, delta rule, gated RMSNorm) of B requests, one launch.

    ``mixed_qkv`` [B, 3 * dim] bf16 (row stride free); ``a`` [B, dim] bf16 (raw forget gate);
    ``b`` [B, heads] bf16 (raw beta); ``conv_states`` [slots, 3, 3 * dim] ([slot, tap,
    channel], any strides), updated in place; ``w_q_t``, ``w_k_t``, ``w_v_t`` [4, dim]
    (float32 or bf16) equally spaced in one storage, in that order; ``conv_bias`` None or
    [3 * dim] float32; ``A_log`` [heads] elements (any shape that views as [heads]) float32;
    ``dt_bias`` [dim] float32; ``onorm_g`` [B, dim] bf16 (the gated RMSNorm's gate);
    ``onorm_weight`` [128] float32 or bf16; ``ssm_states`` [slots, heads, 128 (v), 128 (k)]
    float32 or bfloat16, slot stride free, updated in place; ``cache_indices`` [B] int32
    (slot <= 0 or >= slots: padding, zero output row, no cache touched); ``scale`` the q
    scale (head_k_dim ** -0.5); ``onorm_eps``; ``lower_bound`` the gate's bound (< 0; None
    raises). Returns the output [1, B, heads, 128] bf16 (a new tensor, as SGLang's)."""
    import torch
    from .. import kda_decode

    f = "kda_fused_decode"
    _check_lower_bound(f, lower_bound, "a")
    if ssm_states.dim() != 4:
        _fail(f, "ssm_states", ssm_states, "[slots, heads, 128 (v), 128 (k)]")
    heads = ssm_states.shape[1]
    dim = heads * HEAD_DIM
    _check_state(f, "ssm_states", ssm_states, heads)
    if ssm_states.dtype not in (torch.float32, torch.bfloat16):
        _fail(f, "ssm_states", ssm_states, "dtype torch.float32 or torch.bfloat16")
    if mixed_qkv.dim() != 2 or mixed_qkv.shape[1] != 3 * dim:
        _fail(f, "mixed_qkv", mixed_qkv, f"[B, {3 * dim}] (3 * heads * 128, heads = "
              f"ssm_states.shape[1] = {heads})")
    batch = mixed_qkv.shape[0]
    _check_indices(f, "cache_indices", cache_indices, (batch,))
    raw_gate = _rows_view(f, "a", a, (batch, dim), batch, dim, False)
    raw_beta = _rows_view(f, "b", b, (batch, heads), batch, heads, False)
    gate = _rows_view(f, "onorm_g", onorm_g, (batch, dim), batch, dim, False)
    if conv_states.dim() != 3 or tuple(conv_states.shape[1:]) != (CONV_TAPS, 3 * dim):
        _fail(f, "conv_states", conv_states, f"[slots, {CONV_TAPS}, {3 * dim}] (SGLang's KDA "
              "conv pool, [slot, tap, channel])")
    conv_weight = _conv_weight(f, w_q_t, w_k_t, w_v_t, dim)
    if conv_bias is not None and tuple(conv_bias.shape) != (3 * dim,):
        _fail(f, "conv_bias", conv_bias, f"None or [{3 * dim}]")
    a_log = _per_head(f, "A_log", A_log, heads)
    if tuple(dt_bias.shape) != (dim,):
        _fail(f, "dt_bias", dt_bias, f"[{dim}]")
    if tuple(onorm_weight.shape) != (HEAD_DIM,):
        _fail(f, "onorm_weight", onorm_weight, "[128] (o_norm.weight, shared by the heads)")
    out = torch.empty((batch, dim), dtype=torch.bfloat16, device=mixed_qkv.device)
    kda_decode(mixed_qkv, raw_beta, gate, conv_weight, a_log, dt_bias, onorm_weight,
               conv_states.transpose(-1, -2), ssm_states, cache_indices, raw_gate=raw_gate,
               conv_bias=conv_bias, tokens=1, lower_bound=float(lower_bound),
               q_scale=float(scale), norm_eps=float(onorm_eps), out=out)
    return out.view(1, batch, heads, HEAD_DIM)
