# SPDX-License-Identifier: Apache-2.0
"""The CPU reference of both operations (reference/ in the C++ tree), from numpy.

Inputs are numpy arrays (BF16 tensors as uint16 bit patterns) or CPU torch tensors
(moved to the host when they live on a GPU), in the same layouts as the GPU ops.
Outputs are float64 numpy arrays. ``precision="float64"`` is the mathematical truth
of the contract (docs/numerics.md), ``"float32"`` follows the GPU's rounding points.
Inputs are never modified: updated caches come back in the result.
"""
import numpy as np

from . import _C
from ._common import exportable, gate_mode_index, rounding_index, weight_shape

__all__ = ["prepare_boundary_weight", "mhc_boundary", "kda_decode", "kda_commit",
           "bf16_bits", "bf16_value"]


def _host(t):
    """numpy arrays pass; torch tensors go to the CPU (DLPack reads them there), detached
    where they require grad (nn.Parameters)."""
    if t is None or isinstance(t, np.ndarray):
        return t
    t = exportable(t)
    device = getattr(t, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu":
        t = t.cpu()
    return t


def bf16_bits(values):
    """float values -> BF16 bit patterns (uint16), rounded to nearest even."""
    f = np.ascontiguousarray(values, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    nan = np.isnan(f)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, np.uint16(0x7FC0), rounded).astype(np.uint16)


def bf16_value(bits):
    """BF16 bit patterns (uint16) -> float32 values."""
    b = np.ascontiguousarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32)


def prepare_boundary_weight(fn, rounding="tf32_rna"):
    """fn [24, 4 * hidden] float32 -> the prepared mixer weight, int32 words
    [16, hidden / 64, m_tiles, 32, 4] (host; the torch op does the same on the GPU)."""
    r = rounding_index(rounding)
    fn = _host(fn)
    if isinstance(fn, np.ndarray):
        fn = np.ascontiguousarray(fn)
    if fn.ndim != 2 or fn.shape[0] != 24 or fn.shape[1] % 4:
        raise ValueError(f"prepare_boundary_weight: fn: shape {tuple(fn.shape)}; expected [24, 4 * hidden]")
    out = np.empty(weight_shape(fn.shape[1] // 4, r), dtype=np.int32)
    _C.prepare_boundary_weight(fn, out, r, 0)
    return out


def mhc_boundary(x, residual, pre_mix, post_mix, comb_res_mix, fn, scale, base, hc_norm_eps,
                 hc_pre_eps, hc_post_scale, sinkhorn_eps, num_sinkhorn_iters, norm_weight,
                 norm_eps, *, rounding="tf32_rna", precision="float64"):
    """mhc_shifted_post_pre_boundary on the CPU, with the unprepared ``fn``.

    Returns a dict of float64 arrays: residual_out [T, 4, H], layer_input [T, H], pre
    [T, 4], post [T, 4], comb [T, 4, 4] and the intermediates mix [T, 24], ssq [T],
    ssq_li [T], li [T, H]."""
    return _C.reference_mhc_boundary(
        _host(x), _host(residual), _host(post_mix), _host(comb_res_mix), _host(pre_mix),
        _host(fn), _host(scale), _host(base), _host(norm_weight), rounding_index(rounding),
        float(hc_norm_eps), float(hc_pre_eps), float(sinkhorn_eps), float(hc_post_scale),
        float(norm_eps), int(num_sinkhorn_iters), precision)


def kda_decode(x, raw_beta, output_gate, conv_weight, a_log, dt_bias, norm_weight, conv_state,
               state, slots, *, f_a=None, f_b_weight=None, raw_gate=None, conv_bias=None,
               accepted=None, token_counts=None, record_slots=None, record_rows=None,
               tokens=1, lower_bound=-5.0, q_scale=128 ** -0.5, norm_eps=1e-5,
               gate_mode="one_chain", precision="float64"):
    """The KDA decode (tokens = 1) / verify (tokens 2-8) step on the CPU, with the
    torch op's argument layouts. ``record_slots=R`` turns RecoverSSM records on.
    ``conv_state`` and ``state`` are float32 or BF16 (a bfloat16 tensor or uint16 bit
    patterns), as the op takes them: a BF16 state is read exactly and every state the step
    stores is rounded to BF16 once (nearest even; in float64 mode straight from the double).

    Returns a dict of float64 arrays: output [rows, dim], state [slots, heads, 128,
    128], conv_state [slots, 3 dim, taps] (the whole caches after the step), raw_g
    [rows, dim], conv_out [rows, 3 dim] and, with records, record_correction [R, heads,
    tokens, 128] and record_key_gate [R, heads, tokens, 256] (untouched rows NaN)."""
    a_log = _host(a_log)
    heads = a_log.shape[0] if getattr(a_log, "ndim", 0) == 1 else 0
    records = None
    if record_slots is not None:
        records = np.empty((int(record_slots), heads, int(tokens), 128), dtype=np.float32)
    return _C.reference_kda_decode(
        _host(x), _host(f_a), _host(raw_gate), _host(raw_beta), _host(output_gate),
        _host(conv_weight), _host(conv_bias), _host(f_b_weight), a_log, _host(dt_bias),
        _host(norm_weight), _host(conv_state), _host(state), _host(slots), _host(accepted),
        _host(token_counts), records, _host(record_rows), int(tokens), float(lower_bound),
        float(q_scale), float(norm_eps), gate_mode_index(gate_mode), precision)


def kda_commit(state, slots, accepted, record_correction, record_key_gate, a_log, dt_bias, *,
               tokens, record_rows=None, lower_bound=-5.0, precision="float64"):
    """The RecoverSSM commit on the CPU: folds the first clamp(accepted[b], 0, tokens)
    records into checkpoint slot slots[b]. Records as kda_decode returned them (float64)
    or as the GPU wrote them (float32 / bfloat16). ``state`` is float32 or BF16 (bfloat16 or
    uint16 bit patterns): a BF16 checkpoint is read exactly and the folded state rounded to
    BF16 once. Returns the state after the commit, float64 [slots, heads, 128, 128]."""
    return _C.reference_kda_commit(
        _host(state), _host(slots), _host(accepted), _host(record_correction),
        _host(record_key_gate), _host(record_rows), _host(a_log), _host(dt_bias), int(tokens),
        float(lower_bound), precision)
