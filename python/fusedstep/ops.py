# SPDX-License-Identifier: Apache-2.0
"""The torch ops: ``torch.library`` registrations in the engines' style and their
Python entry points.

Registered on import (namespace ``fusedstep``, a FRAGMENT library):

- ``prepare_boundary_weight(Tensor fn, int rounding) -> Tensor`` (CPU and CUDA);
- ``mhc_boundary(...) -> (Tensor, Tensor, Tensor, Tensor, Tensor)`` (functional) and
  ``mhc_boundary_out(..., Tensor(a!) new_residual, ..., Tensor(e!) new_pre) -> ()``;
- ``kda_decode(..., Tensor(a!) conv_state, Tensor(b!) state, ..., Tensor(c!) output, ...) -> ()``
  and ``kda_decode_records`` (RecoverSSM records ``Tensor(d!)``, ``Tensor(e!)``);
- ``kda_commit(Tensor(a!) state, ...) -> ()``.

The KDA ops take the recurrent ``state`` in float32 or bfloat16: its dtype is the C++
``state_dtype`` (``DType::kFp32`` / ``DType::kBf16``), any other raises ValueError naming
``state`` (``kda_decode`` and ``kda_commit`` state what a BF16 state computes).

Each has a CUDA kernel (a plain Python function registered with ``Library.impl``,
which calls the nanobind binding; no ``torch.library.custom_op`` wrapper) and a fake
implementation for torch.compile. Kernels run on torch's current CUDA stream of the
tensors' device, so they are captured by ``torch.cuda.CUDAGraph`` and ordered with
the caller's other work. ``composed=True`` runs the composed reference path (one
simple kernel per stage, bitwise equal to the fused kernel) instead. The CPU kernels
of the GPU-only ops raise ``ValueError`` naming the first CPU tensor and pointing at
``fusedstep.reference``, before any other check.

``mhc_plan`` and ``kda_plan`` take the arguments of ``mhc_shifted_post_pre_boundary`` and
``kda_decode`` and return the schedule that call would run (the C++ ``plan()``), as a dict.
"""
import torch

from . import _C
from ._common import exportable, gate_mode_index, rounding_index, rounding_of_weight
from . import reference as _reference

__all__ = ["prepare_boundary_weight", "mhc_shifted_post_pre_boundary",
           "mhc_shifted_post_pre_boundary_out", "kda_decode", "kda_commit", "mhc_plan",
           "kda_plan", "library"]

library = torch.library.Library("fusedstep", "FRAGMENT")

_MHC_ARGS = (
    "Tensor x, Tensor residual, Tensor pre_mix, Tensor post_mix, Tensor comb_res_mix, "
    "Tensor weight, Tensor scale, Tensor base, float hc_norm_eps, float hc_pre_eps, "
    "float hc_post_scale, float sinkhorn_eps, int num_sinkhorn_iters, Tensor norm_weight, "
    "float norm_eps, int rounding, bool composed, bool pdl")
_KDA_ARGS = (
    "Tensor x, Tensor? f_a, Tensor? raw_gate, Tensor raw_beta, Tensor output_gate, "
    "Tensor conv_weight, Tensor? conv_bias, Tensor? f_b_weight, Tensor a_log, Tensor dt_bias, "
    "Tensor norm_weight, Tensor(a!) conv_state, Tensor(b!) state, Tensor slots, "
    "Tensor? accepted, Tensor? token_counts, Tensor(c!) output")
_KDA_SCALARS = ("int tokens, float lower_bound, float q_scale, float norm_eps, int gate_mode, "
                "int[] schedule, bool composed, bool pdl")

library.define("prepare_boundary_weight(Tensor fn, int rounding) -> Tensor")
library.define(f"mhc_boundary({_MHC_ARGS}) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
library.define(f"mhc_boundary_out({_MHC_ARGS}, Tensor(a!) new_residual, Tensor(b!) new_post, "
               "Tensor(c!) new_comb, Tensor(d!) layer_input, Tensor(e!) new_pre) -> ()")
library.define(f"kda_decode({_KDA_ARGS}, {_KDA_SCALARS}) -> ()")
library.define(f"kda_decode_records({_KDA_ARGS}, Tensor(d!) record_correction, "
               f"Tensor(e!) record_key_gate, Tensor? record_rows, {_KDA_SCALARS}) -> ()")
library.define("kda_commit(Tensor(a!) state, Tensor slots, Tensor accepted, "
               "Tensor record_correction, Tensor record_key_gate, Tensor? record_rows, "
               "Tensor a_log, Tensor dt_bias, int tokens, float lower_bound, bool pdl) -> ()")


# ---------------------------------------------------------------- helpers
def _bound(*tensors):
    """Tensors as they cross into the binding: those that require grad (nn.Parameter
    weights outside inference mode, which DLPack refuses to export) as their detached
    aliases, never copies (exportable)."""
    return tuple(exportable(t) for t in tensors)


def _stream(device):
    return torch.cuda.current_stream(device).cuda_stream


class _on_device:
    """torch.cuda.device(device) only when it is not current already (cheap path)."""

    def __init__(self, device):
        self.guard = None
        if device.index is not None and device.index != torch.cuda.current_device():
            self.guard = torch.cuda.device(device)

    def __enter__(self):
        if self.guard is not None:
            self.guard.__enter__()

    def __exit__(self, *exc):
        if self.guard is not None:
            return self.guard.__exit__(*exc)
        return False


def _fits_rows(t):
    """What the kernels read with 16-byte vectors: an aligned base, every dimension but
    the first packed, and rows a multiple of 16 bytes apart."""
    if t.data_ptr() % 16:
        return False
    expect = 1
    for d in range(t.dim() - 1, 0, -1):
        if t.size(d) != 1 and t.stride(d) != expect:
            return False
        expect *= t.size(d)
    return t.dim() == 0 or t.size(0) <= 1 or t.stride(0) % (16 // t.element_size()) == 0


def _fits_dense(t):
    return t.data_ptr() % 16 == 0 and t.is_contiguous()


def _dense(t):
    return t.clone(memory_format=torch.contiguous_format)


def _input(t, fits=_fits_rows):
    """The fallback for views the kernel cannot address: a packed, aligned copy."""
    if t is None or fits(t):
        return t
    return _dense(t)


def _output(t, fits=_fits_rows):
    """(tensor to write, tensor to copy it into afterwards or None)."""
    if fits(t):
        return t, None
    return torch.empty(t.shape, dtype=t.dtype, device=t.device), t


_STATE_DTYPES = (torch.float32, torch.bfloat16)  # DType::kFp32, DType::kBf16


def _check_state_dtype(function, state):
    """ValueError naming ``state`` unless it is float32 or bfloat16 (the binding reads
    uint16 bit patterns as BF16, and DLPack exports some dtypes the ops never take)."""
    if state.dtype not in _STATE_DTYPES:
        raise ValueError(f"{function}: state: shape {tuple(state.shape)}, dtype {state.dtype}; "
                         f"expected dtype torch.float32 or torch.bfloat16 (the recurrent state's "
                         f"dtype, FP32 or BF16)")


def _workspace(nbytes, device):
    return torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=device)


# What each GPU-only op is called from Python and its CPU counterpart in fusedstep.reference.
_CPU_COUNTERPART = {
    "mhc_boundary": ("mhc_shifted_post_pre_boundary", "mhc_boundary"),
    "mhc_boundary_out": ("mhc_shifted_post_pre_boundary", "mhc_boundary"),
    "kda_decode": ("kda_decode", "kda_decode"),
    "kda_decode_records": ("kda_decode", "kda_decode"),
    "kda_commit": ("kda_commit", "kda_commit"),
}


def _reject_cpu(op, named, function=None):
    """ValueError naming the first CPU tensor of (name, value) pairs, if any (`function`:
    the Python function named in the message, default the op's)."""
    for name, value in named:
        if isinstance(value, torch.Tensor) and value.device.type == "cpu":
            default_function, reference = _CPU_COUNTERPART[op]
            function = function or default_function
            raise ValueError(
                f"{function}: {name} is a CPU tensor (shape {tuple(value.shape)}, dtype "
                f"{value.dtype}); the fused kernels run on CUDA tensors, all on one device. "
                f"On the CPU, fusedstep.reference.{reference} computes the operation (numpy "
                f"arrays or CPU tensors in, float64 numpy arrays out).")


def _cpu_kernel(op):
    """The CPU kernel of a GPU-only op: the dispatcher picks it when no argument is a CUDA
    tensor, so its first tensor argument is on the CPU; it is named before any dtype or
    shape is looked at (instead of the dispatcher's generic "Could not run ... 'CPU'
    backend" error)."""
    names = [a.name for a in getattr(torch.ops.fusedstep, op).default._schema.arguments]

    def kernel(*args):
        _reject_cpu(op, zip(names, args))
        raise ValueError(f"{_CPU_COUNTERPART[op][0]}: the fused kernels run on CUDA tensors; "
                         f"fusedstep.reference.{_CPU_COUNTERPART[op][1]} runs on the CPU")

    return kernel


# ---------------------------------------------------------------- weight preparation
def _prepare_weight_shape(fn, rounding):
    steps = (fn.shape[1] // 4) // 64
    return (16, steps, 5 if rounding == 2 else 3, 32, 4)


def _prepare_cpu(fn, rounding):
    out = torch.empty(_prepare_weight_shape(fn, rounding), dtype=torch.int32)
    _C.prepare_boundary_weight(*_bound(fn.contiguous()), out, rounding, 0)
    return out


def _prepare_cuda(fn, rounding):
    out = torch.empty(_prepare_weight_shape(fn, rounding), dtype=torch.int32, device=fn.device)
    with _on_device(fn.device):
        _C.prepare_boundary_weight(*_bound(_input(fn, _fits_dense)), out, rounding, _stream(fn.device))
    return out


def _prepare_fake(fn, rounding):
    return fn.new_empty(_prepare_weight_shape(fn, rounding), dtype=torch.int32)


library.impl("prepare_boundary_weight", _prepare_cpu, "CPU")
library.impl("prepare_boundary_weight", _prepare_cuda, "CUDA")
torch.library.register_fake("fusedstep::prepare_boundary_weight", _prepare_fake, lib=library)


def prepare_boundary_weight(fn, rounding="tf32_rna"):
    """fn [24, 4 * hidden] float32 -> the prepared mixer weight, int32 [16, hidden / 64,
    m_tiles, 32, 4] on fn's device (once per layer, at load time). rounding:
    'tf32_rna' (the seed's, DeepGEMM on sm_100), 'tf32_rne' (DeepGEMM's TMA path on
    sm_90) or 'fp32' (no rounding; 1.5x the bytes). A numpy fn gives a numpy weight."""
    if not isinstance(fn, torch.Tensor):
        return _reference.prepare_boundary_weight(fn, rounding)
    return torch.ops.fusedstep.prepare_boundary_weight(fn, rounding_index(rounding))


# ---------------------------------------------------------------- mHC boundary
_MHC_MAX_TOKENS = int(_C.MHC_MAX_TOKENS)


def _mhc_out_cuda(x, residual, pre_mix, post_mix, comb_res_mix, weight, scale, base,
                  hc_norm_eps, hc_pre_eps, hc_post_scale, sinkhorn_eps, num_sinkhorn_iters,
                  norm_weight, norm_eps, rounding, composed, pdl, new_residual, new_post,
                  new_comb, layer_input, new_pre, plan=False):
    """The CUDA kernel of mhc_boundary_out; with plan=True, the plan() of the launch it
    would make (of the first one where more than 2^20 tokens take several), run nothing."""
    device = residual.device
    x, residual = _input(x), _input(residual)
    pre_mix, post_mix, comb_res_mix, weight, scale, base, norm_weight = (
        _input(t, _fits_dense)
        for t in (pre_mix, post_mix, comb_res_mix, weight, scale, base, norm_weight))
    outs = [_output(new_residual), _output(new_post, _fits_dense), _output(new_comb, _fits_dense),
            _output(layer_input), _output(new_pre, _fits_dense)]
    o_res, o_post, o_comb, o_li, o_pre = (o for o, _ in outs)
    tokens = residual.shape[0]
    scalars = (rounding, float(hc_norm_eps), float(hc_pre_eps), float(sinkhorn_eps),
               float(hc_post_scale), float(norm_eps), int(num_sinkhorn_iters))
    with _on_device(device):
        stream = 0 if plan else _stream(device)
        # More tokens than one launch takes (2^20): consecutive launches of the same
        # kernel (a token's bits do not depend on its batch).
        for start in range(0, max(tokens, 1), _MHC_MAX_TOKENS):
            s = slice(start, min(start + _MHC_MAX_TOKENS, tokens))
            args = _bound(x[s], residual[s], post_mix[s], comb_res_mix[s], pre_mix[s], weight,
                          scale, base, norm_weight, o_res[s], o_li[s], o_pre[s], o_post[s], o_comb[s])
            if plan:
                result = _C.mhc_boundary(*args, *scalars, _C.MODE_PLAN, 0, None, False)
                result["launches"] = max(1, -(-tokens // _MHC_MAX_TOKENS))
                return result
            workspace = None
            mode = _C.MODE_LAUNCH
            if composed:
                mode = _C.MODE_COMPOSED
                workspace = _workspace(
                    _C.mhc_boundary(*args, *scalars, _C.MODE_WORKSPACE, 0, None, False), device)
            _C.mhc_boundary(*args, *scalars, mode, stream, workspace, bool(pdl))
    for written, target in outs:
        if target is not None:
            target.copy_(written)


def _mhc_out_fake(x, residual, pre_mix, post_mix, comb_res_mix, weight, scale, base,
                  hc_norm_eps, hc_pre_eps, hc_post_scale, sinkhorn_eps, num_sinkhorn_iters,
                  norm_weight, norm_eps, rounding, composed, pdl, new_residual, new_post,
                  new_comb, layer_input, new_pre):
    return None


def _mhc_empty_outputs(x, residual):
    tokens, mult, hidden = residual.shape
    return (residual.new_empty((tokens, mult, hidden)),
            residual.new_empty((tokens, mult, 1), dtype=torch.float32),
            residual.new_empty((tokens, mult, mult), dtype=torch.float32),
            residual.new_empty((tokens, hidden)),
            residual.new_empty((tokens, mult), dtype=torch.float32))


def _mhc_cuda(x, residual, pre_mix, post_mix, comb_res_mix, weight, scale, base, hc_norm_eps,
              hc_pre_eps, hc_post_scale, sinkhorn_eps, num_sinkhorn_iters, norm_weight,
              norm_eps, rounding, composed, pdl):
    outs = _mhc_empty_outputs(x, residual)
    _mhc_out_cuda(x, residual, pre_mix, post_mix, comb_res_mix, weight, scale, base,
                  hc_norm_eps, hc_pre_eps, hc_post_scale, sinkhorn_eps, num_sinkhorn_iters,
                  norm_weight, norm_eps, rounding, composed, pdl, *outs)
    return outs


def _mhc_fake(x, residual, pre_mix, post_mix, comb_res_mix, weight, scale, base, hc_norm_eps,
              hc_pre_eps, hc_post_scale, sinkhorn_eps, num_sinkhorn_iters, norm_weight,
              norm_eps, rounding, composed, pdl):
    return _mhc_empty_outputs(x, residual)


library.impl("mhc_boundary", _mhc_cuda, "CUDA")
library.impl("mhc_boundary_out", _mhc_out_cuda, "CUDA")
library.impl("mhc_boundary", _cpu_kernel("mhc_boundary"), "CPU")
library.impl("mhc_boundary_out", _cpu_kernel("mhc_boundary_out"), "CPU")
torch.library.register_fake("fusedstep::mhc_boundary", _mhc_fake, lib=library)
torch.library.register_fake("fusedstep::mhc_boundary_out", _mhc_out_fake, lib=library)


def _mhc_rounding(weight, residual, rounding):
    if rounding is not None:
        return rounding_index(rounding)
    return rounding_of_weight(weight.numel(), residual.shape[-1])


def mhc_shifted_post_pre_boundary(x, residual, pre_mix, post_mix, comb_res_mix, weight, scale,
                                  base, hc_norm_eps, hc_pre_eps, hc_post_scale, sinkhorn_eps,
                                  num_sinkhorn_iters, norm_weight, norm_eps, *, out=None,
                                  rounding=None, composed=False, pdl=False):
    """The DeepSeek-V4.1 shifted mHC boundary of one seam, one kernel launch:
    ``mhc_shifted_post_pre_deep_gemm`` with ``weight = prepare_boundary_weight(fn)``.

    x [T, H] bf16 (the sublayer output), residual [T, 4, H] bf16, pre_mix [T, 4] (the
    previous site's pre), post_mix [T, 4, 1] / [T, 4], comb_res_mix [T, 4, 4] float32,
    scale [3], base [24] float32, norm_weight [H] bf16. Returns
    ``(new_residual [T, 4, H], new_post [T, 4, 1], new_comb [T, 4, 4], layer_input [T, H],
    new_pre [T, 4])``; with ``out=`` (five tensors of those shapes) writes them there and
    returns ``out``. Never returns None: bad arguments raise ValueError, and views the
    kernel cannot address are copied first. ``rounding`` defaults to the one the weight's
    size implies; ``composed=True`` runs the composed reference path. ``pdl=True``
    (programmatic dependent launch) only where the kernel before it on the stream
    triggers early launch and writes none of weight, norm_weight, scale, base
    (docs/integration.md, "PDL"); ``mhc_plan`` with the same arguments says what runs."""
    r = _mhc_rounding(weight, residual, rounding)
    if out is not None:
        return mhc_shifted_post_pre_boundary_out(
            x, residual, pre_mix, post_mix, comb_res_mix, weight, scale, base, hc_norm_eps,
            hc_pre_eps, hc_post_scale, sinkhorn_eps, num_sinkhorn_iters, norm_weight, norm_eps,
            out=out, rounding=r, composed=composed, pdl=pdl)
    return torch.ops.fusedstep.mhc_boundary(
        x, residual, pre_mix, post_mix, comb_res_mix, weight, scale, base, float(hc_norm_eps),
        float(hc_pre_eps), float(hc_post_scale), float(sinkhorn_eps), int(num_sinkhorn_iters),
        norm_weight, float(norm_eps), r, bool(composed), bool(pdl))


_MHC_TENSOR_NAMES = ("x", "residual", "pre_mix", "post_mix", "comb_res_mix", "weight", "scale",
                     "base", "norm_weight")


def mhc_plan(x, residual, pre_mix, post_mix, comb_res_mix, weight, scale, base, hc_norm_eps,
             hc_pre_eps, hc_post_scale, sinkhorn_eps, num_sinkhorn_iters, norm_weight, norm_eps,
             *, out=None, rounding=None, composed=False, pdl=False):
    """What ``mhc_shifted_post_pre_boundary`` with the same arguments would run, without
    running it (the C++ ``plan()`` for the tensors' device; pure host code once the
    device's facts are cached). Raises what the call would raise for bad arguments.
    Returns a dict:

    - ``path``: ``"fused"`` or ``"composed"`` (``composed=True``: the composed reference
      path; no other entries then but ``pdl`` and ``launches``);
    - ``pdl``: whether the launch uses programmatic dependent launch;
    - ``tile`` (tokens per 16-CTA cluster), ``clusters``, ``waves``, ``ctas_per_sm`` (1: the
      small-batch configuration, 2: two CTAs per SM): the MhcBoundaryPlan;
    - ``launches``: consecutive launches (more than 2^20 tokens; the plan is the first's)."""
    r = _mhc_rounding(weight, residual, rounding)
    tensors = (x, residual, pre_mix, post_mix, comb_res_mix, weight, scale, base, norm_weight)
    _reject_cpu("mhc_boundary", zip(_MHC_TENSOR_NAMES, tensors), "mhc_plan")
    tokens = residual.shape[0]
    launches = max(1, -(-tokens // _MHC_MAX_TOKENS))
    if composed:
        return {"path": "composed", "pdl": False, "launches": launches}
    outs = tuple(out) if out is not None else _mhc_empty_outputs(x, residual)
    if len(outs) != 5:
        raise ValueError(f"out: expected 5 tensors (new_residual, new_post, new_comb, "
                         f"layer_input, new_pre), have {len(outs)}")
    result = _mhc_out_cuda(x, residual, pre_mix, post_mix, comb_res_mix, weight, scale, base,
                           hc_norm_eps, hc_pre_eps, hc_post_scale, sinkhorn_eps,
                           num_sinkhorn_iters, norm_weight, norm_eps, r, False, bool(pdl),
                           *outs, plan=True)
    return {"path": "fused", "pdl": bool(pdl), **result}


def mhc_shifted_post_pre_boundary_out(x, residual, pre_mix, post_mix, comb_res_mix, weight,
                                      scale, base, hc_norm_eps, hc_pre_eps, hc_post_scale,
                                      sinkhorn_eps, num_sinkhorn_iters, norm_weight, norm_eps,
                                      *, out, rounding=None, composed=False, pdl=False):
    """mhc_shifted_post_pre_boundary into caller-owned tensors ``out = (new_residual,
    new_post, new_comb, layer_input, new_pre)`` (allocation-free replays). Returns out."""
    if len(out) != 5:
        raise ValueError(f"out: expected 5 tensors (new_residual, new_post, new_comb, "
                         f"layer_input, new_pre), have {len(out)}")
    r = _mhc_rounding(weight, residual, rounding)
    torch.ops.fusedstep.mhc_boundary_out(
        x, residual, pre_mix, post_mix, comb_res_mix, weight, scale, base, float(hc_norm_eps),
        float(hc_pre_eps), float(hc_post_scale), float(sinkhorn_eps), int(num_sinkhorn_iters),
        norm_weight, float(norm_eps), r, bool(composed), bool(pdl), *out)
    return tuple(out)


# ---------------------------------------------------------------- KDA decode / verify
def _kda_cuda(x, f_a, raw_gate, raw_beta, output_gate, conv_weight, conv_bias, f_b_weight,
              a_log, dt_bias, norm_weight, conv_state, state, slots, accepted, token_counts,
              output, record_correction, record_key_gate, record_rows, tokens, lower_bound,
              q_scale, norm_eps, gate_mode, schedule, composed, pdl, plan=False):
    """The CUDA kernel of kda_decode(_records); with plan=True, the plan() of the launch
    it would make, run nothing."""
    _check_state_dtype("kda_plan" if plan else "kda_decode", state)
    device = output.device
    x, f_a, raw_gate, output_gate = (_input(t) for t in (x, f_a, raw_gate, output_gate))
    if raw_beta.dim() == 2 and raw_beta.size(1) > 1 and raw_beta.stride(1) != 1:
        raw_beta = _dense(raw_beta)
    conv_bias, f_b_weight, a_log, dt_bias, norm_weight, accepted, token_counts, record_rows = (
        _input(t, _fits_dense) for t in (conv_bias, f_b_weight, a_log, dt_bias, norm_weight,
                                         accepted, token_counts, record_rows))
    if slots.dim() == 1 or (slots.size(1) > 1 and slots.stride(1) != 1):
        slots = slots.contiguous()
    written, target = _output(output)
    schedule = list(schedule) + _schedule_list(None)[len(schedule):]
    cluster, lanes, early, evict = schedule[:len(_SCHEDULE_KEYS)]
    args = _bound(x, f_a, raw_gate, raw_beta, output_gate, conv_weight, conv_bias, f_b_weight,
                  a_log, dt_bias, norm_weight, conv_state, state, slots, accepted, token_counts,
                  written, record_correction, record_key_gate, record_rows) + (
        int(tokens), float(lower_bound), float(q_scale), float(norm_eps), int(gate_mode),
        int(cluster), int(lanes), int(early), bool(evict))
    if plan:
        return _C.kda_decode(*args, _C.MODE_PLAN, 0, None, False)
    with _on_device(device):
        workspace = None
        mode = _C.MODE_LAUNCH
        if composed:
            mode = _C.MODE_COMPOSED
            workspace = _workspace(_C.kda_decode(*args, _C.MODE_WORKSPACE, 0, None, False), device)
        _C.kda_decode(*args, mode, _stream(device), workspace, bool(pdl))
    if target is not None:
        target.copy_(written)


def _kda_plain_cuda(x, f_a, raw_gate, raw_beta, output_gate, conv_weight, conv_bias, f_b_weight,
                    a_log, dt_bias, norm_weight, conv_state, state, slots, accepted,
                    token_counts, output, tokens, lower_bound, q_scale, norm_eps, gate_mode,
                    schedule, composed, pdl):
    _kda_cuda(x, f_a, raw_gate, raw_beta, output_gate, conv_weight, conv_bias, f_b_weight, a_log,
              dt_bias, norm_weight, conv_state, state, slots, accepted, token_counts, output,
              None, None, None, tokens, lower_bound, q_scale, norm_eps, gate_mode, schedule,
              composed, pdl)


def _kda_records_cuda(x, f_a, raw_gate, raw_beta, output_gate, conv_weight, conv_bias,
                      f_b_weight, a_log, dt_bias, norm_weight, conv_state, state, slots,
                      accepted, token_counts, output, record_correction, record_key_gate,
                      record_rows, tokens, lower_bound, q_scale, norm_eps, gate_mode, schedule,
                      composed, pdl):
    _kda_cuda(x, f_a, raw_gate, raw_beta, output_gate, conv_weight, conv_bias, f_b_weight, a_log,
              dt_bias, norm_weight, conv_state, state, slots, accepted, token_counts, output,
              record_correction, record_key_gate, record_rows, tokens, lower_bound, q_scale,
              norm_eps, gate_mode, schedule, composed, pdl)


def _kda_plain_fake(*args):
    return None


def _kda_records_fake(*args):
    return None


def _commit_cuda(state, slots, accepted, record_correction, record_key_gate, record_rows, a_log,
                 dt_bias, tokens, lower_bound, pdl):
    _check_state_dtype("kda_commit", state)
    device = state.device
    slots, accepted, record_correction, record_key_gate, record_rows, a_log, dt_bias = (
        _input(t, _fits_dense) for t in (slots, accepted, record_correction, record_key_gate,
                                         record_rows, a_log, dt_bias))
    with _on_device(device):
        _C.kda_commit(*_bound(state, slots, accepted, record_correction, record_key_gate,
                              record_rows, a_log, dt_bias), int(tokens), float(lower_bound),
                      _C.MODE_LAUNCH, _stream(device), bool(pdl))


def _commit_fake(*args):
    return None


library.impl("kda_decode", _kda_plain_cuda, "CUDA")
library.impl("kda_decode_records", _kda_records_cuda, "CUDA")
library.impl("kda_commit", _commit_cuda, "CUDA")
for _op in ("kda_decode", "kda_decode_records", "kda_commit"):
    library.impl(_op, _cpu_kernel(_op), "CPU")
torch.library.register_fake("fusedstep::kda_decode", _kda_plain_fake, lib=library)
torch.library.register_fake("fusedstep::kda_decode_records", _kda_records_fake, lib=library)
torch.library.register_fake("fusedstep::kda_commit", _commit_fake, lib=library)

_SCHEDULE_KEYS = ("cluster", "lanes_per_row", "early", "evict_first")


def _schedule_list(schedule):
    """None | dict with the KdaSchedule fields | sequence in that order -> 4 ints."""
    values = [0, 0, -1, 0]
    if schedule is None:
        return values
    if isinstance(schedule, dict):
        unknown = set(schedule) - set(_SCHEDULE_KEYS)
        if unknown:
            raise ValueError(f"schedule: unknown keys {sorted(unknown)}; expected {_SCHEDULE_KEYS}")
        for i, key in enumerate(_SCHEDULE_KEYS):
            if key in schedule:
                values[i] = int(schedule[key])
        return values
    schedule = list(schedule)
    if len(schedule) > len(_SCHEDULE_KEYS):
        raise ValueError(f"schedule: {len(schedule)} values; expected at most {len(_SCHEDULE_KEYS)} "
                         f"{_SCHEDULE_KEYS}")
    values[:len(schedule)] = [int(v) for v in schedule]
    return values


def kda_decode(x, raw_beta, output_gate, conv_weight, a_log, dt_bias, norm_weight, conv_state,
               state, slots, *, f_a=None, f_b_weight=None, raw_gate=None, conv_bias=None,
               accepted=None, token_counts=None, record_correction=None, record_key_gate=None,
               record_rows=None, tokens=1, lower_bound=-5.0, q_scale=128 ** -0.5,
               norm_eps=1e-5, gate_mode="one_chain", schedule=None, out=None, composed=False,
               pdl=False):
    """The Kimi K3 KDA decode (tokens = 1) / speculative verify (tokens 2-8) step of one
    layer, one kernel launch. ``conv_state`` [slots, 3 dim, taps] (bfloat16 or float32, any
    strides) and ``state`` [slots, heads, 128, 128] are updated in place (without records);
    with ``record_correction`` and ``record_key_gate`` (RecoverSSM) the read slot is a
    checkpoint left unchanged and the records are written. Returns the output [batch *
    tokens, dim] (``out`` when given).

    ``state`` is float32 or bfloat16 (its dtype picks the kernel's; anything else raises
    ValueError), each slot's [heads, 128, 128] contiguous and the slot stride free (pitched:
    >= heads * 128 * 128 elements, a multiple of 16 bytes). A bfloat16 state is converted
    exactly to FP32 when loaded, the step runs in FP32, and each stored state is rounded to
    BF16 (nearest even) once: at q = 1 after the step, in a verify after each token it
    stores; the records stay FP32 (correction) and BF16 (k | raw_g).

    Layouts: docs/integration.md and include/fusedstep/kda_decode.h. ``pdl=True``
    (programmatic dependent launch) only where the kernel before it on the stream
    triggers early launch and writes nothing the schedule reads before its wait
    (docs/integration.md, "PDL"); ``kda_plan`` with the same arguments says what runs."""
    out, common, records, scalars = _kda_arguments(
        x, raw_beta, output_gate, conv_weight, a_log, dt_bias, norm_weight, conv_state, state,
        slots, f_a, f_b_weight, raw_gate, conv_bias, accepted, token_counts, record_correction,
        record_key_gate, record_rows, tokens, lower_bound, q_scale, norm_eps, gate_mode,
        schedule, out, composed, pdl)
    if records is None:
        torch.ops.fusedstep.kda_decode(*common, *scalars)
    else:
        torch.ops.fusedstep.kda_decode_records(*common, *records, *scalars)
    return out


def _kda_arguments(x, raw_beta, output_gate, conv_weight, a_log, dt_bias, norm_weight,
                   conv_state, state, slots, f_a, f_b_weight, raw_gate, conv_bias, accepted,
                   token_counts, record_correction, record_key_gate, record_rows, tokens,
                   lower_bound, q_scale, norm_eps, gate_mode, schedule, out, composed, pdl):
    """kda_decode's arguments in the ops' order: (out, tensors, records or None, scalars)."""
    tokens = int(tokens)
    if out is None:
        out = x.new_empty((slots.shape[0] * tokens, a_log.shape[0] * 128))
    common = (x, f_a, raw_gate, raw_beta, output_gate, conv_weight, conv_bias, f_b_weight, a_log,
              dt_bias, norm_weight, conv_state, state, slots, accepted, token_counts, out)
    scalars = (tokens, float(lower_bound), float(q_scale), float(norm_eps),
               gate_mode_index(gate_mode), _schedule_list(schedule), bool(composed), bool(pdl))
    records = None
    if record_correction is None and record_key_gate is None:
        if record_rows is not None:
            raise ValueError("kda_decode: record_rows is given without record_correction and "
                             "record_key_gate")
    else:
        if record_correction is None or record_key_gate is None:
            raise ValueError("kda_decode: records need both record_correction and record_key_gate")
        records = (record_correction, record_key_gate, record_rows)
    return out, common, records, scalars


_KDA_TENSOR_NAMES = ("x", "f_a", "raw_gate", "raw_beta", "output_gate", "conv_weight", "conv_bias",
                     "f_b_weight", "a_log", "dt_bias", "norm_weight", "conv_state", "state",
                     "slots", "accepted", "token_counts", "out")


def kda_plan(x, raw_beta, output_gate, conv_weight, a_log, dt_bias, norm_weight, conv_state,
             state, slots, *, f_a=None, f_b_weight=None, raw_gate=None, conv_bias=None,
             accepted=None, token_counts=None, record_correction=None, record_key_gate=None,
             record_rows=None, tokens=1, lower_bound=-5.0, q_scale=128 ** -0.5,
             norm_eps=1e-5, gate_mode="one_chain", schedule=None, out=None, composed=False,
             pdl=False):
    """What ``kda_decode`` with the same arguments would run, without running it (the C++
    ``plan()`` for the tensors' device; pure host code once the device's facts are
    cached). Raises what the call would raise for bad arguments. Returns a dict:

    - ``path``: ``"fused"`` (one launch of the fused kernel) or ``"composed"``
      (``composed=True``: the composed reference path; no other entries then but ``pdl``);
    - ``pdl``: whether the launch uses programmatic dependent launch;
    - ``schedule``: the KdaSchedule with every default resolved (``cluster``,
      ``lanes_per_row``, ``early``, ...): passing it as ``schedule=`` runs the same;
    - ``ctas``: CTAs of the launch; ``waves``: the estimated waves of them."""
    out, common, records, scalars = _kda_arguments(
        x, raw_beta, output_gate, conv_weight, a_log, dt_bias, norm_weight, conv_state, state,
        slots, f_a, f_b_weight, raw_gate, conv_bias, accepted, token_counts, record_correction,
        record_key_gate, record_rows, tokens, lower_bound, q_scale, norm_eps, gate_mode,
        schedule, out, composed, pdl)
    named = list(zip(_KDA_TENSOR_NAMES, common))
    if records is not None:
        named += list(zip(("record_correction", "record_key_gate", "record_rows"), records))
    _reject_cpu("kda_decode", named, "kda_plan")
    if composed:
        return {"path": "composed", "pdl": False}
    result = _kda_cuda(*common, *(records or (None, None, None)), *scalars, plan=True)
    return {"path": "fused", "pdl": bool(pdl), **result}


def kda_commit(state, slots, accepted, record_correction, record_key_gate, a_log, dt_bias, *,
               record_rows=None, tokens=None, lower_bound=-5.0, pdl=False):
    """RecoverSSM commit: folds the first clamp(accepted[b], 0, tokens) recorded tokens
    of request b into its checkpoint slot ``slots[b]`` of ``state`` (in place; slots <= 0
    are skipped). ``state`` is float32 or bfloat16, as the verify that wrote the records
    read it: a bfloat16 checkpoint is converted exactly to FP32, the records are folded in
    FP32 and the result is rounded to BF16 (nearest even) once when stored. ``tokens``
    defaults to the records' token dimension. Returns state."""
    if tokens is None:
        tokens = record_correction.shape[2]
    torch.ops.fusedstep.kda_commit(state, slots, accepted, record_correction, record_key_gate,
                                   record_rows, a_log, dt_bias, int(tokens), float(lower_bound),
                                   bool(pdl))
    return state
