# SPDX-License-Identifier: Apache-2.0
"""fusedstep behind vLLM's Kimi K3 KDA call sites (``KimiK3DeltaAttention._forward``).

- ``fused_kda_decode``: the signature of vLLM's ``ops.fused_kda_decode`` (the q = 1
  decode op the layer calls when the batch holds only plain decodes), with its tensor
  layouts: ``raw_g`` / ``out`` as ``[1, B, heads, 128]``, ``raw_beta`` as ``[1, B, heads]``,
  ``output_gate`` as ``[B, heads, 128]``, ``conv_state`` as the layer's
  ``[slots, 3 * dim, taps]`` view (either cache layout), ``state`` as
  ``[slots, heads, 128 (v), 128 (k)]``.
- ``kda_spec_verify``: the layer's speculative verify sequence (conv update with
  ``num_accepted_tokens`` and ``query_start_loc``, ``fused_recurrent_kda`` with
  ``ssm_state_indices``, gated RMSNorm) in one call, named after the variables
  ``_forward`` holds at that point, for a batch of verify requests only.

Both are thin calls into ``fusedstep.kda_decode``: every engine tensor goes in as a view
(row strides and pitched slots as they are), nothing the kernel can address is copied,
and what fusedstep cannot take raises ValueError naming the argument. Where the
semantics differ from vLLM's kernels: docs/integration.md, "vLLM".
"""

__all__ = ["fused_kda_decode", "kda_spec_verify", "FUSED_KDA_DECODE_PARAMETERS",
           "KDA_SPEC_VERIFY_PARAMETERS"]

from ._common import (HEAD_DIM, _check_indices, _check_state, _describe,  # noqa: F401
                      _fail, _need, _rows_view)

# vLLM's ops.fused_kda_decode (vllm/_custom_ops.py), as KimiK3DeltaAttention._forward
# calls it by keyword (vllm/models/kimi_k3/nvidia/kda.py) and as its torch op
# torch.ops._C.fused_kda_decode orders them.
FUSED_KDA_DECODE_PARAMETERS = (
    "x", "weight", "bias", "conv_state", "raw_g", "raw_beta", "A_log", "dt_bias",
    "state_indices", "state", "out", "lower_bound", "output_gate", "norm_weight", "norm_eps")

# The verify sequence's inputs, named as in KimiK3DeltaAttention._forward
# (mixed_qkv_spec is mixed_qkv there when the batch holds verify requests only).
KDA_SPEC_VERIFY_PARAMETERS = (
    "mixed_qkv", "g1", "g2", "beta", "conv_state", "conv_weights", "conv_bias", "A_log",
    "dt_bias", "lower_bound", "recurrent_state", "spec_state_indices_tensor",
    "num_accepted_tokens", "spec_query_start_loc", "num_spec_decodes", "norm_weight",
    "norm_eps", "core_attn_out")


def _check_lower_bound(function, lower_bound):
    if lower_bound is None:
        raise ValueError(
            f"{function}: lower_bound is None (vLLM's unbounded gate, -exp(A_log) * "
            f"softplus(raw_g + dt_bias)); fusedstep computes the bounded K3 gate "
            f"lower_bound * sigmoid(exp(A_log) * (raw_g + dt_bias)) only: pass the "
            f"model's gate_lower_bound (K3: -5.0)")


def fused_kda_decode(x, weight, bias, conv_state, raw_g, raw_beta, A_log, dt_bias,
                     state_indices, state, out=None, lower_bound=None, output_gate=None,
                     norm_weight=None, norm_eps=1e-5):
    """vLLM's ``ops.fused_kda_decode`` on fusedstep: the K3 q = 1 decode step (conv,
    q/k L2 norm, gate, delta rule, gated RMSNorm) of B requests, one launch.

    ``x`` [B, 3 * dim] bf16 (the q|k|v columns of the input projection, row stride free);
    ``weight`` [3, 4, dim] (the layer's ``decode_conv1d_weight``) or [3 * dim, 4];
    ``bias`` None or [3 * dim] float32; ``conv_state`` [slots, 3 * dim, taps >= 3], any
    strides (the layer's view of either cache layout), updated in place; ``raw_g``
    [1, B, heads, 128] bf16 (F_B applied by the engine); ``raw_beta`` [1, B, heads] bf16;
    ``A_log`` [heads] float32; ``dt_bias`` [dim] float32; ``state_indices`` [B] int32
    (slot <= 0 or >= slots: padding, zero output, no cache touched); ``state``
    [slots, heads, 128 (v), 128 (k)] float32 or bfloat16, slot stride free, updated in
    place; ``out`` [1, B, heads, 128] bf16 (allocated when None); ``lower_bound`` the
    gate's bound (< 0; None raises); ``output_gate`` [B, heads, 128] bf16 and
    ``norm_weight`` [128] (float32 or bf16) of the gated RMSNorm (None raises). Returns
    ``out``."""
    import torch
    from .. import kda_decode

    f = "fused_kda_decode"
    _check_lower_bound(f, lower_bound)
    _need(f, "output_gate", output_gate, "the gated RMSNorm's gate [B, heads, 128] (it "
          "always applies the norm)")
    _need(f, "norm_weight", norm_weight, "the gated RMSNorm's weight [128]")
    if x.dim() != 2:
        _fail(f, "x", x, "[B, 3 * dim]")
    batch = x.shape[0]
    heads = A_log.shape[0]
    dim = heads * HEAD_DIM
    if x.shape[1] != 3 * dim:
        _fail(f, "x", x, f"[B, {3 * dim}] (3 * heads * 128, heads = A_log.shape[0] = {heads})")
    _check_indices(f, "state_indices", state_indices, (batch,))
    _check_state(f, "state", state, heads)
    raw_gate = _rows_view(f, "raw_g", raw_g, (1, batch, heads, HEAD_DIM), batch, dim,
                          True)
    beta = _rows_view(f, "raw_beta", raw_beta, (1, batch, heads), batch, heads, True)
    gate = _rows_view(f, "output_gate", output_gate, (batch, heads, HEAD_DIM), batch, dim, False)
    if out is None:
        out = torch.empty((1, batch, heads, HEAD_DIM), dtype=x.dtype, device=x.device)
    written = _rows_view(f, "out", out, (1, batch, heads, HEAD_DIM), batch, dim, True)
    kda_decode(x, beta, gate, weight, A_log, dt_bias, norm_weight, conv_state, state,
               state_indices, raw_gate=raw_gate, conv_bias=bias, tokens=1,
               lower_bound=float(lower_bound), norm_eps=float(norm_eps), out=written)
    return out


def _check_query_start_loc(f, qsl, batch, q):
    """Host check (outside CUDA-graph capture) that the verify rows are ``b * q + t``:
    every request with tokens starts at ``b * q`` and has at most ``q``."""
    import torch
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return
    starts = [int(v) for v in qsl[:batch + 1].tolist()]
    for b in range(batch):
        n = starts[b + 1] - starts[b]
        if n < 0 or n > q or (n > 0 and starts[b] != b * q):
            raise ValueError(
                f"kda_spec_verify: spec_query_start_loc: {starts}; request {b} has {n} "
                f"tokens from row {starts[b]}; fusedstep's verify takes q = {q} rows per "
                f"request (row b * q + t; a request may have fewer tokens, 0 to {q}, at "
                f"the start of its rows): a varlen batch whose requests do not start at "
                f"b * {q} does not map")


def kda_spec_verify(mixed_qkv, g1, g2, beta, conv_state, conv_weights, conv_bias, A_log,
                    dt_bias, lower_bound, recurrent_state, spec_state_indices_tensor,
                    num_accepted_tokens, spec_query_start_loc, num_spec_decodes, norm_weight,
                    norm_eps, core_attn_out):
    """The verify sequence of ``KimiK3DeltaAttention._forward`` for a batch of verify
    requests only (``causal_conv1d_update`` with ``conv_state_indices =
    spec_state_indices_tensor[:, 0]``, ``num_accepted_tokens`` and ``query_start_loc``;
    ``fused_recurrent_kda`` with ``ssm_state_indices = spec_state_indices_tensor`` and
    ``num_accepted_tokens``; then ``o_norm(core_attn_out, g2)``) as one fusedstep verify
    launch with ``tokens = q = spec_state_indices_tensor.shape[1]``.

    Rows are ``b * q + t``. ``spec_query_start_loc`` must describe exactly that: request b
    starts at row ``b * q`` and has ``n_b <= q`` tokens (its rows ``t >= n_b`` are
    padding, passed as ``token_counts = diff(spec_query_start_loc)``); other varlen
    layouts raise ValueError naming it (checked on the host outside CUDA-graph capture,
    which synchronizes the stream once; inside capture there is no check and no sync, and
    the layout is the caller's guarantee). ``mixed_qkv`` [>= B * q,
    3 * dim], ``g1`` [1, >= B * q, heads, 128], ``g2`` [>= B * q, heads, 128], ``beta``
    [1, >= B * q, heads] (bf16 views of the projection), ``conv_state`` [slots, 3 * dim,
    taps >= q + 2] (the layer's view), ``conv_weights`` [3 * dim, 4], ``conv_bias`` None or
    [3 * dim], ``A_log`` [heads], ``dt_bias`` [dim], ``lower_bound`` (< 0),
    ``recurrent_state`` [slots, heads, 128 (v), 128 (k)], ``spec_state_indices_tensor``
    [>= B, q] int32, ``num_accepted_tokens`` [>= B] int32, ``num_spec_decodes`` B,
    ``norm_weight`` [128] (``o_norm.weight``, bf16 or float32), ``norm_eps``,
    ``core_attn_out`` [1, >= B * q, heads, 128] bf16: rows ``0 .. B * q - 1`` are written
    (padding rows zero). Returns ``core_attn_out``."""
    from .. import kda_decode

    f = "kda_spec_verify"
    _check_lower_bound(f, lower_bound)
    _need(f, "norm_weight", norm_weight, "the gated RMSNorm's weight [128] (o_norm.weight)")
    batch = int(num_spec_decodes)
    if batch < 0:
        raise ValueError(f"{f}: num_spec_decodes: {batch}; expected >= 0")
    if spec_state_indices_tensor.dim() != 2 or spec_state_indices_tensor.shape[0] < batch:
        _fail(f, "spec_state_indices_tensor", spec_state_indices_tensor,
              f"[>= {batch}, q] int32 (q = 1 + num_speculative_tokens)")
    q = spec_state_indices_tensor.shape[1]
    if not 2 <= q <= 8:
        _fail(f, "spec_state_indices_tensor", spec_state_indices_tensor,
              "q = shape[1] in 2..8 (fusedstep's verify takes 2 to 8 tokens per request)")
    heads = A_log.shape[0]
    dim = heads * HEAD_DIM
    rows = batch * q
    slots = spec_state_indices_tensor[:batch]
    _check_indices(f, "spec_state_indices_tensor", slots, (batch, q))
    if num_accepted_tokens.dim() != 1 or num_accepted_tokens.shape[0] < batch:
        _fail(f, "num_accepted_tokens", num_accepted_tokens, f"[>= {batch}] int32")
    accepted = num_accepted_tokens[:batch]
    _check_indices(f, "num_accepted_tokens", accepted, (batch,))
    if spec_query_start_loc.dim() != 1 or spec_query_start_loc.shape[0] < batch + 1:
        _fail(f, "spec_query_start_loc", spec_query_start_loc, f"[>= {batch + 1}] int32")
    _check_state(f, "recurrent_state", recurrent_state, heads)
    if conv_state.dim() != 3 or conv_state.shape[1] != 3 * dim or conv_state.shape[2] < q + 2:
        _fail(f, "conv_state", conv_state, f"[slots, {3 * dim}, taps >= q + 2 = {q + 2}] (the "
              "layer's [slot, channel, tap] view; vLLM allocates conv_width - 1 + "
              "num_speculative_tokens taps)")

    def leading(name, t, lead):
        if t.dim() < 2 or (t.shape[1] if lead else t.shape[0]) < rows:
            _fail(f, name, t, f"at least B * q = {batch} * {q} = {rows} rows (row b * q + t)")
        return t[:, :rows] if lead else t[:rows]

    if mixed_qkv.dim() != 2 or mixed_qkv.shape[1] != 3 * dim:
        _fail(f, "mixed_qkv", mixed_qkv, f"[>= {rows}, {3 * dim}]")
    x = leading("mixed_qkv", mixed_qkv, False)
    raw_gate = _rows_view(f, "g1", leading("g1", g1, True), (1, rows, heads, HEAD_DIM), rows, dim,
                          True)
    raw_beta = _rows_view(f, "beta", leading("beta", beta, True), (1, rows, heads), rows, heads, True)
    gate = _rows_view(f, "g2", leading("g2", g2, False), (rows, heads, HEAD_DIM), rows, dim, False)
    written = _rows_view(f, "core_attn_out", leading("core_attn_out", core_attn_out, True),
                         (1, rows, heads, HEAD_DIM), rows, dim, True)
    _check_query_start_loc(f, spec_query_start_loc, batch, q)
    qsl = spec_query_start_loc[:batch + 1]
    token_counts = (qsl[1:] - qsl[:-1]).to(slots.dtype)
    kda_decode(x, raw_beta, gate, conv_weights, A_log, dt_bias, norm_weight, conv_state,
               recurrent_state, slots, raw_gate=raw_gate, conv_bias=conv_bias,
               accepted=accepted, token_counts=token_counts, tokens=q,
               lower_bound=float(lower_bound), norm_eps=float(norm_eps), out=written)
    return core_attn_out
