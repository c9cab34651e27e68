#!/usr/bin/env python3
"""PyTorch anchor for `memra-gates bench`: one Step-like MoE decode layer, batch 1, timed with
CUDA events in the same session as the memra-gates run.

The layer matches the canonical program's shapes and data flow: RMSNorm, Q/K/V/gate projections
(BF16), per-head q/k RMSNorm + NeoX RoPE, attention over `ctx` cached positions with a per-head
sigmoid gate, O projection, residual + RMSNorm, sigmoid top-k router, top-k routed SwiGLU experts
plus the shared expert, weighted combine, residual.

Two forms of the layer are timed:
- eager (`layer_eager`): the route ids go to the host once per layer and the experts are plain
  views of the expert banks (what an eager PyTorch layer does);
- whole-layer CUDA-graph replay (`layer_graph`): the route stays on the device, so the selected
  experts' weights are gathered on the device (`index_select` of the k experts, then batched
  GEMVs) and the whole layer is captured once and replayed — the form memra-gates' whole-step
  graph is compared with. The gather copies the k experts' weights once per layer (read + write
  of their bytes): that is the price of device-side routing in plain PyTorch.
The attention half alone is also graphed (`attention_graph`), and the MoE half timed eagerly.

Expert weights are BF16 here: PyTorch has no batch-1 FP8 GEMV, so this anchor reads 2x the expert
bytes that the E4M3 kernels read.

Output: one JSON object on stdout.
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--q-heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--experts", type=int, default=288)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--ctx", type=int, default=32)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    a = p.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    bf = torch.bfloat16
    H, QH, KVH, D = a.hidden, a.q_heads, a.kv_heads, a.head_dim
    s = H ** -0.5
    wq = (torch.randn(QH * D, H, device=dev) * s).to(bf)
    wk = (torch.randn(KVH * D, H, device=dev) * s).to(bf)
    wv = (torch.randn(KVH * D, H, device=dev) * s).to(bf)
    wg = (torch.randn(QH, H, device=dev) * s).to(bf)
    wo = (torch.randn(H, QH * D, device=dev) * (QH * D) ** -0.5).to(bf)
    wr = (torch.randn(a.experts, H, device=dev) * s).to(bf)
    bias = torch.zeros(a.experts, device=dev)
    eg = (torch.randn(a.experts, a.width, H, device=dev, dtype=bf) * s)
    eu = (torch.randn(a.experts, a.width, H, device=dev, dtype=bf) * s)
    ed = (torch.randn(a.experts, H, a.width, device=dev, dtype=bf) * a.width ** -0.5)
    sg, su, sd = eg[0].clone(), eu[0].clone(), ed[0].clone()
    n1 = torch.ones(H, device=dev)
    n2 = torch.ones(H, device=dev)
    qn = torch.ones(D, device=dev)
    kn = torch.ones(D, device=dev)
    kc = torch.randn(KVH, a.ctx, D, device=dev)
    vc = torch.randn(KVH, a.ctx, D, device=dev)
    ang = torch.arange(D // 2, device=dev, dtype=torch.float32)
    cos = torch.cos(ang)
    sin = torch.sin(ang)
    x = torch.randn(H, device=dev)
    eps = 1e-6

    def attention_half(x):
        h = rmsnorm(x, n1, eps).to(bf)
        q = F.linear(h, wq).float().view(QH, D)
        k = F.linear(h, wk).float().view(KVH, D)
        v = F.linear(h, wv).float().view(KVH, D)
        g = F.linear(h, wg).float()
        q = rope(rmsnorm(q, qn, eps), cos, sin)
        k = rope(rmsnorm(k, kn, eps), cos, sin)
        kk = torch.cat([kc, k.unsqueeze(1)], dim=1)
        vv = torch.cat([vc, v.unsqueeze(1)], dim=1)
        rep = QH // KVH
        kk = kk.repeat_interleave(rep, 0)
        vv = vv.repeat_interleave(rep, 0)
        o = F.scaled_dot_product_attention(q.unsqueeze(1), kk, vv).squeeze(1)
        o = o * torch.sigmoid(g).unsqueeze(-1)
        att = F.linear(o.reshape(-1).to(bf), wo).float()
        hres = x + att
        return hres, rmsnorm(hres, n2, eps)

    def moe_half(hres, xin):
        xb = xin.to(bf)
        logits = F.linear(xb, wr).float()
        score = torch.sigmoid(logits)
        w, ids = torch.topk(score + bias, a.top_k)
        w = score[ids]
        w = w / w.sum()
        ids_h = ids.tolist()  # one host sync per layer, as in memra-gates
        acc = torch.zeros(H, device=dev)
        for j, e in enumerate(ids_h):
            gt = F.linear(xb, eg[e]).float()
            up = F.linear(xb, eu[e]).float()
            act = (F.silu(gt) * up).to(bf)
            acc = acc + w[j] * F.linear(act, ed[e]).float()
        gt = F.linear(xb, sg).float()
        up = F.linear(xb, su).float()
        shared = F.linear((F.silu(gt) * up).to(bf), sd).float()
        return hres + (acc + shared)

    def layer(x):
        hres, xin = attention_half(x)
        return moe_half(hres, xin)

    def moe_half_device(hres, xin):
        # Routing on the device (no host sync): gather the k experts, batched GEMVs.
        xb = xin.to(bf)
        logits = F.linear(xb, wr).float()
        score = torch.sigmoid(logits)
        _, ids = torch.topk(score + bias, a.top_k)
        w = score[ids]
        w = w / w.sum()
        xk = xb.view(1, H, 1).expand(a.top_k, H, 1)
        gt = torch.bmm(eg.index_select(0, ids), xk).float().squeeze(-1)
        up = torch.bmm(eu.index_select(0, ids), xk).float().squeeze(-1)
        act = (F.silu(gt) * up).to(bf).unsqueeze(-1)
        y = torch.bmm(ed.index_select(0, ids), act).float().squeeze(-1)
        acc = (w.unsqueeze(-1) * y).sum(0)
        gt = F.linear(xb, sg).float()
        up = F.linear(xb, su).float()
        shared = F.linear((F.silu(gt) * up).to(bf), sd).float()
        return hres + (acc + shared)

    def layer_device(x):
        hres, xin = attention_half(x)
        return moe_half_device(hres, xin)

    def graphed(fn, arg):
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn(arg)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            fn(arg)
        return g

    def time_it(fn, n):
        times = []
        for _ in range(n):
            s0 = torch.cuda.Event(enable_timing=True)
            s1 = torch.cuda.Event(enable_timing=True)
            s0.record()
            fn()
            s1.record()
            torch.cuda.synchronize()
            times.append(s0.elapsed_time(s1) * 1000.0)
        return times

    for _ in range(a.warmup):
        layer(x)
    torch.cuda.synchronize()
    eager = time_it(lambda: layer(x), a.iters)
    attn_eager = time_it(lambda: attention_half(x), a.iters)
    # CUDA-graph replays (no host sync inside them): the attention half, and the whole layer with
    # device-side routing.
    static_x = x.clone()
    attn_graph = time_it(graphed(attention_half, static_x).replay, a.iters)
    layer_graph = time_it(graphed(layer_device, static_x).replay, a.iters)
    moe_eager = time_it(lambda: moe_half(x, x), a.iters)

    def summary(t):
        t = sorted(t)
        return {"median_us": statistics.median(t), "min_us": t[0], "p90_us": t[int(0.9 * (len(t) - 1))], "n": len(t)}

    print(json.dumps({
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "layer_eager": summary(eager),
        "layer_graph": summary(layer_graph),
        "attention_eager": summary(attn_eager),
        "attention_graph": summary(attn_graph),
        "moe_eager": summary(moe_eager),
        "expert_dtype": "bf16",
    }))


if __name__ == "__main__":
    main()
