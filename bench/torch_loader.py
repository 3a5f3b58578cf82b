#!/usr/bin/python3
"""PyTorch peer of bench/loader.cpp: the same pipelines through torch.utils.data.DataLoader, with
the transforms written in torch ops (no torchvision): zero-pad 4, random 32x32 crop, horizontal
flip with p = 0.5, /255 then Normalize, per sample in the workers; and gpt-mini token windows
read from a np.memmap'd llm.c shard. With --device cuda: pin_memory=True and every field moved
with .to("cuda", non_blocking=True), the clock stopping after a final synchronize.
Prints one JSON line, like the C++ benchmark.
Usage: torch_loader.py --pipeline image|token [--workers N] [--seconds S] [--device cpu|cuda]"""
import argparse, json, os, tempfile, time

import numpy as np
import torch
import torch.nn.functional as F

IMAGES, TOKENS, CONTEXT = 10000, 1 << 21, 128
MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(3, 1, 1)
STD = torch.tensor([0.2470, 0.2435, 0.2616]).view(3, 1, 1)


class Images(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, 256, (IMAGES, 3, 32, 32), dtype=torch.uint8, generator=g)
        self.labels = (self.data[:, 0, 0, 0] % 10).long()

    def __len__(self):
        return IMAGES

    def __getitem__(self, i):
        padded = F.pad(self.data[i], (4, 4, 4, 4))
        top, left = torch.randint(0, 9, (2,)).tolist()
        crop = padded[:, top:top + 32, left:left + 32]
        if torch.rand(1).item() < 0.5:
            crop = crop.flip(-1)
        return (crop.float().div_(255) - MEAN) / STD, self.labels[i]


class Windows(torch.utils.data.Dataset):
    def __init__(self, path):
        self.tokens = np.memmap(path, dtype=np.uint16, mode="r", offset=1024)
        self.n = (len(self.tokens) - 1) // CONTEXT

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        w = torch.from_numpy(self.tokens[i * CONTEXT:(i + 1) * CONTEXT + 1].astype(np.int64))
        return w[:-1], w[1:]


def write_shard(path):
    tokens = np.random.default_rng(1).integers(0, 512, TOKENS, dtype=np.uint16)
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 1, TOKENS)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipeline", choices=["image", "token"], default="image")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    a = ap.parse_args()
    shard = None
    if a.pipeline == "image":
        ds, batch = Images(), 256
    else:
        shard = os.path.join(tempfile.gettempdir(), f"torch_loader_bench_{os.getpid()}.bin")
        write_shard(shard)
        ds, batch = Windows(shard), 16
    cuda = a.device == "cuda"
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=a.workers,
                                         persistent_workers=a.workers > 0, pin_memory=cuda)
    it = iter(loader)

    def next_rows():
        nonlocal it
        try:
            b = next(it)
        except StopIteration:
            it = iter(loader)
            b = next(it)
        if cuda:
            b = [t.to("cuda", non_blocking=True) for t in b]
        return len(b[0])

    for _ in range(3):  # warm-up: workers started
        next_rows()
    start, samples, elapsed = time.perf_counter(), 0, 0.0
    while elapsed < a.seconds:
        samples += next_rows()
        elapsed = time.perf_counter() - start
    if cuda:
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    if shard:
        os.remove(shard)
    print(json.dumps({"impl": "pytorch", "pipeline": a.pipeline, "device": a.device, "workers": a.workers,
                      "batch": batch,
                      "samples_per_s": round(samples / elapsed, 1)}))


if __name__ == "__main__":
    main()
