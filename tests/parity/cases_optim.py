"""Reference trajectories for the optimizers (tests/test_optim.cpp).

Each case has parameters p<k> and per-step gradients g<k>_<s> as inputs (a missing g<k>_<s>
means parameter k has no gradient at step s, so PyTorch skips it and its step count does not
advance). torch.optim runs `steps` steps; output number s*nparams + k is parameter k after step s.
params: {"kind", "nparams", "steps", "groups": [{"params": [k...], <hyper-parameters>}]}, with
the hyper-parameters named as in fasttrain's GroupOptions.
"""
import torch

from parity_lib import case, randn

STEPS = 5


def torch_group_options(kind, g):
    if kind == "sgd":
        return dict(lr=g["lr"], momentum=g.get("momentum", 0.0), dampening=g.get("dampening", 0.0),
                    weight_decay=g.get("weight_decay", 0.0), nesterov=g.get("nesterov", False))
    return dict(lr=g["lr"], betas=(g.get("beta1", 0.9), g.get("beta2", 0.999)), eps=g.get("eps", 1e-8),
                weight_decay=g.get("weight_decay", 0.0))


def run(kind, groups, nparams):
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]

    def fn(**t):
        params = [t[f"p{k}"].clone().requires_grad_(True) for k in range(nparams)]
        opt = cls([dict(params=[params[k] for k in g["params"]], **torch_group_options(kind, g)) for g in groups],
                  foreach=False)
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


def optim_case(name, kind, dt, shapes, groups, grad_steps=None):
    """grad_steps: {k: [steps with a gradient]}; default every step."""
    grad_steps = grad_steps or {}
    inputs = {}
    for k, shape in enumerate(shapes):
        inputs[f"p{k}"] = randn(f"{name}p{k}", *shape)
        for s in grad_steps.get(k, range(STEPS)):
            inputs[f"g{k}_{s}"] = randn(f"{name}g{k}_{s}", *shape) * (0.5 + s)
    return case(name, run(kind, groups, len(shapes)), inputs, dtype=dt, grad=False,
                params={"kind": kind, "nparams": len(shapes), "steps": STEPS, "groups": groups})


def cases():
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
