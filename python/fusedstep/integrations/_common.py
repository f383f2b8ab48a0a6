# SPDX-License-Identifier: Apache-2.0
"""Checks the engine drop-ins share (fusedstep.integrations.vllm, .sglang): each raises
ValueError naming the engine's argument, its shape, dtype and strides, and what fusedstep
expects. Torch is imported only where a check needs it."""

HEAD_DIM = 128
MAX_HEADS = 256  # fusedstep's KDA kernels (src/kda_decode/check.cc, kMaxHeads)


def _describe(t):
    return (f"shape {tuple(t.shape)}, dtype {t.dtype}, strides {tuple(t.stride())}"
            if hasattr(t, "stride") else f"{type(t).__name__} {t!r}")


def _fail(function, name, value, expected):
    raise ValueError(f"{function}: {name}: {_describe(value)}; expected {expected}")


def _need(function, name, value, what):
    if value is None:
        raise ValueError(f"{function}: {name} is None; fusedstep needs {what}")


def _rows_view(function, name, t, shape, rows, width, lead):
    """``t`` of ``shape`` (``lead``: with the engine's leading dim of 1) as ``[rows,
    width]``, a view: the dims merged into a row must be packed (they are in the engine's
    layouts; the rows' stride is free)."""
    if tuple(t.shape) != tuple(shape):
        _fail(function, name, t, f"shape {tuple(shape)}")
    body = t[0] if lead else t
    try:
        return body.view(rows, width)
    except RuntimeError:
        _fail(function, name, t, f"shape {tuple(shape)} with each row's {width} elements "
              "packed (a row-strided view is fine; this view would need a copy)")


def _check_state(function, name, state, heads):
    if state.dim() != 4 or tuple(state.shape[1:]) != (heads, HEAD_DIM, HEAD_DIM):
        _fail(function, name, state, f"[slots, {heads}, 128 (v), 128 (k)]")
    if state.stride(3) != 1 or state.stride(2) != HEAD_DIM:
        transposed = state.stride(2) == 1 and state.stride(3) == HEAD_DIM
        _fail(function, name, state,
              "each head's [128 (v), 128 (k)] matrix row-major (strides (.., 128, 1)): "
              "fusedstep reads state[s, h, v, :] as one contiguous k row"
              + ("; this is the transposed [k, v] layout, which fusedstep's state cannot "
                 "express by strides: store the state as [slots, heads, v, k]"
                 if transposed else ""))
    if state.stride(1) != HEAD_DIM * HEAD_DIM:
        _fail(function, name, state, "each slot's [heads, 128, 128] contiguous (strides "
              "(pitch, 16384, 128, 1)); only the slot stride is free")


def _per_head(function, name, t, heads):
    """``t`` (``heads`` elements: [heads], or e.g. the [1, 1, heads, 1] parameter some K3 /
    Kimi Linear modules keep) as a [heads] view."""
    if t.numel() != heads:
        _fail(function, name, t, f"{heads} elements (one per head)")
    try:
        return t.view(heads)
    except RuntimeError:
        _fail(function, name, t, f"{heads} elements that view as [{heads}] (contiguous)")


def _check_indices(function, name, t, shape):
    import torch
    if t.dtype != torch.int32 or tuple(t.shape) != tuple(shape):
        _fail(function, name, t, f"int32 of shape {tuple(shape)}")


def _check_lower_bound(function, lower_bound, gate_input):
    """fusedstep computes the bounded K3 gate only; ``lower_bound=None`` selects the
    engine's unbounded one (Kimi Linear's). ``gate_input``: the engine's name of raw_g."""
    if lower_bound is None:
        raise ValueError(
            f"{function}: lower_bound is None (the engine's unbounded gate -exp(A_log) * "
            f"softplus({gate_input} + dt_bias)); fusedstep computes the bounded K3 gate "
            f"lower_bound * sigmoid(exp(A_log) * ({gate_input} + dt_bias)) only: pass the "
            f"layer's gate_lower_bound (K3: -5.0)")


_RUNS_ON = {}  # CUDA device index -> whether this build has code for its capability


def _arch_capability(arch):
    """"90a" / "100a" / "90a-real" -> "90" / "100": the leading digits."""
    digits = ""
    for ch in arch:
        if not ch.isdigit():
            break
        digits += ch
    return digits


def _device_runs(index):
    """Whether this build of fusedstep has code for CUDA device ``index`` (its capability
    against build_info()["architectures"]; "90a" runs on exactly 9.0, "100a" on 10.0),
    queried once per device."""
    runs = _RUNS_ON.get(index)
    if runs is None:
        import torch
        from .. import build_info
        major, minor = torch.cuda.get_device_capability(index)
        tag = f"{major}{minor}"
        runs = _RUNS_ON[index] = any(_arch_capability(a) == tag for a in build_info()["architectures"])
    return runs


def _tensor_device_runs(t):
    """Whether ``t`` is a CUDA tensor on a device this build has code for (host only)."""
    device = getattr(t, "device", None)
    if getattr(device, "type", None) != "cuda":
        return False
    return _device_runs(device.index if device.index is not None else 0)
