#!/usr/bin/env python3
"""An independent safetensors reader/writer for interop tests (Debian's PyTorch 1.13 has no
safetensors package): the format implemented from its specification with struct + json + numpy.

  safetensors_torch.py read FILE OUT.json   reads FILE (verifying any "crc32c.<name>" checksums
                                            with a bitwise CRC-32C written here) and dumps
                                            {name: {dtype, shape, values}} plus the metadata
  safetensors_torch.py write FILE OUT.json  writes random torch tensors of every dtype to FILE
                                            the way the reference writer does (no checksums) and
                                            dumps the same JSON, for the C++ side to compare
Exits with status 77 when torch is not installed.
"""
import json
import struct
import sys

import numpy as np

try:
    import torch
except ImportError:
    sys.exit(77)  # the C++ test reports a skip

# safetensors dtype -> (numpy dtype used for the bytes, torch dtype)
DTYPES = {
    "F32": (np.float32, torch.float32), "F64": (np.float64, torch.float64),
    "F16": (np.float16, torch.float16), "BF16": (np.int16, torch.bfloat16),
    "I32": (np.int32, torch.int32), "I64": (np.int64, torch.int64),
    "U8": (np.uint8, torch.uint8), "BOOL": (np.bool_, torch.bool),
}
TORCH_TO_ST = {t: name for name, (_, t) in DTYPES.items()}


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def to_torch(raw, dtype, shape):
    np_dtype, t_dtype = DTYPES[dtype]
    t = torch.from_numpy(np.frombuffer(raw, dtype=np_dtype).copy())
    if t_dtype == torch.bfloat16:
        t = t.view(torch.bfloat16)  # same bits, reinterpreted
    return t.reshape(shape)


def to_bytes(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def dump(tensors, metadata, out):
    doc = {"tensors": {n: {"dtype": TORCH_TO_ST[t.dtype], "shape": list(t.shape),
                           "values": t.double().flatten().tolist()} for n, t in tensors.items()},
           "metadata": metadata}
    with open(out, "w") as f:
        json.dump(doc, f)


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        raw = data[b:e]
        crc = metadata.get("crc32c." + name)
        if crc is not None and int(crc, 16) != crc32c(raw):
            raise SystemExit(f"{path}: checksum mismatch for {name}")
        tensors[name] = to_torch(raw, info["dtype"], info["shape"])
    return tensors, metadata


def write(path, tensors, metadata):
    header, chunks, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        raw = to_bytes(t)
        header[name] = {"dtype": TORCH_TO_ST[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def sample_tensors():
    g = torch.Generator().manual_seed(1234)
    return {  # deliberately not in name order: the file order is the data order
        "z.f32": torch.randn(3, 5, generator=g),
        "a.f64": torch.randn(4, generator=g, dtype=torch.float64),
        "m.bf16": torch.randn(2, 3, 3, generator=g).to(torch.bfloat16),
        "h.f16": torch.randn(7, generator=g).to(torch.float16),
        "i32": torch.randint(-1000, 1000, (2, 2), generator=g, dtype=torch.int32),
        "i64": torch.randint(-2**40, 2**40, (3,), generator=g, dtype=torch.int64),
        "u8": torch.randint(0, 256, (5,), generator=g, dtype=torch.uint8),
        "mask": torch.randint(0, 2, (2, 3), generator=g).bool(),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
    }


def main():
    cmd, path, out = sys.argv[1:4]
    if cmd == "read":
        dump(*read(path), out)
    elif cmd == "write":
        tensors = sample_tensors()
        write(path, tensors, {"format": "pt", "source": "torch"})
        dump(tensors, {"format": "pt", "source": "torch"}, out)
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
