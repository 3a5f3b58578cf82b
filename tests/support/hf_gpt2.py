#!/usr/bin/env python3
"""Hugging Face GPT-2 weight files for the interop tests (tests/test_gpt_fidelity.cpp).

Debian's python3-torch has no `transformers`, so the model is written out here in HF's form:
GPT2LMHeadModel(transformer=GPT2Model(wte, wpe, drop, h=[GPT2Block(ln_1, attn=GPT2Attention(c_attn,
c_proj), ln_2, mlp=GPT2MLP(c_fc, c_proj))], ln_f), lm_head tied to wte), with HF's Conv1D layers
(weight [in, out], y = x @ W + b), tanh-GELU ("gelu_new"), LayerNorm eps 1e-5 and the causal-mask
buffers `attn.bias` / `attn.masked_bias`. Its state-dict names and layouts are HF's exactly.

  hf_gpt2.py write DIR VOCAB CONTEXT LAYERS DIM HEADS
      Draws a random model (every parameter, LayerNorms and biases included, so a transposed or
      misplaced tensor changes the output) and writes, in DIR:
        hf_model.safetensors   GPT2Model's file as on the Hub (gpt2/model.safetensors): no
                               "transformer." prefix, mask buffers included
        hf_lmhead.safetensors  GPT2LMHeadModel.save_pretrained's: prefixed, no lm_head.weight
                               (tied), no buffers (non-persistent in current transformers)
        reference.safetensors  ids, targets [2, T], the logits [2, T, VOCAB] and the loss
  hf_gpt2.py check FILE IDS OUT HEADS
      Loads FILE (a GPT-2 file another program wrote in HF's layout) the way GPT2LMHeadModel does
      (metadata format "pt", every name and shape strict; lm_head.weight may be absent as it is
      tied; mask buffers ignored), runs it on the "ids" of the safetensors file IDS and writes {"logits"} to OUT.
Exits with status 77 when torch is not installed.
"""
import math
import os
import re
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    sys.exit(77)  # the C++ test reports a skip

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_folder_torch  # noqa: E402  (save_pretrained's and from_pretrained's files, beside this file)
import safetensors_torch  # noqa: E402  (the project's format reader/writer, beside this file)


class Conv1D(nn.Module):
    """HF's Conv1D(nf, nx): a linear layer whose weight is stored [nx (in), nf (out)]."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.size(-1)), self.weight).view(*x.shape[:-1], self.nf)


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, dim, heads, context):
        super().__init__()
        self.heads = heads
        self.c_attn = Conv1D(3 * dim, dim)
        self.c_proj = Conv1D(dim, dim)
        # Older transformers saved both buffers; files on the Hub still hold them.
        mask = torch.tril(torch.ones(context, context, dtype=torch.bool)).view(1, 1, context, context)
        self.register_buffer("bias", mask, persistent=False)
        self.register_buffer("masked_bias", torch.tensor(-1e4), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        w = q @ k.transpose(-1, -2) / math.sqrt(C // self.heads)
        w = torch.where(self.bias[:, :, :T, :T], w, torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype))
        y = (F.softmax(w, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        return self.c_proj(y)


class GPT2MLP(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.c_fc = Conv1D(4 * dim, dim)
        self.c_proj = Conv1D(dim, 4 * dim)

    def forward(self, x):
        return self.c_proj(gelu_new(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, dim, heads, context):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = GPT2Attention(dim, heads, context)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = GPT2MLP(dim)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, vocab, context, layers, dim, heads):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(context, dim)
        self.drop = nn.Dropout(0.0)
        self.h = nn.ModuleList([GPT2Block(dim, heads, context) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, ids):
        x = self.drop(self.wte(ids) + self.wpe(torch.arange(ids.size(1))))
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    def __init__(self, vocab, context, layers, dim, heads):
        super().__init__()
        self.transformer = GPT2Model(vocab, context, layers, dim, heads)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied

    def forward(self, ids):
        return self.lm_head(self.transformer(ids))


def draw(vocab, context, layers, dim, heads):
    """A random model: every parameter drawn, LayerNorm weights near one."""
    torch.manual_seed(1234)
    model = GPT2LMHeadModel(vocab, context, layers, dim, heads)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.05 * torch.randn_like(p))
    return model


def reference_ids(vocab, T):
    g = torch.Generator().manual_seed(99)
    ids = torch.randint(0, vocab, (2, T), generator=g)
    targets = torch.randint(0, vocab, (2, T), generator=g)
    ids[0, 0], targets[1, -1] = vocab - 1, vocab - 1  # the last real class
    return ids, targets


def write(out_dir, vocab, context, layers, dim, heads):
    model = draw(vocab, context, layers, dim, heads)
    # GPT2Model's own file: unprefixed names and, as older releases saved, the mask buffers.
    plain = {k: v for k, v in model.transformer.state_dict().items()}
    for i, block in enumerate(model.transformer.h):
        plain[f"h.{i}.attn.bias"] = block.attn.bias
        plain[f"h.{i}.attn.masked_bias"] = block.attn.masked_bias
    safetensors_torch.write(os.path.join(out_dir, "hf_model.safetensors"), plain, {"format": "pt"})
    # GPT2LMHeadModel.save_pretrained: tied lm_head.weight left out.
    lmhead = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    safetensors_torch.write(os.path.join(out_dir, "hf_lmhead.safetensors"), lmhead, {"format": "pt"})

    ids, targets = reference_ids(vocab, context)
    with torch.no_grad():
        logits = model(ids)
        loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    safetensors_torch.write(os.path.join(out_dir, "reference.safetensors"),
                            {"ids": ids, "targets": targets, "logits": logits, "loss": loss}, {})


def check(path, ids_path, out, heads):
    tensors, metadata = safetensors_torch.read(path)
    if metadata.get("format") != "pt":  # transformers refuses such files
        raise SystemExit(f"{path}: metadata format is {metadata.get('format')!r}, transformers needs 'pt'")
    prefix = "transformer." if any(k.startswith("transformer.") for k in tensors) else ""
    vocab, dim = tensors[prefix + "wte.weight"].shape
    context = tensors[prefix + "wpe.weight"].shape[0]
    layers = len({m.group(1) for k in tensors if (m := re.match(re.escape(prefix) + r"h\.(\d+)\.", k))})
    model = GPT2LMHeadModel(vocab, context, layers, dim, heads)
    # HF ignores the mask buffers of older files, as GPT2LMHeadModel's _keys_to_ignore_on_load_unexpected.
    state = {("" if prefix else "transformer.") + k: v for k, v in tensors.items()
             if not re.search(r"\.attn\.(masked_)?bias$", k)}
    missing, unexpected = model.load_state_dict(state, strict=False)  # shapes are checked regardless
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise SystemExit(f"{path}: missing {missing}, unexpected {unexpected}")
    ids = safetensors_torch.read(ids_path, verify=False)[0]["ids"]
    with torch.no_grad():
        logits = model(ids)
    safetensors_torch.write(out, {"logits": logits}, {})


def folder(out_dir, vocab, context, layers, dim, heads, max_bytes):
    model = draw(vocab, context, layers, dim, heads)
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": vocab, "n_positions": context,
              "n_ctx": context, "n_layer": layers, "n_embd": dim, "n_head": heads, "n_inner": None,
              "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.1, "embd_pdrop": 0.1,
              "attn_pdrop": 0.1, "initializer_range": 0.02, "scale_attn_weights": True, "use_cache": True,
              "bos_token_id": vocab - 1, "eos_token_id": vocab - 1, "torch_dtype": "float32"}
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    hf_folder_torch.write_folder(os.path.join(out_dir, "hf"), config, state, max_bytes)
    ids, _ = reference_ids(vocab, context)
    with torch.no_grad():
        logits = model(ids)
    safetensors_torch.write(os.path.join(out_dir, "reference.safetensors"), {"ids": ids, "logits": logits}, {})


def run(folder_path, ids_path, out, max_bytes):
    c, state = hf_folder_torch.read_folder(folder_path)
    if c["model_type"] != "gpt2" or c.get("activation_function", "gelu_new") != "gelu_new":
        raise SystemExit(f"not a model this script has: {c['model_type']}, {c.get('activation_function')}")
    model = GPT2LMHeadModel(c["vocab_size"], c.get("n_positions", c.get("n_ctx")), c["n_layer"], c["n_embd"],
                            c["n_head"])
    expected = [k for k in model.state_dict() if k != "lm_head.weight"]
    if set(state) != set(expected):
        raise SystemExit(f"{folder_path}: missing {sorted(set(expected) - set(state))}, "
                         f"unexpected {sorted(set(state) - set(expected))}")
    if max_bytes is not None:
        hf_folder_torch.check_layout(folder_path, {k: state[k] for k in expected}, max_bytes)
    model.load_state_dict(state, strict=False)  # shapes checked; lm_head is wte
    ids = safetensors_torch.read(ids_path, verify=False)[0]["ids"]
    with torch.no_grad():
        logits = model(ids)
    safetensors_torch.write(out, {"logits": logits}, {})


def main():
    cmd = sys.argv[1]
    if cmd == "write":
        write(sys.argv[2], *(int(a) for a in sys.argv[3:8]))
    elif cmd == "check":
        check(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    elif cmd == "folder":
        folder(sys.argv[2], *(int(a) for a in sys.argv[3:9]))
    elif cmd == "run":
        run(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]) if len(sys.argv) > 5 else None)
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
