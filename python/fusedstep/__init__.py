# SPDX-License-Identifier: Apache-2.0
"""fusedstep: fused decode-step kernels for hybrid LLMs, from Python.

- ``fusedstep.reference``: the CPU reference (numpy in, float64 numpy out), no GPU and
  no torch needed.
- ``fusedstep.build_info()``: version, commit, the CUDA toolkit it was built with and the
  GPU architectures it holds code for.
- With torch installed, the torch ops (``torch.ops.fusedstep.*``, registered with
  ``torch.library`` on import) and their Python entry points:
  ``prepare_boundary_weight``, ``mhc_shifted_post_pre_boundary`` (and ``..._out``),
  ``kda_decode``, ``kda_commit``, the composed reference paths (``composed=True``) and
  ``mhc_plan`` / ``kda_plan`` (the schedule a call would run). See docs/integration.md.
"""
from . import _C
from . import reference
from ._common import ROUNDINGS, GATE_MODES, rounding_index, weight_shape


def build_info():
    """What this build of fusedstep is, as a dict: ``version``, ``commit`` (git, "unknown"
    outside a checkout), ``cuda_version`` (the toolkit the kernels were compiled with),
    ``architectures`` (CMAKE_CUDA_ARCHITECTURES, e.g. ``['90a', '100a']``: a GPU whose
    compute capability none of them runs on is refused at its first call with an error
    naming both) and ``cuda_runtime`` (``"static"``: no libcudart needed at run time)."""
    return _C.build_info()


__version__ = _C.build_info()["version"]
__all__ = ["reference", "ROUNDINGS", "GATE_MODES", "rounding_index", "weight_shape",
           "prepare_boundary_weight", "has_torch", "build_info"]

try:  # the torch layer only where torch is importable
    import torch as _torch  # noqa: F401
except ImportError:  # pragma: no cover - exercised in CI, which has no torch
    _torch = None

has_torch = _torch is not None

_TORCH_ONLY = ("kda_commit", "kda_decode", "kda_plan", "mhc_plan", "mhc_shifted_post_pre_boundary",
               "mhc_shifted_post_pre_boundary_out")

if has_torch:
    from .ops import (  # noqa: F401
        kda_commit,
        kda_decode,
        kda_plan,
        mhc_plan,
        mhc_shifted_post_pre_boundary,
        mhc_shifted_post_pre_boundary_out,
        prepare_boundary_weight,
    )
    __all__ += list(_TORCH_ONLY)
else:
    from .reference import prepare_boundary_weight  # noqa: F401

    def __getattr__(name):
        if name in _TORCH_ONLY:  # an AttributeError, so that hasattr() stays False
            raise AttributeError(f"fusedstep.{name} needs torch (pip install torch); without "
                                 f"it fusedstep.reference computes the operations on the CPU")
        raise AttributeError(f"module 'fusedstep' has no attribute {name!r}")
