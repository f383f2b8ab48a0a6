# SPDX-License-Identifier: Apache-2.0
"""Test inputs (numpy, no torch) and the float64 numpy implementation of both operations.

Inputs come as contiguous numpy *buffers* plus a `views(buffers)` function that cuts
the op's views out of them (strided rows, transposed layouts) with slicing and
swapaxes only, so the same function makes the views of torch CUDA copies of the
buffers in the GPU tests. BF16 tensors are uint16 bit patterns here.
"""
import numpy as np

BF16_KEYS = {"x", "residual", "norm_weight_bf16", "f_a", "raw_gate", "raw_beta", "output_gate",
             "f_b_weight", "conv_weight_bf16", "conv_state_bf16", "record_key_gate", "state_bf16"}


def bf16_bits(values):
    f = np.ascontiguousarray(values, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (np.ascontiguousarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_round64(values):
    """float64 values rounded to BF16 in one rounding (nearest even, never through float32;
    BF16 subnormals kept, no overflow handling: test values stay far from it), as float64."""
    v = np.asarray(values, dtype=np.float64)
    _, e = np.frexp(v)                                   # |v| = m 2^e, m in [0.5, 1)
    quantum = np.maximum(e - 8, -133)
    return np.where(v == 0, v, np.ldexp(np.rint(np.ldexp(v, -quantum)), quantum))


# ---------------------------------------------------------------- mHC
def mhc_case(rng, tokens, hidden, *, x_pad=0, residual_pad=0, fn_std=0.02, iters=20):
    """DeepSeek-V4.1's realistic distributions: x, residual ~ N(0, 1) BF16, fn ~ N(0, fn_std),
    scale ~ U(0.5, 2), base ~ N(0, 0.1), post ~ U(0, 2), comb ~ a softmax-ish
    row-stochastic 4x4, pre ~ U(0, 1)."""
    T, H = tokens, hidden
    comb = rng.uniform(0.0, 1.0, (T, 4, 4)).astype(np.float32)
    comb /= comb.sum(axis=1, keepdims=True)
    bufs = {
        "x": bf16_bits(rng.standard_normal((T, H + x_pad))),
        "residual": bf16_bits(rng.standard_normal((T, 4 * H + residual_pad))),
        "pre_mix": rng.uniform(0.0, 1.0, (T, 4)).astype(np.float32),
        "post_mix": rng.uniform(0.0, 2.0, (T, 4, 1)).astype(np.float32),
        "comb_res_mix": comb.astype(np.float32),
        "fn": (rng.standard_normal((24, 4 * H)) * fn_std).astype(np.float32),
        "scale": rng.uniform(0.5, 2.0, 3).astype(np.float32),
        "base": (rng.standard_normal(24) * 0.1).astype(np.float32),
        "norm_weight": bf16_bits(rng.uniform(0.5, 1.5, H)),
    }
    scalars = dict(hc_norm_eps=1e-6, hc_pre_eps=1e-6, hc_post_scale=2.0, sinkhorn_eps=1e-6,
                   num_sinkhorn_iters=iters, norm_eps=1e-6)

    def views(b):
        return {
            "x": b["x"][:, :H],
            "residual": b["residual"][:, :4 * H].reshape(T, 4, H),
            **{k: b[k] for k in ("pre_mix", "post_mix", "comb_res_mix", "fn", "scale", "base",
                                 "norm_weight")},
        }
    return bufs, views, scalars


def round_weight(fn, rounding):
    """docs/numerics.md's weight rounding (TF32 RNA / RNE, or none), as float32."""
    u = np.ascontiguousarray(fn, dtype=np.float32).view(np.uint32).astype(np.uint64)
    mag = u & 0x7FFFFFFF
    if rounding == 0:
        r = (u + 0x1000) & ~np.uint64(0x1FFF)
    elif rounding == 1:
        r = (u + 0xFFF + ((u >> 13) & 1)) & ~np.uint64(0x1FFF)
    else:
        r = u
    r = np.where(mag < 0x0D800000, u & 0x80000000, r)  # below 2^-100: signed zero
    r = np.where(mag == 0x7F800000, u, r)
    r = np.where(mag > 0x7F800000, u | 0x00400000, r)
    return (r & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


def split_parts(rounded, parts):
    """The exact split of each rounded weight into BF16 parts (truncations of the rest)."""
    rest = rounded.astype(np.float32)
    out = []
    for _ in range(parts):
        bits = (rest.view(np.uint32) >> 16).astype(np.uint16)
        out.append(bits)
        rest = (rest - bf16_value(bits)).astype(np.float32)
    return out


def sinkhorn64(logits, iters, eps):
    c = np.exp(logits - logits.max(axis=-1, keepdims=True))
    c = c / c.sum(axis=-1, keepdims=True) + eps
    c = c / (c.sum(axis=-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(axis=-1, keepdims=True) + eps)
        c = c / (c.sum(axis=-2, keepdims=True) + eps)
    return c


def mhc_numpy64(v, s, rounding):
    """The float64 truth of docs/numerics.md's mHC boundary (numpy, vectorized)."""
    x = bf16_value(v["x"]).astype(np.float64)                      # [T, H]
    T, H = x.shape
    r = bf16_value(v["residual"]).astype(np.float64).reshape(T, 4, H)
    post = v["post_mix"].reshape(T, 4).astype(np.float64)
    comb = v["comb_res_mix"].astype(np.float64)                    # [t, j source, s dest]
    pre = v["pre_mix"].astype(np.float64)
    cur = post[:, :, None] * x[:, None, :] + np.einsum("tjs,tjh->tsh", comb, r)
    li = np.einsum("tj,tjh->th", pre, cur)
    rstd_li = 1.0 / np.sqrt((li * li).sum(axis=1) / H + s["norm_eps"])
    nw = bf16_value(v["norm_weight"]).astype(np.float64)
    layer_input = li * rstd_li[:, None] * nw[None, :]
    w = round_weight(v["fn"], rounding).astype(np.float64)         # [24, 4H]
    flat = cur.reshape(T, 4 * H)
    mix = flat @ w.T
    ssq = (flat * flat).sum(axis=1)
    rstd = 1.0 / np.sqrt(ssq / (4 * H) + s["hc_norm_eps"])
    scale = v["scale"].astype(np.float64)
    group = np.array([0] * 4 + [1] * 4 + [2] * 16)
    a = mix * rstd[:, None] * scale[group][None, :] + v["base"].astype(np.float64)[None, :]
    sig = 1.0 / (1.0 + np.exp(-a))
    return {
        "residual_out": cur, "layer_input": layer_input, "li": li, "mix": mix, "ssq": ssq,
        "pre": sig[:, :4] + s["hc_pre_eps"], "post": sig[:, 4:8] * s["hc_post_scale"],
        "comb": sinkhorn64(a[:, 8:].reshape(T, 4, 4), s["num_sinkhorn_iters"], s["sinkhorn_eps"]),
    }


# ---------------------------------------------------------------- KDA
def kda_case(rng, *, batch=5, heads=2, tokens=1, raw_gate=False, conv_bias=False,
             conv_weight_layout="channel", conv_weight_bf16=False, conv_state_layout="channel",
             conv_state_bf16=True, row_pad=8, extra_slots=3, padding=True, token_counts=False,
             records=False, deferred=False, extra_taps=0, state_bf16=False):
    """A KDA decode (tokens = 1) or verify step with padding requests of every kind.
    Distributions of tests/kda_decode/kda_test_util.h (a_log = log U(1, 16)). The state
    buffer holds one head more per slot than the view (a pitched slot stride), FP32 or,
    with state_bf16, BF16 bit patterns."""
    B, q, dim = batch, tokens, heads * 128
    rows, ch = B * q, 3 * dim
    taps = q + 2 + extra_taps
    per_request_slots = 1 if q == 1 else q
    slots_n = B * per_request_slots + 1 + extra_slots
    perm = rng.permutation(np.arange(1, slots_n)).astype(np.int32)
    bufs = {}
    bufs["x"] = bf16_bits(rng.standard_normal((rows, ch + row_pad)))
    if raw_gate:
        bufs["raw_gate"] = bf16_bits(rng.standard_normal((rows, dim + row_pad)) * 1.5)
    else:
        bufs["f_a"] = bf16_bits(rng.standard_normal((rows, 128 + row_pad)))
        bufs["f_b_weight"] = bf16_bits(rng.standard_normal((dim, 128)) / np.sqrt(128))
    bufs["raw_beta"] = bf16_bits(rng.standard_normal((rows, heads + 3)) * 1.5)
    bufs["output_gate"] = bf16_bits(rng.standard_normal((rows, dim + row_pad)) * 1.5)
    w = rng.uniform(-0.6, 0.6, (3, dim, 4))
    if conv_weight_bf16:
        w = bf16_value(bf16_bits(w)).astype(np.float64)
    if conv_weight_layout == "channel":
        wb = w.reshape(ch, 4)
    elif conv_weight_layout == "tap":
        wb = np.ascontiguousarray(w.reshape(ch, 4).T)            # [4, 3 dim]
    else:
        wb = np.ascontiguousarray(w.transpose(0, 2, 1))          # K3: [3, 4, dim]
    bufs["conv_weight"] = bf16_bits(wb) if conv_weight_bf16 else wb.astype(np.float32)
    if conv_bias:
        bufs["conv_bias"] = rng.uniform(-0.5, 0.5, ch).astype(np.float32)
    bufs["a_log"] = np.log(rng.uniform(1.0, 16.0, heads)).astype(np.float32)
    bufs["dt_bias"] = rng.standard_normal(dim).astype(np.float32)
    bufs["norm_weight"] = rng.uniform(0.5, 1.5, 128).astype(np.float32)
    cs = rng.standard_normal((slots_n, ch, taps))
    if conv_state_layout == "tap":
        cs = np.ascontiguousarray(cs.transpose(0, 2, 1))         # [slots, taps, 3 dim]
    bufs["conv_state"] = bf16_bits(cs) if conv_state_bf16 else cs.astype(np.float32)
    state = (rng.standard_normal((slots_n, heads + 1, 128, 128)) * 0.3).astype(np.float32)
    bufs["state"] = bf16_bits(state) if state_bf16 else state

    if q == 1:
        slots = perm[:B].copy()
        if padding and B >= 4:
            slots[1], slots[2], slots[3] = 0, -1, slots_n + 5   # padding of every kind
        bufs["slots"] = slots
    else:
        table = np.zeros((B, q + 1), dtype=np.int32)
        table[:, :q] = perm[:B * q].reshape(B, q)
        table[:, q] = -7                                          # past the q columns: unread
        acc = rng.integers(1, q + 1, B).astype(np.int32)
        if padding and B >= 4:
            acc[1] = 0                                            # accepted out of range
            table[2, :] = 0                                       # conv / read slot 0
            acc[3] = q + 1
        if not records and padding and B >= 5:
            table[4, rng.integers(0, q)] = 0                      # one skipped write
        bufs["slots"] = table
        bufs["accepted"] = acc
        if token_counts:
            bufs["token_counts"] = rng.integers(1, q + 1, B).astype(np.int32)
        if records:
            R = B + 2
            bufs["record_correction"] = np.full((R, heads, q, 128), np.nan, dtype=np.float32)
            bufs["record_key_gate"] = np.full((R, heads, q, 256), 0x7FC0, dtype=np.uint16)
            if deferred:
                rr = rng.permutation(R)[:B].astype(np.int32)
                rr[0] = R + 3                                     # out of range: padding
                bufs["record_rows"] = rr

    def views(b):
        v = {
            "x": b["x"][:, :ch],
            "raw_beta": b["raw_beta"][:, :heads],
            "output_gate": b["output_gate"][:, :dim],
            "a_log": b["a_log"], "dt_bias": b["dt_bias"], "norm_weight": b["norm_weight"],
            "state": b["state"][:, :heads],
            "slots": b["slots"],
        }
        if "raw_gate" in b:
            v["raw_gate"] = b["raw_gate"][:, :dim]
        else:
            v["f_a"] = b["f_a"][:, :128]
            v["f_b_weight"] = b["f_b_weight"]
        cw = b["conv_weight"]
        v["conv_weight"] = cw.swapaxes(0, 1) if conv_weight_layout == "tap" else cw
        cs_ = b["conv_state"]
        v["conv_state"] = cs_.swapaxes(1, 2) if conv_state_layout == "tap" else cs_
        for k in ("conv_bias", "accepted", "token_counts", "record_correction",
                  "record_key_gate", "record_rows"):
            if k in b:
                v[k] = b[k]
        return v

    return bufs, views, dict(tokens=q, lower_bound=-5.0, q_scale=128 ** -0.5, norm_eps=1e-5)


def _l2n(v, scale=1.0):
    return v / np.sqrt((v * v).sum() + 1e-6) * scale


def _sig(v):
    return 1.0 / (1.0 + np.exp(-v))


def _f64(a, bf16=False):
    return (bf16_value(a) if bf16 else a).astype(np.float64)


def kda_numpy64(v, s, *, conv_weight_bf16=False, conv_state_bf16=True, state_bf16=False):
    """The float64 truth of docs/numerics.md's KDA decode / verify step (numpy). The
    scalars are float32 in the params, so they are taken as float32 values here too.
    A BF16 state (state_bf16: bit patterns) is read exactly and each stored copy is rounded
    to BF16 once (the recurrence carries the unrounded state on)."""
    s = dict(s, **{k: float(np.float32(s[k])) for k in ("q_scale", "lower_bound", "norm_eps")})
    q = s["tokens"]
    a_log = v["a_log"].astype(np.float64)
    heads = a_log.shape[0]
    dim, ch = heads * 128, heads * 384
    slots = np.asarray(v["slots"])
    B = slots.shape[0]
    x = _f64(v["x"], True)
    raw_beta = _f64(v["raw_beta"], True)
    gate = _f64(v["output_gate"], True)
    cw = _f64(v["conv_weight"], conv_weight_bf16)
    cw = cw if cw.ndim == 2 else cw.transpose(0, 2, 1).reshape(ch, 4)   # -> [3 dim, 4]
    bias = v["conv_bias"].astype(np.float64) if "conv_bias" in v else np.zeros(ch)
    dt = v["dt_bias"].astype(np.float64)
    nw = v["norm_weight"].astype(np.float64)
    conv = _f64(v["conv_state"], conv_state_bf16).copy()               # [slots, ch, taps]
    state = _f64(v["state"], state_bf16).copy()
    S_slots, C_slots = state.shape[0], conv.shape[0]
    records = "record_correction" in v
    R = v["record_correction"].shape[0] if records else 0
    out = {"output": np.zeros((B * q, dim)), "raw_g": np.zeros((B * q, dim)),
           "conv_out": np.zeros((B * q, ch))}
    if records:
        out["record_correction"] = np.full((R, heads, q, 128), np.nan)
        out["record_key_gate"] = np.full((R, heads, q, 256), np.nan)
    for b in range(B):
        if q == 1:
            A, n = 1, 1
            read = conv_slot = int(slots[b])
            if not (0 < read < S_slots and read < C_slots):
                continue
        else:
            A = int(v["accepted"][b])
            n = int(v["token_counts"][b]) if "token_counts" in v else q
            if not (1 <= A <= q and 1 <= n <= q):
                continue
            read, conv_slot = int(slots[b, A - 1]), int(slots[b, 0])
            if not (0 < read < S_slots and 0 < conv_slot < C_slots):
                continue
        if records:
            row_r = int(v["record_rows"][b]) if "record_rows" in v else b
            if not 0 <= row_r < R:
                continue
        rows = [b * q + t for t in range(n)]
        window = np.concatenate([conv[conv_slot, :, A - 1:A + 2], x[rows, :].T], axis=1)  # [ch, 3 + n]
        qkv = np.zeros((n, ch))
        for t in range(n):
            acc = bias + (window[:, t:t + 4] * cw).sum(axis=1)
            qkv[t] = acc / (1.0 + np.exp(-acc))
        conv[conv_slot, :, :n + 2] = window[:, 1:n + 3]
        if "raw_gate" in v:
            raw_g = _f64(v["raw_gate"], True)[rows]
        else:
            raw_g = _f64(v["f_a"], True)[rows] @ _f64(v["f_b_weight"], True).T
        out["raw_g"][rows] = raw_g
        out["conv_out"][rows] = qkv
        for h in range(heads):
            S = state[read, h].copy()
            hs = slice(h * 128, (h + 1) * 128)
            for t in range(n):
                row = b * q + t
                qh, kh, vh = qkv[t, hs], qkv[t, dim + h * 128:dim + (h + 1) * 128], qkv[t, 2 * dim + h * 128:2 * dim + (h + 1) * 128]
                q_n, k_n = _l2n(qh, s["q_scale"]), _l2n(kh)
                decay = np.exp(s["lower_bound"] * _sig(np.exp(a_log[h]) * (raw_g[t, hs] + dt[hs])))
                beta = _sig(raw_beta[row, h])
                S = S * decay[None, :]
                v_new = (vh - S @ k_n) * beta
                S = S + np.outer(v_new, k_n)
                o = S @ q_n
                if records:
                    out["record_correction"][row_r, h, t] = v_new
                    out["record_key_gate"][row_r, h, t, :128] = kh
                    out["record_key_gate"][row_r, h, t, 128:] = raw_g[t, hs]
                else:
                    w_slot = read if q == 1 else int(slots[b, t])
                    if 0 < w_slot < S_slots:
                        state[w_slot, h] = bf16_round64(S) if state_bf16 else S
                rstd = 1.0 / np.sqrt((o * o).mean() + s["norm_eps"])
                out["output"][row, hs] = o * rstd * nw * _sig(gate[row, hs])
    out["state"] = state
    out["conv_state"] = conv
    return out


def kda_commit_numpy64(state, slots, accepted, correction, key_gate, a_log, dt_bias, tokens,
                       lower_bound, record_rows=None, state_bf16=False):
    """The float64 truth of the RecoverSSM commit; a BF16 checkpoint (state_bf16: bit
    patterns) read exactly and the folded state rounded to BF16 once."""
    state = _f64(state, state_bf16).copy()
    lower_bound = float(np.float32(lower_bound))
    heads = a_log.shape[0]
    R = correction.shape[0]
    for b in range(slots.shape[0]):
        slot = int(slots[b])
        if not 0 < slot < state.shape[0]:
            continue
        row = int(record_rows[b]) if record_rows is not None else b
        if not 0 <= row < R:
            continue
        n = min(max(int(accepted[b]), 0), tokens)
        for h in range(heads):
            S = state[slot, h]
            hs = slice(h * 128, (h + 1) * 128)
            for t in range(n):
                k_n = _l2n(key_gate[row, h, t, :128].astype(np.float64))
                g = key_gate[row, h, t, 128:].astype(np.float64)
                decay = np.exp(lower_bound * _sig(np.exp(float(a_log[h])) * (g + dt_bias[hs])))
                S = S * decay[None, :] + np.outer(correction[row, h, t].astype(np.float64), k_n)
            state[slot, h] = bf16_round64(S) if state_bf16 else S
    return state
