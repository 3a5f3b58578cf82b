"""Reference cases for the models (tests/test_models.cpp).

The PyTorch models are torch_bench.py's definitions (imported from the copy under bench/, since
tests must not depend on a file outside the checkout), plus the ResNets that torch_bench.py does
not define, written in the same style. Two kinds of case:

- nn_structure_<model>: the model's state-dict names and shapes, in order, and its parameter
  count (tied weights once), as params; nothing to compute.
- nn_<model>: the PyTorch model's own initial weights (and BatchNorm buffers) are the inputs,
  named as the C++ model names them; the outputs are the cross-entropy loss (out0, backpropagated
  with a random upstream gradient) and the logits (out1). The weights' gradients are compared.
"""
import importlib.util
import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.stateless import functional_call

from parity_lib import case, randn, rng


# ---------------------------------------------------------------- torch_bench.py's models
# Imported from the project's copy of the shared peer (bench/torch_bench.py, kept identical to
# shared/peer/torch_bench.py), so the reference models are the benchmark's own code.
_peer_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "torch_bench.py")
_spec = importlib.util.spec_from_file_location("torch_bench", _peer_path)
_peer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_peer)
Block, GPT, conv_bn_relu, cnn_mini, Bottleneck, resnet50 = (
    _peer.Block, _peer.GPT, _peer.conv_bn_relu, _peer.cnn_mini, _peer.Bottleneck, _peer.resnet50)


def mlp_bench():
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


# ---------------------------------------------------------------- ResNets in the same style

class BasicBlock(nn.Module):
    def __init__(self, i, o, stride):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(i, o, 3, stride, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True),
            nn.Conv2d(o, o, 3, 1, 1, bias=False), nn.BatchNorm2d(o))
        self.short = (nn.Sequential(nn.Conv2d(i, o, 1, stride, bias=False), nn.BatchNorm2d(o))
                      if stride != 1 or i != o else nn.Identity())

    def forward(self, x):
        return F.relu(self.body(x) + self.short(x))


def resnet18(classes=1000):
    """torchvision's resnet18 (same parameter count, 11,689,512) in torch_bench's layout."""
    layers, i = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                 nn.MaxPool2d(3, 2, 1)], 64
    for o, s in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for k in range(2):
            layers.append(BasicBlock(i, o, s if k == 0 else 1))
            i = o
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(i, classes)]
    return nn.Sequential(*layers)


def resnet_cifar(n, classes=10):
    """He et al. 2016 section 4.2: 3x3 stem, 3 stages of n basic blocks (16/32/64), projection shortcuts."""
    layers, i = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True)], 16
    for o, s in ((16, 1), (32, 2), (64, 2)):
        for k in range(n):
            layers.append(BasicBlock(i, o, s if k == 0 else 1))
            i = o
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(i, classes)]
    return nn.Sequential(*layers)


# ---------------------------------------------------------------- naming

def hf_name(name):
    """torch_bench GPT's parameter names -> Hugging Face GPT-2's (the C++ model's)."""
    for a, b in (("blocks.", "transformer.h."), (".ln1.", ".ln_1."), (".ln2.", ".ln_2."), (".qkv.", ".attn.c_attn."),
                 (".proj.", ".attn.c_proj."), (".fc.", ".mlp.c_fc."), (".fc2.", ".mlp.c_proj.")):
        name = name.replace(a, b)
    for a, b in (("wte.", "transformer.wte."), ("wpe.", "transformer.wpe."), ("lnf.", "transformer.ln_f."),
                 ("head.", "lm_head.")):
        if name.startswith(a):
            name = b + name[len(a):]
    return name


def structure_case(name, model, rename=lambda n: n):
    sd = model.state_dict()
    params = {"names": [rename(k) for k in sd], "shapes": [list(v.shape) for v in sd.values()],
              "params": sum(p.numel() for p in model.parameters())}
    return case("nn_structure_" + name, lambda: torch.zeros(1), {}, params=params, grad=False)


def model_case(name, model, x, y, rename=lambda n: n, lm=False, atol=None, rtol=None):
    """Inputs: the model's state (tied tensors once, under the first name), x, y."""
    model.train()
    torch_names = {}  # C++ name -> torch names sharing that tensor
    seen = {}
    inputs = {}
    for k, v in model.state_dict(keep_vars=True).items():
        if id(v) in seen:
            torch_names[seen[id(v)]].append(k)
            continue
        seen[id(v)] = rename(k)
        torch_names[rename(k)] = [k]
        inputs[rename(k)] = v.detach().numpy().copy()
    inputs["x"], inputs["y"] = x, y
    buffers = {n for n, _ in model.named_buffers()}
    nograd = [rename(n) for n in buffers]

    def fn(x, y, **state):
        tensors = {t: state[c] for c, ts in torch_names.items() for t in ts}
        logits = functional_call(model, tensors, (x,))
        flat = logits.reshape(-1, logits.shape[-1]) if lm else logits
        loss = F.cross_entropy(flat, y.reshape(-1))
        return loss, logits.detach()

    return case("nn_" + name, fn, inputs, nograd=nograd, atol=atol, rtol=rtol)


def cases():
    torch.manual_seed(0)
    yield structure_case("mlp", mlp_bench())
    yield structure_case("cnn_mini", cnn_mini())
    yield structure_case("gpt_mini", GPT(512, 128, 4, 256, 4), hf_name)
    yield structure_case("resnet50", resnet50())
    yield structure_case("resnet18", resnet18())
    yield structure_case("resnet20", resnet_cifar(3))
    yield structure_case("resnet56", resnet_cifar(9))

    n = "nn_mlp"
    yield model_case("mlp", nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10)),
                     randn(n, 8, 20), rng(n).integers(0, 10, (8,)))
    n = "nn_cnn_mini"
    yield model_case("cnn_mini", cnn_mini(), randn(n, 4, 3, 16, 16), rng(n).integers(0, 10, (4,)))
    n = "nn_resnet20"
    yield model_case("resnet20", resnet_cifar(3), randn(n, 2, 3, 16, 16), rng(n).integers(0, 10, (2,)))
    # gpt: vocab 64 (already a multiple of 64: no padding), T = 12 < context 16
    n = "nn_gpt_tiny"
    ids = rng(n).integers(0, 64, (2, 12))
    yield model_case("gpt_tiny", GPT(64, 16, 2, 32, 4), ids, rng(n + "y").integers(0, 64, (2, 12)), hf_name, lm=True)
    # Vocabularies that are not multiples of 64, in an unpadded PyTorch model: the C++ model pads
    # its embedding (300 -> 320, GPT-2's 50257 -> 50304) and must give the same loss, logits and
    # gradients (test_models.cpp, Models.PaddedGptMatchesUnpaddedPyTorch).
    for vocab, ctx, layers, dim, heads, T in ((300, 16, 2, 32, 4, 12), (50257, 8, 1, 16, 2, 8)):
        n = f"nn_gpt_vocab{vocab}"
        ids = rng(n).integers(0, vocab, (2, T))
        # Targets include the last real class, where an off-by-one at the padding boundary shows.
        y = rng(n + "y").integers(0, vocab, (2, T))
        y[0, 0] = vocab - 1
        yield model_case(f"gpt_vocab{vocab}", GPT(vocab, ctx, layers, dim, heads), ids, y, hf_name, lm=True)
