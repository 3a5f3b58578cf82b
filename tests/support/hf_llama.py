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
  hf_llama.py folder DIR VOCAB CONTEXT LAYERS DIM HEADS KV_HEADS FFN THETA TIED BIAS LLAMA3_FACTOR MAX_SHARD_BYTES
      Draws the same model and writes DIR/hf as save_pretrained does (hf_folder_torch.py: config.json
      in transformers' field names, model_type "qwen2" when BIAS, shards past MAX_SHARD_BYTES, a tied
      head left out) and DIR/reference.safetensors: ids [2, T] and the logits.
  hf_llama.py run FOLDER IDS OUT [MAX_SHARD_BYTES]
      Loads FOLDER as from_pretrained would (config.json with transformers' defaults, the index and
      its shards, every name and shape strict, a tied head's lm_head.weight absent), runs it on the
      "ids" of the safetensors file IDS and writes {"logits"} to OUT. With MAX_SHARD_BYTES, also checks
      that the folder's files and index are those save_pretrained writes with that limit.
  hf_llama.py train FOLDER BATCH STEPS LR CLIP PRECISION OUT
      Loads FOLDER as `run` does and trains it STEPS steps on the "ids" and "targets" of BATCH as
      the training-equivalence test does on the C++ side: zero grads to none, forward (under CPU
      autocast to bf16 when PRECISION is bf16-mixed), f32 cross-entropy, backward,
      clip_grad_norm_(CLIP), AdamW (lr LR, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on the
      matrices, none on the norms' weights, as Hugging Face's Trainer groups them). Writes OUT:
      "losses" and "grad_norms" (before clipping) per step, and "logits" of the trained model on
      the ids in f32; under bf16-mixed also "logits_f32", those of the same run in f32 (the scale
      of bf16's own drift, against which the test measures fasttrain's).
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
import hf_folder_torch  # noqa: E402  (save_pretrained's and from_pretrained's files, beside this file)
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


def llama3_scaling(factor, context):
    """The rope_scaling of the commands' LLAMA3_FACTOR (None for 0)."""
    if factor == 0:
        return None
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 4 * context}


def inverse_frequencies(head_dim, theta, scaling):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if scaling is None:
        return inv
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
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
        # modeling_llama's order, which is the state_dict's and so decides save_pretrained's shards.
        self.self_attn = Attention(dim, heads, kv_heads, bias)
        self.mlp = MLP(dim, ffn)
        self.input_layernorm = RMSNorm(dim, eps)
        self.post_attention_layernorm = RMSNorm(dim, eps)

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
    def __init__(self, vocab, context, layers, dim, heads, kv_heads, ffn, theta, tied, bias, scaling, eps=1e-5):
        super().__init__()
        self.model = LlamaModel(vocab, layers, dim, heads, kv_heads, ffn, bias, eps)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        if tied:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.inv_freq = inverse_frequencies(dim // heads, theta, scaling).float()

    def forward(self, ids):
        T = ids.size(1)
        freqs = torch.arange(T, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))


def draw(vocab, context, layers, dim, heads, kv_heads, ffn, theta, tied, bias, factor):
    """A random model: every parameter drawn, norms near one, so a misplaced tensor shows."""
    torch.manual_seed(1234)
    scaling = llama3_scaling(factor, context)
    model = LlamaForCausalLM(vocab, context, layers, dim, heads, kv_heads, ffn, theta, tied, bias, scaling)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.05 * torch.randn_like(p))
    return model


def saved_state(model, tied):
    return {k: v for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}


def reference_ids(vocab, T):
    g = torch.Generator().manual_seed(99)
    return torch.randint(0, vocab, (2, T), generator=g), torch.randint(0, vocab, (2, T), generator=g)


def write(out_dir, vocab, context, layers, dim, heads, kv_heads, ffn, theta, tied, bias, factor):
    model = draw(vocab, context, layers, dim, heads, kv_heads, ffn, theta, tied, bias, factor)
    state = saved_state(model, tied)
    safetensors_torch.write(os.path.join(out_dir, "hf_model.safetensors"), state, {"format": "pt"})

    ids, targets = reference_ids(vocab, context)
    logits = model(ids)
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    loss.backward()
    out = {"ids": ids, "targets": targets, "logits": logits.detach(), "loss": loss.detach()}
    for name, p in model.named_parameters():  # a tied weight once, under its first name
        out["grad." + name] = p.grad
    safetensors_torch.write(os.path.join(out_dir, "reference.safetensors"), out, {})


def hf_config(vocab, context, layers, dim, heads, kv_heads, ffn, theta, tied, bias, factor):
    """config.json as LlamaConfig / Qwen2Config.to_json_string writes the fields that matter."""
    config = {"architectures": ["Qwen2ForCausalLM" if bias else "LlamaForCausalLM"],
              "model_type": "qwen2" if bias else "llama", "vocab_size": vocab,
              "max_position_embeddings": context, "num_hidden_layers": layers, "hidden_size": dim,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads, "intermediate_size": ffn,
              "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": theta,
              "rope_scaling": llama3_scaling(factor, context), "tie_word_embeddings": tied,
              "initializer_range": 0.02, "torch_dtype": "float32", "use_cache": True,
              "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2}
    if bias:
        config.update(use_sliding_window=False, sliding_window=4096, max_window_layers=layers)
    else:
        config.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    return config


def folder(out_dir, vocab, context, layers, dim, heads, kv_heads, ffn, theta, tied, bias, factor, max_bytes):
    model = draw(vocab, context, layers, dim, heads, kv_heads, ffn, theta, tied, bias, factor)
    config = hf_config(vocab, context, layers, dim, heads, kv_heads, ffn, theta, tied, bias, factor)
    hf_folder_torch.write_folder(os.path.join(out_dir, "hf"), config, saved_state(model, tied), max_bytes)
    ids, _ = reference_ids(vocab, context)
    with torch.no_grad():
        logits = model(ids)
    safetensors_torch.write(os.path.join(out_dir, "reference.safetensors"), {"ids": ids, "logits": logits}, {})


def from_config(c):
    """The model a config.json describes, with transformers' defaults for absent fields."""
    qwen2 = c["model_type"] == "qwen2"
    if c["model_type"] not in ("llama", "qwen2") or c.get("hidden_act", "silu") != "silu":
        raise SystemExit(f"not a model this script has: {c['model_type']}, {c.get('hidden_act')}")
    if c.get("attention_bias") or c.get("mlp_bias") or c.get("use_sliding_window"):
        raise SystemExit("attention_bias (o_proj too), mlp_bias and sliding windows are not written out here")
    heads = c["num_attention_heads"]
    if c.get("head_dim", c["hidden_size"] // heads) != c["hidden_size"] // heads:
        raise SystemExit("head_dim other than hidden_size / heads is not written out here")
    scaling = c.get("rope_scaling")
    if scaling is not None and scaling.get("rope_type", scaling.get("type")) != "llama3":
        raise SystemExit(f"rope_scaling {scaling} is not written out here")
    return LlamaForCausalLM(c["vocab_size"], c["max_position_embeddings"], c["num_hidden_layers"], c["hidden_size"],
                            heads, c.get("num_key_value_heads", heads), c["intermediate_size"],
                            c.get("rope_theta", 10000.0), c.get("tie_word_embeddings", False), qwen2, scaling,
                            c.get("rms_norm_eps", 1e-6))


def load_folder(folder_path):
    config, state = hf_folder_torch.read_folder(folder_path)
    model = from_config(config)
    tied = config.get("tie_word_embeddings", False)
    expected = set(saved_state(model, tied))
    if set(state) != expected:  # from_pretrained's strict check, a tied head's absence allowed
        raise SystemExit(f"{folder_path}: missing {sorted(expected - set(state))}, "
                         f"unexpected {sorted(set(state) - expected)}")
    model.load_state_dict(state, strict=False)  # shapes checked; lm_head is the embedding when tied
    return model, config, state


def run(folder_path, ids_path, out, max_bytes):
    model, config, state = load_folder(folder_path)
    if max_bytes is not None:
        tied = config.get("tie_word_embeddings", False)
        hf_folder_torch.check_layout(folder_path, {k: state[k] for k in saved_state(model, tied)}, max_bytes)
    ids = safetensors_torch.read(ids_path, verify=False)[0]["ids"]
    with torch.no_grad():
        logits = model(ids)
    safetensors_torch.write(out, {"logits": logits}, {})


def trained(folder_path, ids, targets, steps, lr, clip, precision):
    """(losses, grad_norms, logits of the trained model on ids in f32) after STEPS steps."""
    model, _, _ = load_folder(folder_path)
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    norms = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1}, {"params": norms, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    losses, grad_norms = [], []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            logits = model(ids)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))
        loss.backward()
        grad_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        opt.step()
        losses.append(float(loss))
    with torch.no_grad():
        logits = model(ids)
    return losses, grad_norms, logits


def train(folder_path, batch_path, steps, lr, clip, precision, out):
    batch = safetensors_torch.read(batch_path, verify=False)[0]
    ids, targets = batch["ids"], batch["targets"]
    losses, grad_norms, logits = trained(folder_path, ids, targets, steps, lr, clip, precision)
    tensors = {"losses": torch.tensor(losses, dtype=torch.float64),
               "grad_norms": torch.tensor(grad_norms, dtype=torch.float64), "logits": logits}
    if precision != "fp32":  # the same run in f32: how far this precision's roundings carry the model
        tensors["logits_f32"] = trained(folder_path, ids, targets, steps, lr, clip, "fp32")[2]
    safetensors_torch.write(out, tensors, {})


def model_args(a):
    ints = [int(v) for v in a[:7]]
    return ints + [float(a[7]), a[8] == "1", a[9] == "1", float(a[10])]


def main():
    cmd = sys.argv[1]
    if cmd == "write":
        write(sys.argv[2], *model_args(sys.argv[3:]))
    elif cmd == "folder":
        folder(sys.argv[2], *model_args(sys.argv[3:]), int(sys.argv[14]))
    elif cmd == "run":
        run(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]) if len(sys.argv) > 5 else None)
    elif cmd == "train":
        train(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]), sys.argv[7],
              sys.argv[8])
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
