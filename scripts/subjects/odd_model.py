"""Writes a small memra-model file (docs/subject-protocol.md, section 4.1) whose shapes reach the
corners of docs/DESIGN.md §3.4 ("Every operation") that the presets do not:

- hidden 384: BF16 K-blocks of 48 columns (not a multiple of dot32's 32 lanes: lanes 16–31 hold
  one element, lanes 0–15 two), a model-row sum of squares over 384 values (256 lanes, half of
  them with a second element), expert gate/up with G = 1 over 3 scale blocks;
- expert width 384 (down: G = 1, one K-block of 3 scale blocks) and shared width 1280 (down:
  G = 2, each K-block a fold of 5 scale blocks; gmax = 2 with a routed slot of 1 block);
- 16 query heads over 8 KV heads (grouped-query attention), top-3 of 8 experts, no SwiGLU limit,
  no route normalisation, route scale 1.5, RoPE θ 50000, eps 1e-5; vocab 264.

Only numpy and the standard library. The weights are a pure function of the seed (numpy's
PCG64); nothing depends on their values but the oracle run on the same file.

    python3 scripts/subjects/odd_model.py OUT.safetensors [SEED]
"""

import json
import struct
import sys

import numpy as np

CONFIG = {"preset": "odd", "hidden": 384, "layers": 2, "q_heads": 16, "kv_heads": 8, "head_dim": 128,
          "experts": 8, "top_k": 3, "expert_width": 384, "shared_width": 1280, "vocab": 264,
          "eps": 1e-5, "rope_theta": 50000.0, "swiglu_limit": None, "route_scale": 1.5,
          "route_norm": False, "max_positions": 64}


def bf16(values):
    """f32 → BF16 bits, round to nearest even (finite inputs)."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


def e4m3_values():
    """The value of every non-NaN E4M3 code (0x00–0x7E) and the codes, positive half."""
    vals = []
    for code in range(0x7F):
        e, m = code >> 3, code & 7
        vals.append(m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(vals)


POS = e4m3_values()


def e4m3(w):
    """A block-scaled E4M3 matrix of the f32 matrix w: (codes, scales), scale = max|w| / 448 per
    128×128 block, codes the nearest representable magnitude (any rounding will do)."""
    out, inn = w.shape
    scales = np.zeros(((out + 127) // 128, (inn + 127) // 128), dtype=np.float32)
    codes = np.zeros(w.shape, dtype=np.uint8)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            s = np.float32(max(float(np.abs(blk).max()) / 448.0, 1e-30))
            q = np.abs(blk) / s
            idx = np.clip(np.searchsorted(POS, q), 1, len(POS) - 1)
            near = np.where(q - POS[idx - 1] <= POS[idx] - q, idx - 1, idx)
            codes[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = near | np.where(blk < 0, 0x80, 0)
            scales[i, j] = s
    return codes, scales


def main():
    path = sys.argv[1]
    rng = np.random.default_rng(int(sys.argv[2]) if len(sys.argv) > 2 else 7)
    c = CONFIG
    h, qw, kvw = c["hidden"], c["q_heads"] * 128, c["kv_heads"] * 128
    t = {}

    def mat(name, out, inn, std=None):
        w = rng.standard_normal((out, inn)) * (std if std is not None else inn ** -0.5)
        t[name] = ("BF16", [out, inn], bf16(w).tobytes())

    def vec(name, n, base, spread):
        t[name] = ("F32", [n], (base + spread * rng.uniform(-1, 1, n)).astype("<f4").tobytes())

    def expert(prefix, width):
        for name, out, inn in (("gate", width, h), ("up", width, h), ("down", h, width)):
            codes, scales = e4m3(rng.standard_normal((out, inn)) * inn ** -0.5)
            t[prefix + name + ".weight"] = ("F8_E4M3", [out, inn], codes.tobytes())
            t[prefix + name + ".weight_scale"] = ("F32", list(scales.shape), scales.astype("<f4").tobytes())

    mat("embed.weight", c["vocab"], h, 1.0)
    for i in range(c["layers"]):
        p = "layers.%d." % i
        vec(p + "attn_norm.weight", h, 1.0, 0.1)
        vec(p + "ffn_norm.weight", h, 1.0, 0.1)
        mat(p + "attn.q.weight", qw, h)
        mat(p + "attn.k.weight", kvw, h)
        mat(p + "attn.v.weight", kvw, h)
        mat(p + "attn.gate.weight", c["q_heads"], h)
        vec(p + "attn.q_norm.weight", 128, 1.0, 0.1)
        vec(p + "attn.k_norm.weight", 128, 1.0, 0.1)
        mat(p + "attn.o.weight", h, qw)
        mat(p + "router.weight", c["experts"], h)
        vec(p + "router.bias", c["experts"], 0.0, 0.01)
        for e in range(c["experts"]):
            expert(p + "experts.%d." % e, c["expert_width"])
        expert(p + "shared.", c["shared_width"])
    vec("final_norm.weight", h, 1.0, 0.1)
    mat("lm_head.weight", c["vocab"], h)

    header = {"__metadata__": {"memra.format": "memra-model", "memra.format_version": "1",
                               "memra.config": json.dumps(c)}}
    offset = 0
    for name in sorted(t):
        dtype, shape, raw = t[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in sorted(t):
            f.write(t[name][2])


if __name__ == "__main__":
    main()
