# SPDX-License-Identifier: Apache-2.0
"""Drop-ins: fusedstep behind the call signatures of the engines' own kernels.

- ``fusedstep.integrations.vllm``: vLLM's Kimi K3 KDA decode op (``fused_kda_decode``),
  its speculative verify sequence (``kda_spec_verify``) and DeepSeek-V4.1's mHC seam
  (``mhc_shifted_post_pre``, ``mhc_shifted_post_pre_deep_gemm``), with vLLM's argument
  names and tensor layouts.
- ``fusedstep.integrations.vllm_plugin``: the ``vllm.general_plugins`` entry point that
  swaps those drop-ins into vLLM when ``FUSEDSTEP_VLLM=1`` (not imported here).
- ``fusedstep.integrations.sglang``: SGLang's Kimi K3 fused KDA decode module
  (``kda_fused_decode`` and its ``covered`` predicate), with SGLang's argument names and
  tensor layouts.

Each drop-in is a thin call into a fusedstep op: engine tensors go in as views
(never copies of what the kernel addresses), and whatever does not map onto fusedstep
raises ValueError naming the argument. Importing this package needs no torch; calling a
drop-in does. docs/integration.md, "vLLM" and "SGLang", list where the semantics differ
from the engines' kernels and what does not map.
"""
from . import sglang, vllm  # noqa: F401

__all__ = ["sglang", "vllm"]
