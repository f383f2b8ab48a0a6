# SPDX-License-Identifier: Apache-2.0
"""A small synthetic multi-layer decode loop on the GPU, checked against the CPU reference.

Two toy models, wired as docs/integration.md describes:

- DeepSeek-V4.1 style: `layers` decoder layers, each with an attention and an FFN
  sublayer (here a random bf16 linear map) and one fused mHC boundary per seam
  (`fusedstep.mhc_shifted_post_pre_boundary`): the seam consumes the sublayer output
  and the carried (residual, post, comb, pre) and produces the next sublayer's input
  (collapsed with the *previous* site's pre) and the carried state of the next seam.
- Kimi K3 style: `layers` KDA layers over a batch of requests with state slots
  (slot 0 is the null slot; a slot <= 0 is padding), `steps` decode steps with the
  caches updated in place, then one speculative verify of 3 tokens with RecoverSSM
  records and the commit of each request's accepted tokens.

Every call is checked against `fusedstep.reference` (float64) on the same inputs, with
docs/numerics.md's lines. Run: python examples/decode_loop.py   (needs torch and an
sm_90 GPU; `pip install .` or PYTHONPATH=<build>/python).
"""
import argparse

import numpy as np
import torch

import fusedstep
from fusedstep import reference


def _np(t):
    return t.detach().float().cpu().double().numpy()


class Checker:
    def __init__(self, quiet):
        self.quiet, self.checked, self.failed, self.worst = quiet, 0, 0, {}

    def check(self, name, ok, err):
        self.checked += 1
        self.failed += 0 if ok else 1
        key = name.split("[")[0]
        self.worst[key] = max(self.worst.get(key, 0.0), float(err))
        if not ok or not self.quiet:
            print(f"{'ok  ' if ok else 'FAIL'} {name}: {err:.3g}")

    def close(self, name, got, want, atol, rtol):
        err = np.max(np.abs(got - want) / (atol + rtol * np.abs(want)), initial=0.0)
        self.check(name, err <= 1.0, err)


def deepseek_loop(c, layers, tokens=4, hidden=1024, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    eps = dict(hc_norm_eps=1e-6, hc_pre_eps=1e-6, hc_post_scale=2.0, sinkhorn_eps=1e-6,
               num_sinkhorn_iters=20, norm_eps=1e-6)
    sites = []
    for _ in range(layers):
        for _site in ("attn", "ffn"):
            fn = torch.randn(24, 4 * hidden, device=dev, generator=g) * 0.02
            sites.append(dict(
                fn=fn, weight=fusedstep.prepare_boundary_weight(fn, "tf32_rna"),  # once, at load
                scale=torch.rand(3, device=dev, generator=g) * 1.5 + 0.5,
                base=torch.randn(24, device=dev, generator=g) * 0.1,
                norm_weight=(torch.rand(hidden, device=dev, generator=g) + 0.5).bfloat16(),
                sublayer=(torch.randn(hidden, hidden, device=dev, generator=g) / hidden ** 0.5).bfloat16()))
    # the carried state entering the first seam
    residual = torch.randn(tokens, 4, hidden, device=dev, generator=g).bfloat16()
    post = torch.rand(tokens, 4, 1, device=dev, generator=g) * 2
    comb = torch.softmax(torch.randn(tokens, 4, 4, device=dev, generator=g), dim=1)
    pre = torch.rand(tokens, 4, device=dev, generator=g)
    layer_input = torch.randn(tokens, hidden, device=dev, generator=g).bfloat16()
    for i, p in enumerate(sites):
        x = layer_input @ p["sublayer"]                                # the sublayer F_k
        new_residual, new_post, new_comb, layer_input, new_pre = fusedstep.mhc_shifted_post_pre_boundary(
            x, residual, pre, post, comb, p["weight"], p["scale"], p["base"], eps["hc_norm_eps"],
            eps["hc_pre_eps"], eps["hc_post_scale"], eps["sinkhorn_eps"],
            eps["num_sinkhorn_iters"], p["norm_weight"], eps["norm_eps"])
        r = reference.mhc_boundary(x, residual, pre, post, comb, p["fn"], p["scale"], p["base"],
                                   eps["hc_norm_eps"], eps["hc_pre_eps"], eps["hc_post_scale"],
                                   eps["sinkhorn_eps"], eps["num_sinkhorn_iters"],
                                   p["norm_weight"], eps["norm_eps"])
        name = f"mhc seam {i} ({'attn' if i % 2 == 0 else 'ffn'} of layer {i // 2})"
        c.close(name + " residual", _np(new_residual), r["residual_out"], 1e-5, 2 ** -8)
        c.close(name + " layer_input", _np(layer_input), r["layer_input"], 3e-2, 2 ** -7)
        c.close(name + " pre", _np(new_pre), r["pre"], 1.5e-2, 0)
        c.close(name + " post", _np(new_post).reshape(tokens, 4), r["post"], 3e-2, 0)
        c.close(name + " comb", _np(new_comb), r["comb"], 1.5e-2, 0)
        residual, post, comb, pre = new_residual, new_post, new_comb, new_pre


def kda_check(c, name, out, heads, r, state, conv_state):
    o, d = _np(out).reshape(-1, heads, 128), r["output"].reshape(-1, heads, 128)
    rms = np.sqrt((d * d).mean(axis=2))
    err = np.max(np.abs(o - d).max(axis=2) / (0.15 * np.maximum(rms, 0.1)))
    c.check(name + " output", err <= 1.0, err)
    s, ds = _np(state), r["state"]
    err = np.max(np.abs(s - ds).max(axis=(2, 3)) / (5e-2 * np.abs(ds).max(axis=(2, 3)) + 1e-30))
    c.check(name + " state", err <= 1.0, err)
    err = np.max(np.abs(_np(conv_state) - r["conv_state"]))
    c.check(name + " conv_state (exact)", err == 0, err)


def kimi_loop(c, layers, steps, batch=4, heads=4, seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev, dim, q_spec = "cuda", heads * 128, 3
    slots_n = 1 + batch * q_spec + 2                 # slot 0: the null slot
    bf = torch.bfloat16
    L = []
    for _ in range(layers):
        # vLLM's conv state layout [slot, tap, channel], seen as [slot, channel, tap];
        # q_spec + 2 taps serve both the decode (3) and the verify (5)
        conv = torch.randn(slots_n, q_spec + 2, 3 * dim, device=dev, generator=g).to(bf)
        L.append(dict(
            conv_weight=torch.rand(3, 4, dim, device=dev, generator=g) * 1.2 - 0.6,  # K3 [3, 4, dim]
            f_b_weight=(torch.randn(dim, 128, device=dev, generator=g) / 128 ** 0.5).to(bf),
            a_log=torch.log(torch.rand(heads, device=dev, generator=g) * 15 + 1),
            dt_bias=torch.randn(dim, device=dev, generator=g),
            norm_weight=torch.rand(128, device=dev, generator=g) + 0.5,
            conv_state=conv.transpose(1, 2),
            state=torch.randn(slots_n, heads, 128, 128, device=dev, generator=g) * 0.3))
    slots = torch.tensor([1, 2, 0, 3], dtype=torch.int32, device=dev)  # request 2 is padding

    def activations(rows):
        return dict(x=torch.randn(rows, 3 * dim, device=dev, generator=g).to(bf),
                    f_a=torch.randn(rows, 128, device=dev, generator=g).to(bf),
                    raw_beta=(torch.randn(rows, heads, device=dev, generator=g) * 1.5).to(bf),
                    output_gate=(torch.randn(rows, dim, device=dev, generator=g) * 1.5).to(bf))

    for step in range(steps):
        for i, p in enumerate(L):
            a = activations(batch)
            before = (p["state"].clone(), p["conv_state"].clone())
            out = fusedstep.kda_decode(a["x"], a["raw_beta"], a["output_gate"], p["conv_weight"],
                                       p["a_log"], p["dt_bias"], p["norm_weight"], p["conv_state"],
                                       p["state"], slots, f_a=a["f_a"], f_b_weight=p["f_b_weight"])
            r = reference.kda_decode(a["x"], a["raw_beta"], a["output_gate"], p["conv_weight"],
                                     p["a_log"], p["dt_bias"], p["norm_weight"], before[1],
                                     before[0], slots, f_a=a["f_a"], f_b_weight=p["f_b_weight"])
            kda_check(c, f"kda decode step {step} layer {i}", out, heads, r, p["state"],
                      p["conv_state"])

    # speculative verify of q_spec tokens with RecoverSSM records, then the commit
    table = torch.tensor([[1, 5, 6], [2, 7, 8], [0, 0, 0], [3, 9, 10]], dtype=torch.int32, device=dev)
    read_from = torch.ones(batch, dtype=torch.int32, device=dev)     # the checkpoint slots[b, 0]
    accepted = torch.tensor([3, 1, 2, 2], dtype=torch.int32, device=dev)  # sampled afterwards
    for i, p in enumerate(L):
        a = activations(batch * q_spec)
        rc = torch.full((batch, heads, q_spec, 128), float("nan"), device=dev)
        kg = torch.full((batch, heads, q_spec, 256), float("nan"), device=dev).to(bf)
        before = (p["state"].clone(), p["conv_state"].clone())
        out = fusedstep.kda_decode(a["x"], a["raw_beta"], a["output_gate"], p["conv_weight"],
                                   p["a_log"], p["dt_bias"], p["norm_weight"], p["conv_state"],
                                   p["state"], table, f_a=a["f_a"], f_b_weight=p["f_b_weight"],
                                   accepted=read_from, record_correction=rc, record_key_gate=kg,
                                   tokens=q_spec)
        r = reference.kda_decode(a["x"], a["raw_beta"], a["output_gate"], p["conv_weight"],
                                 p["a_log"], p["dt_bias"], p["norm_weight"], before[1], before[0],
                                 table, f_a=a["f_a"], f_b_weight=p["f_b_weight"],
                                 accepted=read_from, record_slots=batch, tokens=q_spec)
        kda_check(c, f"kda verify layer {i}", out, heads, r, p["state"], p["conv_state"])
        checkpoint = p["state"].clone()
        fusedstep.kda_commit(p["state"], table[:, 0].contiguous(), accepted, rc, kg, p["a_log"],
                             p["dt_bias"])
        want = reference.kda_commit(checkpoint, table[:, 0].contiguous(), accepted, rc, kg,
                                    p["a_log"], p["dt_bias"], tokens=q_spec)
        got = _np(p["state"])
        ok = np.isfinite(want)
        err = np.max(np.abs(np.where(ok, got - want, 0)) /
                     (1e-4 * np.abs(np.where(ok, want, 0)).max() + 1e-30))
        c.check(f"kda commit layer {i}", err <= 1.0 and ok.all(), err)


def main(layers=2, steps=3, quiet=False):
    c = Checker(quiet)
    deepseek_loop(c, layers)
    kimi_loop(c, layers, steps)
    torch.cuda.synchronize()
    summary = dict(checked=c.checked, failed=c.failed,
                   worst={k: round(v, 4) for k, v in c.worst.items()})
    print(f"decode_loop: {c.checked} checks, {c.failed} failed; worst error / bound: {summary['worst']}")
    return summary


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    raise SystemExit(1 if main(args.layers, args.steps, args.quiet)["failed"] else 0)
