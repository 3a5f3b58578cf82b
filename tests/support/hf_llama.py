#!/usr/bin/env python3
"""A Hugging Face-style Llama in plain PyTorch for the Llama tests (tests/test_llama.cpp).

Debian's python3-torch has no `transformers`, so LlamaForCausalLM is written out here with HF's
module names and state-dict layout: model.embed_tokens, model.layers[i].{input_layernorm,
self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm, lm_head
(tied or not). It computes what transformers' modeling_llama computes: RMSNorm in f32 with a
weight, rotary embeddings applied as q * cos + rotate_half(q) * sin with cos/sin of the angles
cat(freqs, freqs), Llama 3's frequency scaling, grouped-query attention by repeating K/V heads
(repeat_kv), a causal softmax and the gated SiLU MLP.

  hf_llama.py write DIR VOCAB CONTEXT LAYERS DIM HEADS KV_HEADS FFN THETA TIED BIAS LLAMA3_FACTOR
      Draws a random model (every parameter, norms and biases included, so a misplaced tensor
      changes the output) and writes in DIR:
        hf_model.safetensors   LlamaForCausalLM.save_pretrained's names (lm_head.weight left out when tied)
        reference.safetensors  ids and targets [2, T], the logits, the mean cross-entropy "loss" and
                               "grad.<name>" of every parameter for that loss
      LLAMA3_FACTOR 0 means no rope_scaling; otherwise rope_type llama3 with that factor,
      low/high frequency factors 1 and 4, and original_max_position_embeddings 4 CONTEXT
      (with head size 8 and theta 1e4 the four frequencies fall in all three bands).
Exits with status 77 when torch is not installed.
"""
import math
import os
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    sys.exit(77)  # the C++ test reports a skip

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_torch  # noqa: E402  (the project's format reader/writer, beside this file)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def inverse_frequencies(head_dim, theta, factor, context):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if factor == 0:
        return inv
    low, high, original = 1.0, 4.0, context * 4
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > original / low, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, blended, scaled)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, dim, heads, kv_heads, bias):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q_proj = nn.Linear(dim, heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = self.heads // self.kv_heads
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        w = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        w = w.masked_fill(~mask, float("-inf"))
        y = (F.softmax(w.float(), dim=-1).to(q.dtype) @ v).transpose(1, 2).reshape(B, T, -1)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, dim, ffn):
        super().__init__()
        self.gate_proj = nn.Linear(dim, ffn, bias=False)
        self.up_proj = nn.Linear(dim, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, dim, heads, kv_heads, ffn, bias, eps):
        super().__init__()
        self.input_layernorm = RMSNorm(dim, eps)
        self.self_attn = Attention(dim, heads, kv_heads, bias)
        self.post_attention_layernorm = RMSNorm(dim, eps)
        self.mlp = MLP(dim, ffn)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, vocab, layers, dim, heads, kv_heads, ffn, bias, eps):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([DecoderLayer(dim, heads, kv_heads, ffn, bias, eps) for _ in range(layers)])
        self.norm = RMSNorm(dim, eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, vocab, context, layers, dim, heads, kv_heads, ffn, theta, tied, bias, factor, eps=1e-5):
        super().__init__()
        self.model = LlamaModel(vocab, layers, dim, heads, kv_heads, ffn, bias, eps)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        if tied:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.inv_freq = inverse_frequencies(dim // heads, theta, factor, context).float()

    def forward(self, ids):
        T = ids.size(1)
        freqs = torch.arange(T, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))


def write(out_dir, vocab, context, layers, dim, heads, kv_heads, ffn, theta, tied, bias, factor):
    torch.manual_seed(1234)
    model = LlamaForCausalLM(vocab, context, layers, dim, heads, kv_heads, ffn, theta, tied, bias, factor)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.05 * torch.randn_like(p))
    state = {k: v for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    safetensors_torch.write(os.path.join(out_dir, "hf_model.safetensors"), state, {"format": "pt"})

    g = torch.Generator().manual_seed(99)
    T = context
    ids = torch.randint(0, vocab, (2, T), generator=g)
    targets = torch.randint(0, vocab, (2, T), generator=g)
    logits = model(ids)
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    loss.backward()
    out = {"ids": ids, "targets": targets, "logits": logits.detach(), "loss": loss.detach()}
    for name, p in model.named_parameters():  # a tied weight once, under its first name
        out["grad." + name] = p.grad
    safetensors_torch.write(os.path.join(out_dir, "reference.safetensors"), out, {})


def main():
    if sys.argv[1] != "write":
        raise SystemExit(f"unknown command {sys.argv[1]}")
    a = sys.argv[3:]
    ints = [int(v) for v in a[:7]]
    write(sys.argv[2], *ints, float(a[7]), a[8] == "1", a[9] == "1", float(a[10]))


if __name__ == "__main__":
    main()
