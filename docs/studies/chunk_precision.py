"""Operand-precision emulation of a chunked KDA prefill against the float64 token recurrence:
which operand precisions of the matrix products keep the state within 1e-5 (issue 27's
tensor-core kernel; results in kernels/NOTES.md, "Precision of a tensor-core chunk step").

    python docs/studies/chunk_precision.py --check           # float64 algebra = recurrence
    python docs/studies/chunk_precision.py --set main --out results.jsonl

One sequence, heads batched, state S [H, K, V] (K-first here; the reference is V-first).
Per chunk of C tokens (G = inclusive within-chunk cumsum of g):
  A_kk[i,j] = <k_i exp(G_i - G_j), k_j>  (i > j),   A_qk[i,j] = <q_i exp(G_i - G_j), k_j> (i >= j)
    computed in 16x16 sub-blocks: an off-diagonal block (rows in sub-block b starting at s_b,
    columns j < s_b) as (k_i e^{G_i - G_{s_b}}) . (k_j e^{G_{s_b} - G_j})  -- both factors <= 1;
    a diagonal sub-block relative to its middle token m = s_b + 8:
    (k_i e^{G_i - G_m}) . (k_j e^{G_m - G_j})  -- factors <= e^{5*8}, fine in fp32/bf16 range.
  T = (I + diag(beta) A_kk)^-1 (fp32 unit-lower triangular solve)
  W = T (beta k e^G); U = T (beta v); Vn = U - W S
  o = scale [ (q e^G) S + A_qk Vn ]
  S <- e^{G_last} * S + (k e^{G_last - G})^T Vn   (checkpoints inside a chunk: same with p-1)
Each matrix product is one `mm(name, a, b)`; its operand precision is set per product:
  f64 (exact reference algebra), fp32, bf16, tf32, bf16x3, tf32x3 (hi*hi + hi*lo + lo*hi).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

import torch

from kdabench.inputs import make_inputs
from kdabench.oracles.recurrent import recurrent_kda

PRODUCTS = ("Akk", "Aqk", "W", "U", "WS", "qS", "AqkV", "upd")
STATE_PRODUCTS = ("WS", "qS", "upd")
SUB = 16


def r_bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


def r_tf32(x):
    """Round fp32 to 10 explicit mantissa bits, round-to-nearest-even."""
    x = x.to(torch.float32).contiguous()
    b = x.view(torch.int32)
    lsb = (b >> 13) & 1
    b = (b + 0xFFF + lsb) & ~0x1FFF
    return b.view(torch.float32)


ROUND = {"bf16": r_bf16, "tf32": r_tf32}


def mm(mode, a, b):
    if mode == "f64":
        return a.double() @ b.double()
    a, b = a.float(), b.float()
    if mode == "fp32":
        return a @ b
    if mode in ROUND:
        r = ROUND[mode]
        return r(a) @ r(b)
    if mode in ("bf16x3", "tf32x3"):
        r = ROUND[mode[:4]]
        ah, bh = r(a), r(b)
        al, bl = r(a - ah), r(b - bh)
        return (ah @ bl + al @ bh) + ah @ bh
    raise ValueError(mode)


def tri_products(mode, rows, k, G, inclusive):
    """[H, C, C] lower(-triangular) <rows_i e^{G_i - G_j}, k_j> by 16-sub-blocks (see module doc)."""
    H, C, _K = k.shape
    out = torch.zeros(H, C, C, dtype=k.dtype)
    for s in range(0, C, SUB):
        e = s + SUB
        # diagonal sub-block, reference = middle token
        m = s + SUB // 2
        gm = G[:, m : m + 1]
        a = rows[:, s:e] * torch.exp(G[:, s:e] - gm).to(k.dtype)
        bb = k[:, s:e] * torch.exp(gm - G[:, s:e]).to(k.dtype)
        blk = mm(mode, a, bb.transpose(-1, -2)).to(k.dtype)
        out[:, s:e, s:e] = blk.tril(0 if inclusive else -1)
        if s > 0:  # off-diagonal: columns j < s, reference = s
            gs = G[:, s : s + 1]
            a = rows[:, s:e] * torch.exp(G[:, s:e] - gs).to(k.dtype)
            bb = k[:, :s] * torch.exp(gs - G[:, :s]).to(k.dtype)
            out[:, s:e, :s] = mm(mode, a, bb.transpose(-1, -2)).to(k.dtype)
    return out


def rev_excl(g):
    """R_j = sum_{i>j} g_i along dim 1, as a reverse cumsum (no difference of large sums)."""
    shifted = torch.cat([g[:, 1:], torch.zeros_like(g[:, :1])], 1)
    return shifted.flip(1).cumsum(1).flip(1)


def chunked(q, k, v, g, beta, S0, scale, C, prec, checkpoints=()):
    """q,k,g [H,T,K]; v [H,T,V]; beta [H,T]; S0 [H,K,V]. prec: dict product -> mode.
    Everything f64 iff all modes are f64, else fp32 elementwise. Returns o, S, {p: S_p}."""
    prec = dict(prec)
    gmode = prec.pop("_g", "fp32")  # fp32 cumsum | f64 (G and exponents in f64) | rev
    dt = torch.float64 if all(m == "f64" for m in prec.values()) else torch.float32
    q, k, v, g, beta, S = (t.to(dt) for t in (q, k, v, g, beta, S0))
    H, T, _K = q.shape
    o = torch.empty(H, T, v.shape[-1], dtype=dt)
    cps = {}
    eye = torch.eye(C, dtype=dt)
    for c0 in range(0, T, C):
        sl = slice(c0, c0 + C)
        qc, kc, vc, gc, bc = q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl]
        G = gc.double().cumsum(1) if gmode == "f64" else gc.cumsum(1)
        Akk = tri_products(prec["Akk"], kc, kc, G, inclusive=False)
        Aqk = tri_products(prec["Aqk"], qc, kc, G, inclusive=True)
        L = eye + bc[..., None] * Akk
        Tm = torch.linalg.solve_triangular(L, eye.expand_as(L), upper=False, unitriangular=True)
        kg = kc * torch.exp(G).to(dt)
        W = mm(prec["W"], Tm, bc[..., None] * kg).to(dt)
        U = mm(prec["U"], Tm, bc[..., None] * vc).to(dt)
        Vn = U - mm(prec["WS"], W, S).to(dt)
        qg = qc * torch.exp(G).to(dt)
        o[:, sl] = scale * (mm(prec["qS"], qg, S).to(dt) + mm(prec["AqkV"], Aqk, Vn).to(dt))
        for p in checkpoints:
            if c0 < p < c0 + C:
                j = p - c0 - 1
                if gmode == "rev":
                    dec = torch.exp(rev_excl(gc[:, : j + 1]))
                else:
                    dec = torch.exp(G[:, j : j + 1] - G[:, : j + 1]).to(dt)
                kd = kc[:, : j + 1] * dec
                cps[p] = torch.exp(G[:, j]).to(dt)[..., None] * S + mm(
                    prec["upd"], kd.transpose(-1, -2), Vn[:, : j + 1]).to(dt)
        gl = G[:, -1:]
        dec = torch.exp(rev_excl(gc)) if gmode == "rev" else torch.exp(gl - G).to(dt)
        kd = kc * dec
        S = torch.exp(gl).to(dt).transpose(-1, -2) * S + mm(prec["upd"], kd.transpose(-1, -2), Vn).to(dt)
        if c0 + C in checkpoints:
            cps[c0 + C] = S.clone()
    return o, S, cps


def get_inputs(T, H, seed, regime):
    x = make_inputs([T], H, 128, seed=seed)
    g = x.g
    if regime == "fast-decay":  # kdabench.bench.gates FAST_DECAY draw
        z = torch.randn((T, H, 128), generator=torch.Generator().manual_seed(seed))
        g = -5.0 * torch.sigmoid(z)
    return x.q, x.k, x.v, g, x.beta, x.initial_state


_REF = {}


def reference(T, H, seed, regime, cps):
    key = (T, H, seed, regime)
    if key not in _REF:
        q, k, v, g, beta, s0 = get_inputs(T, H, seed, regime)
        r = recurrent_kda(q, k, v, g, beta, initial_state=s0, prefix_lengths=[list(cps)])
        _REF[key] = (r.o.transpose(0, 1),  # [H,T,V]
                     r.final_state[0].transpose(-1, -2),  # [H,K,V]
                     {p: r.prefix_states[0][i].transpose(-1, -2) for i, p in enumerate(cps)})
    return _REF[key]


def rel(x, ref):  # per-head relative Frobenius, worst head
    x, ref = x.double(), ref.double()
    d = (x - ref).flatten(1).norm(dim=1) / ref.flatten(1).norm(dim=1)
    return d.max().item()


def run_case(T, H, seed, regime, C, prec):
    cps = (T // 5, 3 * T // 5 + 3)
    q, k, v, g, beta, s0 = get_inputs(T, H, seed, regime)
    tr = lambda t: t.transpose(0, 1)
    o, S, cp = chunked(tr(q), tr(k), tr(v), tr(g), tr(beta), s0[0].transpose(-1, -2),
                       128 ** -0.5, C, prec, cps)
    ro, rS, rcp = reference(T, H, seed, regime, cps)
    return {"o": rel(o, ro), "o_bf16out": rel(o.to(torch.bfloat16), ro), "S": rel(S, rS), **{f"cp{p}": rel(cp[p], rcp[p]) for p in cps},
            "o_maxabs_over_rms": ((o.double() - ro).abs().amax() / ro.pow(2).mean().sqrt()).item()}


def variants():
    def all_(m):
        return {p: m for p in PRODUCTS}

    v = {
        "a_bf16": all_("bf16"),
        "b_tf32": all_("tf32"),
        "c_bf16+bf16x3state": {p: ("bf16x3" if p in STATE_PRODUCTS else "bf16") for p in PRODUCTS},
        "d_bf16+3xtf32state": {p: ("tf32x3" if p in STATE_PRODUCTS else "bf16") for p in PRODUCTS},
        "e_fp32": all_("fp32"),
    }
    return v


def extras():
    STATE_PATH = ("Akk", "W", "U", "WS", "upd")  # everything the state depends on
    def mix(state_mode, out_mode="bf16"):
        return {p: (state_mode if p in STATE_PATH else out_mode) for p in PRODUCTS}
    v = {
        "f_all_3xtf32": {p: "tf32x3" for p in PRODUCTS},
        "g_all_bf16x3": {p: "bf16x3" for p in PRODUCTS},
        "h_statepath_3xtf32_out_bf16": mix("tf32x3"),
        "i_statepath_bf16x3_out_bf16": mix("bf16x3"),
        "j_statepath_fp32_out_bf16": mix("fp32"),
        "h2_statepath_3xtf32_out_tf32": mix("tf32x3", "tf32"),
        "e_fp32_gf64": {**{p: "fp32" for p in PRODUCTS}, "_g": "f64"},
        "e_fp32_grev": {**{p: "fp32" for p in PRODUCTS}, "_g": "rev"},
        "h_statepath_3xtf32_out_bf16_grev": {**mix("tf32x3"), "_g": "rev"},
        "i_statepath_bf16x3_out_bf16_grev": {**mix("bf16x3"), "_g": "rev"},
    }
    return v


def ablations():
    v = {}
    for p in PRODUCTS:
        d = {x: "bf16" for x in PRODUCTS}
        d[p] = "fp32"
        v[f"a_but_{p}_fp32"] = d
    for p in PRODUCTS:
        d = {x: "fp32" for x in PRODUCTS}
        d[p] = "bf16"
        v[f"e_but_{p}_bf16"] = d
    return v


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--set", default="main", choices=["main", "ablate", "extra"])
    ap.add_argument("--T", type=int, nargs="+", default=[1024, 2048])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--C", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--H", type=int, default=2)
    ap.add_argument("--out", default="chunk-precision.jsonl")
    a = ap.parse_args()
    torch.set_num_threads(2)
    if a.check:
        f64 = {p: "f64" for p in PRODUCTS}
        for T, C, reg in itertools.product([256, 1024], [16, 64], ["long-memory", "fast-decay"]):
            print("f64 check", T, C, reg, run_case(T, a.H, 0, reg, C, f64), flush=True)
        sys.exit()
    vs = {"main": variants, "ablate": ablations, "extra": extras}[a.set]()
    with open(a.out, "a") as f:
        for T, seed, reg, C in itertools.product(a.T, a.seeds, ["long-memory", "fast-decay"], a.C):
            for name, prec in vs.items():
                t0 = time.time()
                res = run_case(T, a.H, seed, reg, C, prec)
                rec = {"variant": name, "T": T, "seed": seed, "regime": reg, "C": C, **res}
                f.write(json.dumps(rec) + "\n")
                f.flush()
                print(rec, f"{time.time()-t0:.1f}s", flush=True)
