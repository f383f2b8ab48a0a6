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

- ``mhc_shifted_post_pre``: the signature of vLLM's DeepSeek-V4.1 seam dispatcher
  (``vllm/models/deepseek_v41/nvidia/ops/mhc.py``, called twice per layer by
  ``DeepseekV4DecoderLayer.forward``): post step, mixer GEMM, new coefficients and the
  collapse with the carried ``pre_mix`` plus RMSNorm, as one fusedstep boundary.
- ``mhc_shifted_post_pre_deep_gemm``: the signature of its Mega-mHC branch
  (``ops/mega_mhc.py``), whose argument order fusedstep's boundary already has.

The KDA drop-ins are thin calls into ``fusedstep.kda_decode``, the mHC ones into
``fusedstep.mhc_shifted_post_pre_boundary``: every engine tensor goes in as a view (row
strides and pitched slots as they are), nothing the kernel can address is copied, and
what fusedstep cannot take raises ValueError naming the argument. The mHC drop-ins take
vLLM's raw ``fn`` [24, 4H] and prepare it once per weight tensor (``boundary_weight``).
Where the semantics differ from vLLM's kernels: docs/integration.md, "vLLM".
"""

import weakref

__all__ = ["fused_kda_decode", "kda_spec_verify", "mhc_shifted_post_pre",
           "mhc_shifted_post_pre_deep_gemm", "boundary_weight", "MHC_ROUNDING",
           "FUSED_KDA_DECODE_PARAMETERS", "KDA_SPEC_VERIFY_PARAMETERS",
           "MHC_SHIFTED_POST_PRE_PARAMETERS", "MHC_SHIFTED_POST_PRE_DEEP_GEMM_PARAMETERS"]

from ._common import (HEAD_DIM, _check_indices, _check_lower_bound, _check_state, _fail,  # noqa: F401
                      _need, _per_head, _rows_view)

HC_MULT = 4

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


def fused_kda_decode(x, weight, bias, conv_state, raw_g, raw_beta, A_log, dt_bias,
                     state_indices, state, out=None, lower_bound=None, output_gate=None,
                     norm_weight=None, norm_eps=1e-5):
    """vLLM's ``ops.fused_kda_decode`` on fusedstep: the K3 q = 1 decode step (conv,
    q/k L2 norm, gate, delta rule, gated RMSNorm) of B requests, one launch.

    ``x`` [B, 3 * dim] bf16 (the q|k|v columns of the input projection, row stride free);
    ``weight`` [3, 4, dim] (the layer's ``decode_conv1d_weight``) or [3 * dim, 4];
    ``bias`` None or [3 * dim] float32; ``conv_state`` [slots, 3 * dim, taps >= 3], any
    strides (the layer's view of either cache layout), updated in place; ``raw_g``
    [1, B, heads, 128] bf16 (F_B applied by the engine); ``raw_beta`` [1, B, heads] or
    [B, heads] bf16;
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
    _check_lower_bound(f, lower_bound, "raw_g")
    _need(f, "output_gate", output_gate, "the gated RMSNorm's gate [B, heads, 128] (it "
          "always applies the norm)")
    _need(f, "norm_weight", norm_weight, "the gated RMSNorm's weight [128]")
    if x.dim() != 2:
        _fail(f, "x", x, "[B, 3 * dim]")
    batch = x.shape[0]
    heads = A_log.numel()
    A_log = _per_head(f, "A_log", A_log, heads)
    dim = heads * HEAD_DIM
    if x.shape[1] != 3 * dim:
        _fail(f, "x", x, f"[B, {3 * dim}] (3 * heads * 128, heads = A_log.numel() = {heads})")
    _check_indices(f, "state_indices", state_indices, (batch,))
    _check_state(f, "state", state, heads)
    raw_gate = _rows_view(f, "raw_g", raw_g, (1, batch, heads, HEAD_DIM), batch, dim,
                          True)
    lead = raw_beta.dim() == 3  # [1, B, heads] as the op's schema has it, or the layer's [B, heads]
    beta = _rows_view(f, "raw_beta", raw_beta, (1, batch, heads) if lead else (batch, heads), batch, heads, lead)
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
    _check_lower_bound(f, lower_bound, "raw_g")
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
    heads = A_log.numel()
    A_log = _per_head(f, "A_log", A_log, heads)
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


# ---------------------------------------------------------------- DeepSeek-V4.1 mHC seam
# vLLM's mhc_shifted_post_pre (vllm/models/deepseek_v41/nvidia/ops/mhc.py, vLLM 0.33.0), as
# DeepseekV4DecoderLayer.forward and write_kv (deepseek_v41/nvidia/model.py) call it; the
# last two are keyword-only.
MHC_SHIFTED_POST_PRE_PARAMETERS = (
    "x", "residual", "post_layer_mix", "comb_res_mix", "fn", "hc_scale", "hc_base", "rms_eps",
    "hc_pre_eps", "hc_sinkhorn_eps", "hc_post_mult_value", "sinkhorn_repeat", "pre_mix",
    "norm_weight", "norm_eps", "capture_aux", "stream", "reduce_results")

# vLLM's mhc_shifted_post_pre_deep_gemm (deepseek_v41/nvidia/ops/mega_mhc.py): the order of
# fusedstep.mhc_shifted_post_pre_boundary, with the raw fn where fusedstep takes the
# prepared weight.
MHC_SHIFTED_POST_PRE_DEEP_GEMM_PARAMETERS = (
    "x", "residual", "shifted_prev_mix", "post_mix", "comb_res_mix", "fn", "mix_scales",
    "mix_bases", "hc_norm_eps", "hc_pre_eps", "hc_post_scale", "sinkhorn_eps",
    "num_sinkhorn_iters", "rmsnorm_weight", "rmsnorm_eps")

# The TF32 rounding the mHC drop-ins prepare vLLM's fp32 fn with (prepare_boundary_weight's
# rounding): set it before the first call to match another path ("tf32_rne": DeepGEMM's
# TMA path on sm_90; "fp32": no rounding, vLLM's TileLang FMA path at <= 16 tokens).
MHC_ROUNDING = "tf32_rna"

# id(fn) -> (weakref(fn), data_ptr, version, rounding, prepared weight). Weights live as
# long as the model, so each is prepared once (its first call, in vLLM's eager warm-up
# before graph capture) and dropped when fn is freed.
_PREPARED = {}


def boundary_weight(fn, rounding=None):
    """vLLM's mHC ``fn`` [24, 4H] float32 (the layer's ``hc_attn_fn`` / ``hc_ffn_fn``) as
    fusedstep's prepared mixer weight, prepared on the first call for this tensor and
    rounding and cached while ``fn`` lives (re-prepared if its storage or version
    changes, e.g. a weight reload). An int32 ``fn`` is taken as already prepared and
    passes through. ``rounding`` defaults to ``MHC_ROUNDING``."""
    import torch
    from .. import prepare_boundary_weight

    if fn.dtype == torch.int32:
        return fn
    rounding = MHC_ROUNDING if rounding is None else rounding
    key = id(fn)
    entry = _PREPARED.get(key)
    if (entry is not None and entry[0]() is fn and entry[1] == fn.data_ptr()
            and entry[2] == fn._version and entry[3] == rounding):
        return entry[4]
    weight = prepare_boundary_weight(fn.detach(), rounding=rounding)
    if entry is None or entry[0]() is not fn:
        weakref.finalize(fn, _PREPARED.pop, key, None)
    _PREPARED[key] = (weakref.ref(fn), fn.data_ptr(), fn._version, rounding, weight)
    return weight


def _check_dims(function, name, t, shape, what):
    if not hasattr(t, "shape") or tuple(t.shape) != tuple(shape):
        _fail(function, name, t, f"{what} of shape {tuple(shape)}")


def _mhc_boundary(f, names, x, residual, pre, post, comb, fn, scale, base, hc_norm_eps,
                  hc_pre_eps, hc_post_scale, sinkhorn_eps, iters, norm_weight, norm_eps):
    """Shape checks under the engine's argument ``names``, then one fusedstep boundary."""
    from .. import mhc_shifted_post_pre_boundary

    if not hasattr(x, "stride") or x.dim() != 2:
        _fail(f, names["x"], x, "the sublayer output [T, H] bf16 (finalized: an unfinalized "
              "MoE output goes through vLLM's fused all-reduce)")
    tokens, hidden = x.shape
    _check_dims(f, names["residual"], residual, (tokens, HC_MULT, hidden), "bf16")
    _check_dims(f, names["pre"], pre, (tokens, HC_MULT), "float32 (the previous site's pre)")
    if not hasattr(post, "shape") or tuple(post.shape) not in ((tokens, HC_MULT, 1),
                                                              (tokens, HC_MULT)):
        _fail(f, names["post"], post, f"float32 of shape {(tokens, HC_MULT, 1)} or "
              f"{(tokens, HC_MULT)}")
    _check_dims(f, names["comb"], comb, (tokens, HC_MULT, HC_MULT), "float32 [source, dest]")
    mix = HC_MULT * (HC_MULT + 2)
    import torch
    if fn.dtype != torch.int32:
        if fn.dtype != torch.float32 or tuple(fn.shape) != (mix, HC_MULT * hidden):
            _fail(f, names["fn"], fn, f"float32 of shape {(mix, HC_MULT * hidden)} (or the "
                  "int32 weight fusedstep.prepare_boundary_weight returns)")
    return mhc_shifted_post_pre_boundary(
        x, residual, pre, post, comb, boundary_weight(fn), scale, base, hc_norm_eps,
        hc_pre_eps, hc_post_scale, sinkhorn_eps, iters, norm_weight, norm_eps)


def mhc_shifted_post_pre_deep_gemm(x, residual, shifted_prev_mix, post_mix, comb_res_mix, fn,
                                   mix_scales, mix_bases, hc_norm_eps, hc_pre_eps,
                                   hc_post_scale, sinkhorn_eps, num_sinkhorn_iters,
                                   rmsnorm_weight, rmsnorm_eps):
    """vLLM's ``mhc_shifted_post_pre_deep_gemm`` (DeepGEMM Mega mHC, ``rmsnorm_scale``
    1.0) on fusedstep: one shifted boundary. ``x`` [T, H] bf16, ``residual`` [T, 4, H]
    bf16, ``shifted_prev_mix`` [T, 4] float32 (the previous site's pre), ``post_mix``
    [T, 4, 1], ``comb_res_mix`` [T, 4, 4] float32, ``fn`` [24, 4H] float32 (prepared once,
    ``boundary_weight``), ``mix_scales`` [3], ``mix_bases`` [24], ``rmsnorm_weight`` [H]
    bf16. Returns ``(new_residual [T, 4, H], new_post_mix [T, 4, 1], new_comb_res_mix
    [T, 4, 4], y_bf16 [T, H], new_prev_mix [T, 4])``, as vLLM's does."""
    names = dict(x="x", residual="residual", pre="shifted_prev_mix", post="post_mix",
                 comb="comb_res_mix", fn="fn")
    return _mhc_boundary("mhc_shifted_post_pre_deep_gemm", names, x, residual,
                         shifted_prev_mix, post_mix, comb_res_mix, fn, mix_scales, mix_bases,
                         hc_norm_eps, hc_pre_eps, hc_post_scale, sinkhorn_eps,
                         num_sinkhorn_iters, rmsnorm_weight, rmsnorm_eps)


def mhc_shifted_post_pre(x, residual, post_layer_mix, comb_res_mix, fn, hc_scale, hc_base,
                         rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value,
                         sinkhorn_repeat, pre_mix=None, norm_weight=None, norm_eps=1e-6,
                         capture_aux=False, *, stream=None, reduce_results=False):
    """vLLM's DeepSeek-V4.1 ``mhc_shifted_post_pre`` on fusedstep: the seam's post step,
    mixer GEMM, new coefficients and the collapse of the new residual with the carried
    ``pre_mix`` plus RMSNorm, one launch. Returns vLLM's six outputs ``(residual,
    post_mix [T, 4, 1], comb_mix [T, 4, 4], layer_input [T, H], next_pre [T, 4], aux)``
    with ``aux`` empty ``[0, H]``.

    What vLLM's dispatcher does besides the boundary raises ValueError naming the
    argument (checked before any tensor is read): ``pre_mix=None`` (the unshifted
    collapse with this site's own pre), ``norm_weight=None``, ``capture_aux=True`` (the
    mean of the new residual streams), ``reduce_results=True`` (the tensor-parallel
    all-reduce of ``x``, fused by vLLM into ``all_reduce_mhc``) and an unfinalized MoE
    output as ``x``. ``stream`` (vLLM's side stream for the coefficients) is accepted:
    every output is ready on the current stream, so the caller's join is a no-op."""
    f = "mhc_shifted_post_pre"
    if pre_mix is None:
        raise ValueError(f"{f}: pre_mix is None (the collapse with this site's own pre); "
                         "fusedstep's boundary collapses with the previous site's pre: pass "
                         "the pre the previous seam returned")
    _need(f, "norm_weight", norm_weight, "the sublayer RMSNorm weight [H] (it always applies "
          "the norm)")
    if capture_aux:
        raise ValueError(f"{f}: capture_aux is True; fusedstep does not compute the aux "
                         "hidden state (the mean of the new residual streams)")
    if reduce_results:
        raise ValueError(f"{f}: reduce_results is True; fusedstep does not all-reduce x "
                         "across tensor-parallel ranks: reduce it first and pass False")
    del stream
    names = dict(x="x", residual="residual", pre="pre_mix", post="post_layer_mix",
                 comb="comb_res_mix", fn="fn")
    outputs = _mhc_boundary(f, names, x, residual, pre_mix, post_layer_mix, comb_res_mix, fn,
                            hc_scale, hc_base, rms_eps, hc_pre_eps, hc_post_mult_value,
                            hc_sinkhorn_eps, sinkhorn_repeat, norm_weight, norm_eps)
    return (*outputs, x.new_empty(0, x.shape[1]))
