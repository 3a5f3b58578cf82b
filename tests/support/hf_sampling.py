#!/usr/bin/env python3
"""Hugging Face generate's sampling, written out in PyTorch, for tests/test_generation.cpp.

Debian's python3-torch has no `transformers`, so its logits warpers are written out here as
transformers implements them: TemperatureLogitsWarper (scores / t), TopKLogitsWarper (scores below
the k-th largest set to -inf; k clamped to the vocabulary) and TopPLogitsWarper (sort ascending,
softmax, cumsum, remove where the cumulative probability is at most 1 - p, always keeping the most
likely token), applied in that order, as generate builds its warper list (a top_p of 1 adds no
warper). The token is then drawn by inverting the cumulative distribution of the softmax in id
order at the given uniform number u (torch.multinomial's draw cannot be replayed from C++).

  hf_sampling.py IN OUT
      IN holds "logits" [N, V] and per case "temperature", "top_p", "u" [N] (f64) and "top_k" [N]
      (i64); OUT gets "filtered" [N, V] (f64, -inf where removed) and "token" [N] (i64).
Exits with status 77 when torch is not installed.
"""
import os
import sys

try:
    import torch
except ImportError:
    sys.exit(77)  # the C++ test reports a skip

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_torch  # noqa: E402  (the project's format reader/writer, beside this file)


def temperature_warper(scores, t):
    return scores / t


def top_k_warper(scores, k):
    if k == 0:
        return scores
    k = min(k, scores.size(-1))
    indices_to_remove = scores < torch.topk(scores, k)[0][..., -1, None]
    return scores.masked_fill(indices_to_remove, -float("inf"))


def top_p_warper(scores, p):
    if p >= 1.0:
        return scores
    sorted_logits, sorted_indices = torch.sort(scores, descending=False)
    cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    sorted_indices_to_remove = cumulative_probs <= (1 - p)
    sorted_indices_to_remove[..., -1:] = 0  # min_tokens_to_keep = 1
    indices_to_remove = sorted_indices_to_remove.scatter(-1, sorted_indices, sorted_indices_to_remove)
    return scores.masked_fill(indices_to_remove, -float("inf"))


def draw(scores, u):
    probs = scores.softmax(dim=-1)
    cdf = probs.cumsum(dim=-1)
    token = int(torch.searchsorted(cdf, torch.tensor([u], dtype=cdf.dtype), right=True)[0])
    # Rounding can leave cdf[-1] just below u: the last token with any probability takes it.
    return min(token, int(torch.nonzero(probs > 0).max()))


def main():
    tensors, _ = safetensors_torch.read(sys.argv[1])
    logits = tensors["logits"].double()
    filtered, tokens = [], []
    for i in range(logits.size(0)):
        s = temperature_warper(logits[i:i + 1], float(tensors["temperature"][i]))
        s = top_k_warper(s, int(tensors["top_k"][i]))
        s = top_p_warper(s, float(tensors["top_p"][i]))
        filtered.append(s[0])
        tokens.append(draw(s[0], float(tensors["u"][i])))
    safetensors_torch.write(sys.argv[2], {"filtered": torch.stack(filtered),
                                          "token": torch.tensor(tokens, dtype=torch.int64)}, {})


if __name__ == "__main__":
    main()
