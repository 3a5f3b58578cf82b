"""Reference trajectories for the optimizers, and gradient clipping (tests/test_optim.cpp).

Each case has parameters p<k> and per-step gradients g<k>_<s> as inputs (a missing g<k>_<s>
means parameter k has no gradient at step s, so PyTorch skips it and its step count does not
advance). torch.optim runs `steps` steps; output number s*nparams + k is parameter k after step s.
params: {"kind", "nparams", "steps", "groups": [{"params": [k...], <hyper-parameters>}]}, with
the hyper-parameters named as in fasttrain's GroupOptions.

PyTorch 1.13 has no LAMB or LARS: Lamb and Lars below are reference implementations written
from the papers with torch ops, one tensor at a time, as documented in include/fasttrain/optim.h.
"""
import math

import numpy as np
import torch

from parity_lib import case, randn

STEPS = 5


class Lamb(torch.optim.Optimizer):
    """LAMB, NVLAMB form: Adam direction with bias correction plus decoupled weight decay, scaled
    per tensor by ||p|| / ||update|| (1 when either norm is zero)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                update = (m / (1 - beta1 ** t)) / (v.sqrt() / math.sqrt(1 - beta2 ** t) + group["eps"])
                update = update + group["weight_decay"] * p
                w_norm, u_norm = p.norm().item(), update.norm().item()
                ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
                p.add_(update, alpha=-group["lr"] * ratio)


class Lars(torch.optim.Optimizer):
    """LARS: SGD whose weight-decayed gradient is scaled per tensor by
    trust_coefficient * ||p|| / (||g|| + weight_decay * ||p||) (1 when either norm is zero, or for
    groups with exclude_from_adaptation) before momentum, dampening and Nesterov."""

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                 trust_coefficient=0.001, exclude_from_adaptation=False):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, trust_coefficient=trust_coefficient,
                                      exclude_from_adaptation=exclude_from_adaptation))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            wd, momentum = group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad + wd * p
                if not group["exclude_from_adaptation"]:
                    w_norm, g_norm = p.norm().item(), p.grad.norm().item()
                    if w_norm > 0 and g_norm > 0:
                        d = d * (group["trust_coefficient"] * w_norm / (g_norm + wd * w_norm))
                if momentum != 0:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        buf = state["momentum_buffer"] = d.clone()
                    else:
                        buf = state["momentum_buffer"]
                        buf.mul_(momentum).add_(d, alpha=1 - group["dampening"])
                    d = d + momentum * buf if group["nesterov"] else buf
                p.add_(d, alpha=-group["lr"])


def torch_group_options(kind, g):
    if kind == "lars":
        return dict(lr=g["lr"], momentum=g.get("momentum", 0.0), dampening=g.get("dampening", 0.0),
                    weight_decay=g.get("weight_decay", 0.0), nesterov=g.get("nesterov", False),
                    trust_coefficient=g.get("trust_coefficient", 0.001),
                    exclude_from_adaptation=g.get("exclude_from_adaptation", False))
    if kind == "sgd":
        return dict(lr=g["lr"], momentum=g.get("momentum", 0.0), dampening=g.get("dampening", 0.0),
                    weight_decay=g.get("weight_decay", 0.0), nesterov=g.get("nesterov", False))
    return dict(lr=g["lr"], betas=(g.get("beta1", 0.9), g.get("beta2", 0.999)), eps=g.get("eps", 1e-8),
                weight_decay=g.get("weight_decay", 0.0))


def run(kind, groups, nparams):
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "lamb": Lamb,
           "lars": Lars}[kind]
    extra = {} if kind in ("lamb", "lars") else dict(foreach=False)

    def fn(**t):
        params = [t[f"p{k}"].clone().requires_grad_(True) for k in range(nparams)]
        opt = cls([dict(params=[params[k] for k in g["params"]], **torch_group_options(kind, g)) for g in groups],
                  **extra)
        outs = []
        with torch.no_grad():
            for s in range(STEPS):
                for k, p in enumerate(params):
                    key = f"g{k}_{s}"
                    p.grad = t[key].clone() if key in t else None
                opt.step()
                outs += [p.detach().clone() for p in params]
        return tuple(outs)
    return fn


def optim_case(name, kind, dt, shapes, groups, grad_steps=None, zero_params=(), zero_grads=()):
    """grad_steps: {k: [steps with a gradient]}; default every step. zero_params / zero_grads:
    parameters that start at zero / whose gradients are zero (norms of zero for LAMB and LARS)."""
    grad_steps = grad_steps or {}
    inputs = {}
    for k, shape in enumerate(shapes):
        inputs[f"p{k}"] = np.zeros(shape) if k in zero_params else randn(f"{name}p{k}", *shape)
        for s in grad_steps.get(k, range(STEPS)):
            g = randn(f"{name}g{k}_{s}", *shape) * (0.5 + s)
            inputs[f"g{k}_{s}"] = g * 0 if k in zero_grads else g
    return case(name, run(kind, groups, len(shapes)), inputs, dtype=dt, grad=False,
                params={"kind": kind, "nparams": len(shapes), "steps": STEPS, "groups": groups})


def trajectory_cases():
    shapes = [(3, 4), (5,), (2, 3, 2)]
    every = [0, 1, 2]
    for dt in ("f32", "f64"):
        yield optim_case(f"sgd_plain_{dt}", "sgd", dt, shapes, [{"params": every, "lr": 0.1}])
        yield optim_case(f"sgd_momentum_wd_{dt}", "sgd", dt, shapes,
                         [{"params": every, "lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}])
        yield optim_case(f"sgd_dampening_{dt}", "sgd", dt, shapes,
                         [{"params": every, "lr": 0.05, "momentum": 0.8, "dampening": 0.3}])
        yield optim_case(f"sgd_nesterov_{dt}", "sgd", dt, shapes,
                         [{"params": every, "lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.05}])
        # Two groups; parameter 3 never has a gradient, parameter 2 only on steps 0, 2, 4.
        yield optim_case(f"sgd_groups_{dt}", "sgd", dt, shapes + [(4,)],
                         [{"params": [0, 2], "lr": 0.1, "momentum": 0.9, "weight_decay": 0.01},
                          {"params": [1, 3], "lr": 0.02, "momentum": 0.5, "dampening": 0.1}],
                         grad_steps={2: [0, 2, 4], 3: []})
        yield optim_case(f"adam_{dt}", "adam", dt, shapes, [{"params": every, "lr": 0.01}])
        yield optim_case(f"adam_l2_{dt}", "adam", dt, shapes,
                         [{"params": every, "lr": 0.02, "beta1": 0.8, "beta2": 0.95, "eps": 1e-6,
                           "weight_decay": 0.1}])
        yield optim_case(f"adamw_{dt}", "adamw", dt, shapes, [{"params": every, "lr": 0.01, "weight_decay": 0.1}])
        # decay / no_decay groups with different lr, a parameter without gradient, one with
        # sporadic gradients (its own bias correction), and a 40k-element matrix that the pass
        # splits between threads.
        yield optim_case(f"adamw_groups_{dt}", "adamw", dt, [(200, 201), (5,), (3, 4), (7,)],
                         [{"params": [0, 2], "lr": 0.01, "weight_decay": 0.1, "beta2": 0.99},
                          {"params": [1, 3], "lr": 0.003, "weight_decay": 0.0, "eps": 1e-6}],
                         grad_steps={2: [0, 2, 4], 3: []})
        # LAMB: two groups; parameter 3 starts at zero (||p|| = 0: ratio 1 on its first step),
        # parameter 4 has zero gradients and no weight decay (update 0: ratio 1 every step),
        # parameter 2 has gradients only on steps 0, 2, 4.
        yield optim_case(f"lamb_{dt}", "lamb", dt, shapes + [(4,), (2, 2)],
                         [{"params": [0, 2, 3], "lr": 0.01, "weight_decay": 0.1, "beta2": 0.99},
                          {"params": [1, 4], "lr": 0.003, "weight_decay": 0.0, "eps": 1e-6}],
                         grad_steps={2: [0, 2, 4]}, zero_params={3}, zero_grads={4})
        # LARS: an adapted group with a zero parameter (ratio 1) and an excluded group.
        yield optim_case(f"lars_{dt}", "lars", dt, shapes + [(4,)],
                         [{"params": [0, 2, 3], "lr": 0.1, "momentum": 0.9, "weight_decay": 0.01,
                           "trust_coefficient": 0.02},
                          {"params": [1], "lr": 0.05, "momentum": 0.9, "exclude_from_adaptation": True}],
                         zero_params={3})
        yield optim_case(f"lars_nesterov_{dt}", "lars", dt, shapes,
                         [{"params": [0, 2], "lr": 0.2, "momentum": 0.8, "nesterov": True, "weight_decay": 0.05},
                          {"params": [1], "lr": 0.1, "momentum": 0.5, "dampening": 0.2, "trust_coefficient": 0.01}],
                         grad_steps={2: [1, 2, 3]})


def clip_case(name, dt, fn_name, limit, shapes, grad_scale=1.0):
    """Gradient clipping: inputs g<k>; outputs the clipped gradients (and, for clip_grad_norm_,
    the norm first). params: {"fn", "limit", "ngrads"}."""
    inputs = {f"g{k}": randn(f"{name}g{k}", *shape) * grad_scale for k, shape in enumerate(shapes)}

    def fn(**t):
        params = [torch.zeros_like(t[f"g{k}"]).requires_grad_(True) for k in range(len(shapes))]
        for k, p in enumerate(params):
            p.grad = t[f"g{k}"].clone()
        if fn_name == "norm":
            norm = torch.nn.utils.clip_grad_norm_(params, limit)
            return (norm,) + tuple(p.grad for p in params)
        torch.nn.utils.clip_grad_value_(params, limit)
        return tuple(p.grad for p in params)
    return case(name, fn, inputs, dtype=dt, grad=False, params={"fn": fn_name, "limit": limit, "ngrads": len(shapes)})


def clip_cases():
    shapes = [(30, 40), (7,), (5, 3, 2), (20000,)]
    for dt in ("f32", "f64", "bf16"):
        yield clip_case(f"clip_norm_{dt}", dt, "norm", 1.5, shapes)             # clips
        yield clip_case(f"clip_norm_noop_{dt}", dt, "norm", 1e4, shapes)        # factor 1: unchanged
        yield clip_case(f"clip_value_{dt}", dt, "value", 0.7, shapes)


def cases():
    yield from trajectory_cases()
    yield from clip_cases()
