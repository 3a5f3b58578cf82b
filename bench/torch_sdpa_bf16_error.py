"""How far PyTorch's own CPU bf16 scaled_dot_product_attention (its fused flash kernel, which rounds
the probabilities P and the score gradients dS to bf16 for its products) lands from an f32
computation on the same bf16 inputs, measured against the tolerance fasttrain's bf16 attention
parity cases use (tests/parity: |a - b| <= 0.01 + 0.02 |b|). The shapes are parity cases of
tests/parity/cases_attention.py plus smollm-135m's attention; five random draws each.

Prints per case and tensor the largest absolute error and the largest excess over that tolerance
(> 0: PyTorch itself would fail the case). Run with a PyTorch that has F.scaled_dot_product_attention
(2.x), e.g. the 2.6 root of scripts/torch26-chroot.sh:
    cp bench/torch_sdpa_bf16_error.py $ROOT/tmp/ && chroot $ROOT python3 /tmp/torch_sdpa_bf16_error.py
"""
import math

import torch

CASES = {  # name -> (B, H, Tq, Tk, D, causal, scale)
    "causal_q_gt_k": (1, 2, 53, 37, 16, True, 0.5),
    "causal": (2, 2, 70, 70, 64, True, None),
    "long": (1, 2, 130, 130, 16, False, None),
    "smollm_135m": (1, 9, 1024, 1024, 64, True, None),
}


def reference(q, k, v, causal, scale):
    s = (q @ k.transpose(-2, -1)) * scale
    if causal:  # top-left aligned, as is_causal
        tq, tk = s.shape[-2:]
        s = s.masked_fill(torch.ones(tq, tk, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def main():
    torch.manual_seed(0)
    print("torch", torch.__version__)
    for name, (B, H, Tq, Tk, D, causal, scale) in CASES.items():
        scale = scale if scale is not None else 1 / math.sqrt(D)
        worst = {}
        for _ in range(5):
            q, k, v = (torch.randn(B, H, t, D).bfloat16().requires_grad_() for t in (Tq, Tk, Tk))
            grad = torch.randn(B, H, Tq, D).bfloat16()
            qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale).backward(grad)
            out = torch.nn.functional.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(),
                                                                   is_causal=causal, scale=scale)
            ref = reference(qf, kf, vf, causal, scale)
            ref.backward(grad.float())
            pairs = (("out", out, ref), ("dq", q.grad, qf.grad), ("dk", k.grad, kf.grad), ("dv", v.grad, vf.grad))
            for tensor, got, want in pairs:
                want = want.detach().bfloat16().float()  # the parity references round their results too
                err = (got.float() - want).abs()
                excess = (err - (0.01 + 0.02 * want.abs())).max().item()
                w = worst.setdefault(tensor, [0.0, -1.0])
                w[0], w[1] = max(w[0], err.max().item()), max(w[1], excess)
        print(name, "  ".join(f"{t}: max err {e:.4f}, excess {x:+.4f}" for t, (e, x) in worst.items()))


if __name__ == "__main__":
    main()
