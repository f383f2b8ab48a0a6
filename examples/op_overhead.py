# SPDX-License-Identifier: Apache-2.0
"""Host overhead of the Python entry points, against CUDA graph replay.

For the mHC boundary (DeepSeek-V4.1-Flash, hidden 5120) and the KDA decode (Kimi K3
TP8, 12 heads, q = 1) at a decode batch, prints per call:
  host   : wall time of enqueueing N calls back to back (no synchronization), / N
  eager  : wall time of N calls plus a final synchronize, / N
  graph  : wall time of replaying a CUDA graph of the same N calls, / N (the GPU time)
for the Python function (fusedstep.*), the torch op (torch.ops.fusedstep.*) and the
nanobind binding called directly (fusedstep._C). Needs torch and an sm_90 GPU.
"""
import time

import torch

import fusedstep
from fusedstep import _C


def timed(fn, n):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return host / n, (time.perf_counter() - t0) / n


def graph_time(fn, n, reps=5):
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    g.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best / n


def report(name, variants, n):
    for label, fn in variants:
        for _ in range(10):
            fn()
        host, eager = timed(fn, n)
        graph = graph_time(fn, n)
        print(f"{name:<26} {label:<22} host {host * 1e6:7.1f} us   eager {eager * 1e6:7.1f} us   "
              f"graph {graph * 1e6:7.2f} us")


def main(n=200):
    dev = "cuda"
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  calls per measurement: {n}")
    # ---- mHC boundary, T tokens at hidden 5120
    T, H = 8, 5120
    x = torch.randn(T, H, device=dev).bfloat16()
    residual = torch.randn(T, 4, H, device=dev).bfloat16()
    pre, post = torch.rand(T, 4, device=dev), torch.rand(T, 4, 1, device=dev) * 2
    comb = torch.softmax(torch.randn(T, 4, 4, device=dev), dim=1)
    fn = torch.randn(24, 4 * H, device=dev) * 0.02
    weight = fusedstep.prepare_boundary_weight(fn)
    scale, base = torch.rand(3, device=dev) + 0.5, torch.randn(24, device=dev) * 0.1
    nw = torch.ones(H, device=dev).bfloat16()
    outs = (torch.empty_like(residual), torch.empty_like(post), torch.empty_like(comb),
            torch.empty_like(x), torch.empty_like(pre))
    scal = (1e-6, 1e-6, 2.0, 1e-6, 20)
    report(f"mhc_boundary T={T} H={H}", [
        ("fusedstep (out=)", lambda: fusedstep.mhc_shifted_post_pre_boundary(
            x, residual, pre, post, comb, weight, scale, base, *scal, nw, 1e-6, out=outs)),
        ("torch.ops (out)", lambda: torch.ops.fusedstep.mhc_boundary_out(
            x, residual, pre, post, comb, weight, scale, base, *scal, nw, 1e-6, 0, False, False,
            *outs)),
        ("_C binding", lambda: _C.mhc_boundary(
            x, residual, post, comb, pre, weight, scale, base, nw, outs[0], outs[3], outs[4],
            outs[1], outs[2], 0, 1e-6, 1e-6, 1e-6, 2.0, 1e-6, 20, _C.MODE_LAUNCH,
            torch.cuda.current_stream().cuda_stream, None, False)),
    ], n)
    # ---- KDA decode, B requests, 12 heads, q = 1
    B, heads = 8, 12
    dim = heads * 128
    slots_n = B + 1
    kx = torch.randn(B, 3 * dim, device=dev).bfloat16()
    f_a = torch.randn(B, 128, device=dev).bfloat16()
    raw_beta = torch.randn(B, heads, device=dev).bfloat16()
    gate = torch.randn(B, dim, device=dev).bfloat16()
    conv_w = torch.rand(3, 4, dim, device=dev) - 0.5
    f_b = (torch.randn(dim, 128, device=dev) / 128 ** 0.5).bfloat16()
    a_log = torch.zeros(heads, device=dev)
    dt_bias = torch.zeros(dim, device=dev)
    knw = torch.ones(128, device=dev)
    conv = torch.randn(slots_n, 3, 3 * dim, device=dev).bfloat16().transpose(1, 2)
    state = torch.randn(slots_n, heads, 128, 128, device=dev) * 0.1
    slots = torch.arange(1, B + 1, dtype=torch.int32, device=dev)
    out = torch.empty(B, dim, device=dev).bfloat16()
    report(f"kda_decode B={B} H={heads} q=1", [
        ("fusedstep (out=)", lambda: fusedstep.kda_decode(
            kx, raw_beta, gate, conv_w, a_log, dt_bias, knw, conv, state, slots, f_a=f_a,
            f_b_weight=f_b, out=out)),
        ("torch.ops", lambda: torch.ops.fusedstep.kda_decode(
            kx, f_a, None, raw_beta, gate, conv_w, None, f_b, a_log, dt_bias, knw, conv, state,
            slots, None, None, out, 1, -5.0, 128 ** -0.5, 1e-5, 0, [0, 0, -1, 0, 0], False,
            False)),
        ("_C binding", lambda: _C.kda_decode(
            kx, f_a, None, raw_beta, gate, conv_w, None, f_b, a_log, dt_bias, knw, conv, state,
            slots, None, None, out, None, None, None, 1, -5.0, 128 ** -0.5, 1e-5, 0, 0, 0, -1, 0,
            False, _C.MODE_LAUNCH, torch.cuda.current_stream().cuda_stream, None, False)),
    ], n)


if __name__ == "__main__":
    main()
