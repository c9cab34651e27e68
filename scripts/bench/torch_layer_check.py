#!/usr/bin/env python3
"""What the PyTorch anchor (`torch_layer.py`) must compute, checked on the CPU at a small shape
(tests/cli/torch_anchor.rs runs it where PyTorch is installed):

- columns: a T-column pass equals T single-token steps of the same session, each step's key and
  value appended to the cache before the next (the verify pass is causal within the pass);
- distinct: with `--distinct D` a pass reads exactly D distinct routed experts, k distinct per token;
- forms: `grouped_mm` (sorted by expert, one grouped GEMM per projection) and `host_loop` compute
  the layer of `index_einsum`, the reference form (with the router's own routes and with D fixed).

`--plant NAME` plants the defect each check exists to catch, and the check must then fail:
`causal` (each column also sees the next one), `distinct` (D − 1 experts instead of D),
`groups` (the grouped GEMM's expert offsets shifted by one expert). Exit status 0: every check
passed; 1: a check failed (stderr names it).
"""
import argparse
import sys

import torch

import torch_layer as tl

SMALL = ["--device", "cpu", "--hidden", "256", "--q-heads", "4", "--kv-heads", "2", "--head-dim", "64"]
SMALL += ["--experts", "16", "--top-k", "4", "--width", "128", "--ctx", "8"]
# Relative difference (max |Δ| ÷ max |ref|) under which two computations of one thing agree: the
# forms only reorder f32 sums. A planted defect moves the layer by 10⁻¹.
SAME = 1e-4
# The same for a column against its single-token step: the projections are BF16 GEMMs, and the
# CPU's picks its blocking by the row count, so a token alone and in a pass of 4 may round its
# BF16 output differently (≈ 4·10⁻³ of an element; measured 7·10⁻⁴ of the layer's largest).
SAME_COLUMN = 1e-2
CACHE = ["kc", "vc"]
WEIGHTS = ["wq", "wk", "wv", "wg", "wo", "wr", "bias", "eg", "eu", "ed", "sg", "su", "sd", "n1", "n2", "qn", "kn"]


def layer(extra):
    torch.manual_seed(0)
    a = tl.parse(SMALL + extra)
    return a, tl.Layer(a, torch.device("cpu"))


def rel(x, ref):
    return float((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def check_columns(plant):
    for T in (2, 4):
        a, cols = layer(["--columns", str(T)])
        if plant == "causal":
            cols.mask = torch.ones_like(cols.mask).tril(a.ctx + 1)
        _, step = layer([])
        for name in WEIGHTS + CACHE + ["cos", "sin"]:
            setattr(step, name, getattr(cols, name).clone())
        x = torch.randn(T, a.hidden)
        pass_out, _ = cols.attention_half(x)
        for t in range(T):
            out, _ = step.attention_half(x[t : t + 1])
            if rel(out, pass_out[t : t + 1]) > SAME_COLUMN:
                return f"columns: T={T}, column {t} differs from the single-token step at its position by {rel(out, pass_out[t : t + 1]):.3g}"
            _, k, v, _ = step.qkvg(x[t : t + 1])
            step.kc = torch.cat([step.kc, k.unsqueeze(2)], dim=2)
            step.vc = torch.cat([step.vc, v.unsqueeze(2)], dim=2)
    return None


def check_distinct(plant):
    for extra, d in ((["--columns", "8"], 5), (["--batch", "3"], 12), (["--batch", "8"], 16)):
        _, L = layer(extra + ["--distinct", str(d)])
        if plant == "distinct":
            L.fixed_ids = L.fixed_ids.remainder(d - 1)
        ids, _ = L.route(torch.randn(L.fixed_ids.shape[0], L.a.hidden).to(torch.bfloat16))
        got = ids.unique().numel()
        rows_ok = all(r.unique().numel() == L.a.top_k for r in ids)
        if got != d or not rows_ok:
            return f"distinct: {extra} --distinct {d} read {got} distinct experts (k distinct per token: {rows_ok})"
    return None


def check_forms(plant):
    for extra in (["--batch", "3"], ["--columns", "4"], ["--batch", "4", "--distinct", "6"]):
        a, L = layer(extra)
        if plant == "groups":
            grouped = L.grouped

            def shifted(ids, grouped=grouped):  # expert e's rows go to expert e + 1
                order, rows, offs = grouped(ids)
                moved = torch.cat([torch.zeros(1, dtype=offs.dtype), offs[:-1]])
                moved[-1] = offs[-1]
                return order, rows, moved

            L.grouped = shifted
        x = torch.randn(a.batch * a.columns, a.hidden)
        ref = L.layer("index_einsum", x)
        for form in ("grouped_mm", "host_loop", "gather_bmm"):
            d = rel(L.layer(form, x), ref)
            if d > SAME:
                return f"forms: {form} {extra} differs from index_einsum by {d:.3g}"
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plant", choices=["causal", "distinct", "groups"])
    plant = p.parse_args().plant
    failed = [f for f in (check_columns(plant), check_distinct(plant), check_forms(plant)) if f]
    for f in failed:
        print(f"torch_layer_check: FAIL: {f}", file=sys.stderr)
    if failed:
        sys.exit(1)
    print("torch_layer_check: 3 checks passed (columns, distinct, forms)")


if __name__ == "__main__":
    main()
