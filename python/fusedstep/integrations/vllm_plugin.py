# SPDX-License-Identifier: Apache-2.0
"""vLLM general plugin (entry point group ``vllm.general_plugins``, name ``fusedstep``):
swaps fusedstep's drop-ins into vLLM when ``FUSEDSTEP_VLLM=1``.

vLLM calls ``register()`` in every process it starts (``vllm/plugins/__init__.py``,
``load_general_plugins``), before the model is built. With the variable unset (or not
one of 1 / true / yes / on) ``register()`` returns at once: no vLLM import, no patch, no
log line. Enabled, it checks vLLM's version (``TESTED_VLLM``) and, per model, that every
module, attribute and signature below is the one fusedstep was written against, then
replaces these module attributes (vLLM 0.33.0 source):

- Kimi K3 KDA decode: ``vllm._custom_ops.fused_kda_decode`` (``KimiK3DeltaAttention._forward``
  in ``vllm/models/kimi_k3/nvidia/kda.py`` calls it as ``ops.fused_kda_decode``, looked
  up per call) and ``vllm.models.kimi_k3.nvidia.kda.is_fused_kda_decode_supported`` (the
  gate ``resolve_kda_decode_backend`` consults), so the native decode backend is chosen
  where fusedstep runs the step even when vLLM's compiled ``torch.ops._C.fused_kda_decode``
  is absent.
- DeepSeek-V4.1 mHC: ``mhc_shifted_post_pre`` in ``vllm.models.deepseek_v41.nvidia.model``
  (the name ``DeepseekV4DecoderLayer.forward`` / ``write_kv`` call, bound there by
  ``from .ops.mhc import``) and in ``vllm.models.deepseek_v41.nvidia.ops.mhc``.

None of these is a vLLM ``CustomOp``: the mHC CustomOps (``vllm/model_executor/layers/mhc.py``)
are the unshifted V4 seam (``MHCFusedPostPreOp``) and the AMD V4.1 model's
``MHCPreDelayedOp``, so nothing is registered through ``CustomOp.register_oot``.

Each replacement calls fusedstep only for what fusedstep computes and the GPU it has code
for, and otherwise the function it replaced, with the same arguments. What the plugin
cannot patch it refuses with one logging warning naming it (what it did patch is named in
the same line); it never raises into vLLM's startup.
"""
import importlib
import inspect
import logging
import os
import re

from . import _common
from ._common import MAX_HEADS

__all__ = ["register", "ENV", "TESTED_VLLM", "enabled"]

ENV = "FUSEDSTEP_VLLM"
# [first, last) (major, minor) of the vLLM releases whose source this plugin was checked
# against: 0.33.x (the 0.33.0 wheel's sources).
TESTED_VLLM = ((0, 33), (0, 34))

# A child of vLLM's "vllm" logger, so vLLM's handler, format and level apply to its lines.
logger = logging.getLogger("vllm.fusedstep")

_KDA_GATE_PARAMETERS = ("num_heads", "head_dim", "conv_width", "num_spec", "input_dtype",
                        "conv_state_dtype", "recurrent_state_dtype")
_MHC_HIDDEN_MULTIPLE = 512


def enabled():
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _one_line(e):
    """An exception as text on one line (the refusal is one log line)."""
    return " ".join(f"{type(e).__name__}: {e}".split())


def register():
    """The entry point vLLM calls. Idempotent: vLLM may load plugins more than once."""
    if not enabled():
        return
    try:
        patched, refused = _register()
    except Exception as e:  # never into vLLM's startup
        patched, refused = [], [_one_line(e)]
    if refused:
        logger.warning("fusedstep: %s=1: not patched: %s%s", ENV, "; ".join(refused),
                       f"; patched: {', '.join(patched)}" if patched else "")
    elif patched:
        logger.info("fusedstep: %s=1: patched %s", ENV, ", ".join(patched))


# ---------------------------------------------------------------- checks
def _version_problem():
    try:
        vllm = importlib.import_module("vllm")
    except Exception as e:
        return f"vllm is not importable ({_one_line(e)})"
    version = getattr(vllm, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as dist_version
            version = dist_version("vllm")
        except Exception:
            return "vllm's version is unknown (no vllm.__version__)"
    m = re.match(r"(\d+)\.(\d+)", str(version))
    low, high = TESTED_VLLM
    if m is None or not low <= (int(m.group(1)), int(m.group(2))) < high:
        return (f"vLLM {version} is outside the tested range >= {low[0]}.{low[1]}, "
                f"< {high[0]}.{high[1]}")
    return None


def _lookup(module_name, attr, parameters, problems):
    """``module_name.attr`` if it exists with exactly these parameter names, else None
    (a problem appended)."""
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        problems.append(f"{module_name} ({_one_line(e)})")
        return None, None
    if not hasattr(module, attr):
        problems.append(f"{module_name}.{attr} (missing)")
        return None, None
    fn = getattr(module, attr)
    original = getattr(fn, "_fusedstep_original", fn)
    try:
        names = tuple(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        names = None
    if names != tuple(parameters):
        problems.append(f"{module_name}.{attr} (signature {names}, expected "
                        f"{tuple(parameters)})")
        return None, None
    return module, fn


def _install(module, attr, make, fn):
    """module.attr = make(original), once: a second register() keeps the first patch."""
    if getattr(fn, "_fusedstep_original", None) is not None:
        return fn
    patch = make(fn)
    patch._fusedstep_original = fn
    setattr(module, attr, patch)
    return patch


def _register():
    problem = _version_problem()
    if problem is not None:
        return [], [problem]
    from . import vllm as fv
    patched, refused = [], []

    problems = []
    ops, decode = _lookup("vllm._custom_ops", "fused_kda_decode",
                          fv.FUSED_KDA_DECODE_PARAMETERS, problems)
    kda, gate = _lookup("vllm.models.kimi_k3.nvidia.kda", "is_fused_kda_decode_supported",
                        _KDA_GATE_PARAMETERS, problems)
    if kda is not None and ops is not None and getattr(kda, "ops", None) is not ops:
        problems.append("vllm.models.kimi_k3.nvidia.kda.ops (not vllm._custom_ops: the "
                        "layer does not call ops.fused_kda_decode there)")
    if problems:
        refused.append("Kimi K3 KDA decode: " + ", ".join(problems))
    else:
        _install(ops, "fused_kda_decode", _kda_decode_patch, decode)
        _install(kda, "is_fused_kda_decode_supported", _kda_gate_patch, gate)
        patched += ["vllm._custom_ops.fused_kda_decode",
                    "vllm.models.kimi_k3.nvidia.kda.is_fused_kda_decode_supported"]

    problems = []
    model, seam = _lookup("vllm.models.deepseek_v41.nvidia.model", "mhc_shifted_post_pre",
                          fv.MHC_SHIFTED_POST_PRE_PARAMETERS, problems)
    mhc_ops, ops_seam = _lookup("vllm.models.deepseek_v41.nvidia.ops.mhc",
                                "mhc_shifted_post_pre", fv.MHC_SHIFTED_POST_PRE_PARAMETERS,
                                problems)
    if problems:
        refused.append("DeepSeek-V4.1 mHC: " + ", ".join(problems))
    else:
        patch = _install(mhc_ops, "mhc_shifted_post_pre", _mhc_patch, ops_seam)
        if getattr(seam, "_fusedstep_original", None) is None:
            # The model module bound the same function by name: give it the same patch.
            if seam is ops_seam:
                model.mhc_shifted_post_pre = patch
            else:
                _install(model, "mhc_shifted_post_pre", _mhc_patch, seam)
        patched += ["vllm.models.deepseek_v41.nvidia.model.mhc_shifted_post_pre",
                    "vllm.models.deepseek_v41.nvidia.ops.mhc.mhc_shifted_post_pre"]
    return patched, refused


# ---------------------------------------------------------------- the GPU fusedstep runs on
def _current_device_runs():
    import torch
    return torch.cuda.is_available() and _common._device_runs(torch.cuda.current_device())


# ---------------------------------------------------------------- the replacements
def _kda_decode_patch(original):
    from . import vllm as fv

    def fused_kda_decode(x, weight, bias, conv_state, raw_g, raw_beta, A_log, dt_bias,
                         state_indices, state, out=None, lower_bound=None, output_gate=None,
                         norm_weight=None, norm_eps=1e-5):
        # vLLM's unbounded gate and its norm-less call are vLLM's op's to run.
        if (lower_bound is None or output_gate is None or norm_weight is None
                or not _common._tensor_device_runs(x)):
            return original(x, weight, bias, conv_state, raw_g, raw_beta, A_log, dt_bias,
                            state_indices, state, out, lower_bound, output_gate, norm_weight,
                            norm_eps)
        return fv.fused_kda_decode(x, weight, bias, conv_state, raw_g, raw_beta, A_log,
                                   dt_bias, state_indices, state, out, lower_bound,
                                   output_gate, norm_weight, norm_eps)

    fused_kda_decode.__doc__ = ("vLLM's ops.fused_kda_decode, patched by fusedstep's vLLM "
                                "plugin (fusedstep.integrations.vllm.fused_kda_decode).")
    return fused_kda_decode


def _kda_gate_patch(original):
    def is_fused_kda_decode_supported(num_heads, head_dim, conv_width, num_spec, input_dtype,
                                      conv_state_dtype, recurrent_state_dtype):
        if original(num_heads, head_dim, conv_width, num_spec, input_dtype, conv_state_dtype,
                    recurrent_state_dtype):
            return True
        import torch
        return (1 <= num_heads <= MAX_HEADS and head_dim == 128 and conv_width == 4
                and num_spec == 0 and input_dtype == torch.bfloat16
                and conv_state_dtype == torch.bfloat16
                and recurrent_state_dtype in (torch.float32, torch.bfloat16)
                and _current_device_runs())

    is_fused_kda_decode_supported.__doc__ = (
        "vLLM's gate, patched by fusedstep's vLLM plugin: also true where fusedstep runs "
        "the q = 1 step on this GPU.")
    return is_fused_kda_decode_supported


def _mhc_patch(original):
    from . import vllm as fv

    def mhc_shifted_post_pre(x, residual, post_layer_mix, comb_res_mix, fn, hc_scale,
                             hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps,
                             hc_post_mult_value, sinkhorn_repeat, pre_mix=None,
                             norm_weight=None, norm_eps=1e-6, capture_aux=False, *,
                             stream=None, reduce_results=False):
        # vLLM keeps: the unshifted first seam, the aux capture, the fused TP all-reduce
        # (and its unfinalized MoE output), shapes fusedstep has no kernel for, other GPUs.
        if (pre_mix is None or norm_weight is None or capture_aux or reduce_results
                or not hasattr(x, "stride") or residual.dim() != 3
                or residual.shape[1] != fv.HC_MULT
                or residual.shape[2] % _MHC_HIDDEN_MULTIPLE != 0 or not _common._tensor_device_runs(residual)):
            return original(x, residual, post_layer_mix, comb_res_mix, fn, hc_scale, hc_base,
                            rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value,
                            sinkhorn_repeat, pre_mix, norm_weight, norm_eps, capture_aux,
                            stream=stream, reduce_results=reduce_results)
        return fv.mhc_shifted_post_pre(x, residual, post_layer_mix, comb_res_mix, fn,
                                       hc_scale, hc_base, rms_eps, hc_pre_eps,
                                       hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat,
                                       pre_mix, norm_weight, norm_eps, capture_aux,
                                       stream=stream, reduce_results=reduce_results)

    mhc_shifted_post_pre.__doc__ = ("vLLM's DeepSeek-V4.1 mhc_shifted_post_pre, patched by "
                                    "fusedstep's vLLM plugin "
                                    "(fusedstep.integrations.vllm.mhc_shifted_post_pre).")
    return mhc_shifted_post_pre
