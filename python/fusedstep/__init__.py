"""fusedstep: fused decode-step kernels for hybrid LLMs, from Python.

- ``fusedstep.reference``: the CPU reference (numpy in, float64 numpy out), no GPU and
  no torch needed.
- With torch installed, the torch ops (``torch.ops.fusedstep.*``, registered with
  ``torch.library`` on import) and their Python entry points:
  ``prepare_boundary_weight``, ``mhc_shifted_post_pre_boundary`` (and ``..._out``),
  ``kda_decode``, ``kda_commit`` and the composed reference paths
  (``composed=True``). See docs/integration.md.
"""
from . import _C
from . import reference
from ._common import ROUNDINGS, GATE_MODES, rounding_index, weight_shape

__version__ = "0.1.0"
__all__ = ["reference", "ROUNDINGS", "GATE_MODES", "rounding_index", "weight_shape",
           "prepare_boundary_weight", "has_torch"]

try:  # the torch layer only where torch is importable
    import torch as _torch  # noqa: F401
except ImportError:  # pragma: no cover - exercised in CI, which has no torch
    _torch = None

has_torch = _torch is not None

if has_torch:
    from .ops import (  # noqa: F401
        kda_commit,
        kda_decode,
        mhc_shifted_post_pre_boundary,
        mhc_shifted_post_pre_boundary_out,
        prepare_boundary_weight,
    )
    __all__ += ["kda_commit", "kda_decode", "mhc_shifted_post_pre_boundary",
                "mhc_shifted_post_pre_boundary_out"]
else:
    from .reference import prepare_boundary_weight  # noqa: F401
