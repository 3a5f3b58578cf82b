#!/usr/bin/env python3
"""Writes tests/data/fp8_reference.json: PyTorch's float8_e4m3fn and float8_e5m2 (torch >= 2.1;
Debian 12's torch 1.13 has neither, Debian 13's 2.6 in scripts/torch26-chroot.sh's root does) as
the independent reference of the engine's FP8 conversions (backend/fp8_math.h):

- "decode": the f32 bit pattern of every one of the 256 codes of each format;
- "encode": f32 inputs (bit patterns) and the code PyTorch's cast gives each after clamping to
  the format's largest finite value (the saturating cast Transformer Engine and cuBLASLt's
  __NV_SATFINITE do; PyTorch's plain cast makes NaN of E4M3 overflows and inf of E5M2's). The
  inputs: every code's value, every midpoint between neighbouring values (ties: to even), values
  a hair either side of each midpoint, random values over 24 binades, subnormals, signed zeros,
  values beyond the range and infinities.

Run: sudo chroot /var/tmp/fasttrain-torch26 python3 - < tests/data/gen_fp8_reference.py > tests/data/fp8_reference.json
"""
import json
import struct

import torch

FORMATS = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}


def bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def main():
    out = {"torch": torch.__version__, "decode": {}, "encode": {}}
    g = torch.Generator().manual_seed(0)
    for name, (dtype, fmax) in FORMATS.items():
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
        values = codes.view(dtype).float()
        out["decode"][name] = [bits(v) for v in values.tolist()]
        finite = sorted({v for v in values.tolist() if v == v and abs(v) != float("inf") and v >= 0})
        xs = list(finite)
        for lo, hi in zip(finite, finite[1:]):
            mid = (lo + hi) / 2
            xs += [mid, torch.tensor(mid).nextafter(torch.tensor(hi)).item(),
                   torch.tensor(mid).nextafter(torch.tensor(lo)).item()]
        xs += (torch.randn(2000, generator=g) * torch.pow(2.0, torch.randint(-20, 4, (2000,), generator=g).float()) *
               (fmax / 64)).tolist()
        xs += [fmax * 1.03, fmax * 1.5, fmax * 4, 3.0e38, float("inf"), 1e-30, 1e-45]
        xs = [v for x in xs for v in (x, -x)]
        t = torch.tensor(xs, dtype=torch.float32)
        got = t.clamp(-fmax, fmax).to(dtype).view(torch.uint8)
        out["encode"][name] = [[bits(x), c] for x, c in zip(t.tolist(), got.tolist())]
    print(json.dumps(out))


main()
