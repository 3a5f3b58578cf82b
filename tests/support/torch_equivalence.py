#!/usr/bin/env python3
"""PyTorch side of the training-equivalence test (tests/test_equivalence.cpp).

  torch_equivalence.py WORKLOAD STATE.safetensors BATCH.safetensors STEPS OUT.json

Builds WORKLOAD's model exactly as the benchmark peer does (bench/torch_bench.py), loads the
initial weights fasttrain wrote (its names mapped to the peer's), trains STEPS steps on the batch
("inputs", "targets") with the peer's step (zero grads to none, forward, f32 cross-entropy,
backward, AdamW lr 3e-4 wd 0.1 on every parameter) in fp32, and writes {"losses": [...]}.
Exits with status 77 when torch is not installed (the C++ test reports a skip).
"""
import importlib.util
import json
import os
import re
import sys

try:
    import torch
except ImportError:
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_torch  # noqa: E402  (tests/support: the format from its specification)


def load_peer():
    spec = importlib.util.spec_from_file_location("torch_bench", os.path.join(HERE, "..", "..", "bench", "torch_bench.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# fasttrain's GPT follows Hugging Face's GPT-2 names; the peer's GPT has its own short ones.
# (Both store Linear weights as [out, in].) cnn-mini is a torch.nn.Sequential on both sides.
GPT_NAMES = [
    (r"^transformer\.wte\.", "wte."),
    (r"^transformer\.wpe\.", "wpe."),
    (r"^transformer\.h\.(\d+)\.ln_1\.", r"blocks.\1.ln1."),
    (r"^transformer\.h\.(\d+)\.attn\.c_attn\.", r"blocks.\1.qkv."),
    (r"^transformer\.h\.(\d+)\.attn\.c_proj\.", r"blocks.\1.proj."),
    (r"^transformer\.h\.(\d+)\.ln_2\.", r"blocks.\1.ln2."),
    (r"^transformer\.h\.(\d+)\.mlp\.c_fc\.", r"blocks.\1.fc."),
    (r"^transformer\.h\.(\d+)\.mlp\.c_proj\.", r"blocks.\1.fc2."),
    (r"^transformer\.ln_f\.", "lnf."),
    (r"^lm_head\.", "head."),
]


def peer_name(workload, name):
    if workload != "gpt-mini":
        return name
    for pattern, repl in GPT_NAMES:
        mapped, n = re.subn(pattern, repl, name)
        if n:
            return mapped
    raise SystemExit(f"torch_equivalence: no peer name for fasttrain parameter '{name}'")


def main():
    workload, state_path, batch_path, steps, out = sys.argv[1:6]
    torch.manual_seed(0)
    torch.set_num_threads(1)  # as the C++ side
    make_model, _, lossf, *_ = load_peer().workloads()[workload]
    model = make_model()
    # Checksums skipped: test_safetensors covers them, and this file is megabytes.
    state, _ = safetensors_torch.read(state_path, verify=False)
    model.load_state_dict({peer_name(workload, k): v for k, v in state.items()}, strict=True)
    batch, _ = safetensors_torch.read(batch_path)
    x, y = batch["inputs"], batch["targets"]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    losses = []
    for _ in range(int(steps)):
        opt.zero_grad(set_to_none=True)
        loss = lossf(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    with open(out, "w") as f:
        json.dump({"losses": losses}, f)


if __name__ == "__main__":
    main()
