# SPDX-License-Identifier: Apache-2.0
"""Names shared by the reference and the torch layer (no torch import here)."""
from . import _C

ROUNDINGS = {"tf32_rna": 0, "tf32_rne": 1, "fp32": 2}
GATE_MODES = {"one_chain": 0, "four_chains": 1, "fma_tree": 2}


def exportable(t):
    """A tensor as the binding reads it through DLPack. torch refuses to export a tensor
    that requires grad (an nn.Parameter outside torch.no_grad / inference_mode); such a
    tensor goes as its detached alias: the same storage, never a copy (the ops are not
    differentiable, and what they write lands in the caller's tensor). numpy arrays, other
    tensors and None pass unchanged."""
    if getattr(t, "requires_grad", False):
        return t.detach()
    return t


def _choice_index(name, value, table):
    """A name of `table` or its integer value -> the integer value (ValueError otherwise)."""
    if isinstance(value, str):
        if value not in table:
            raise ValueError(f"{name} = {value!r} must be one of {sorted(table)}")
        return table[value]
    if isinstance(value, bool) or not isinstance(value, int) or value not in table.values():
        raise ValueError(f"{name} = {value!r} must be one of {sorted(table)} or 0, 1, 2")
    return value


def rounding_index(rounding):
    """'tf32_rna' | 'tf32_rne' | 'fp32' (or 0, 1, 2) -> the C++ WeightRounding value."""
    return _choice_index("rounding", rounding, ROUNDINGS)


def gate_mode_index(mode):
    return _choice_index("gate_mode", mode, GATE_MODES)


def weight_shape(hidden, rounding="tf32_rna"):
    """Shape of prepare_boundary_weight's int32 words: [16 slices, k16 steps, m16 tiles,
    32 lanes, 4 registers] (3 m tiles for the TF32 modes, 5 for FP32)."""
    r = rounding_index(rounding)
    words = _C.mhc_boundary_weight_words(int(hidden), r)  # validates hidden
    steps = hidden // 64
    return (16, steps, words // (16 * steps * 128), 32, 4)


def rounding_of_weight(weight_numel, hidden):
    """The rounding family a prepared weight of `weight_numel` words was made with: 0
    (TF32: 2 BF16 parts, rna and rne are streamed alike) or 2 (FP32: 3 parts)."""
    steps = hidden // 64
    return 2 if weight_numel == 16 * steps * 5 * 128 else 0
