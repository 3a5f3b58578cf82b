"""Reference learning-rate (and momentum) sequences for the schedules (tests/test_schedule.cpp).

Each case steps a real torch.optim.lr_scheduler on a dummy optimizer the usual way
(`opt.step(); sched.step()`) and records, before each optimizer step, the group's lr (out0) and,
when the scheduler cycles it, the SGD momentum or Adam beta1 (out1). The cosine-with-warmup and
warmup-stable-decay schedules have no PyTorch class: they run through LambdaLR with the formula
written out below, independently of the C++ code.
params: {"kind", "steps", "optimizer", <the factory's arguments, named as in schedule.h>}.
"""
import math

import torch

from parity_lib import case


def cosine_factor(p):
    """lr/base_lr: linear warmup (step s gets (s+1)/warmup), half cosine to min_lr at total_steps."""
    w, total, floor = p["warmup_steps"], p["total_steps"], p["min_lr"] / p["base_lr"]

    def f(s):
        if s < w:
            return (s + 1) / w
        t = min(1.0, (s - w) / max(1, total - w))
        return floor + (1 - floor) * (1 + math.cos(math.pi * t)) / 2
    return f


def wsd_factor(p):
    """lr/base_lr: the same warmup, flat at 1, then a straight line to min_lr at total_steps."""
    w, decay, total, floor = p["warmup_steps"], p["decay_steps"], p["total_steps"], p["min_lr"] / p["base_lr"]

    def f(s):
        if s < w:
            return (s + 1) / w
        if s >= total:
            return floor
        into_decay = s - (total - decay)
        return 1.0 if into_decay < 0 else 1 - (1 - floor) * into_decay / decay
    return f


def make_scheduler(opt, p):
    S = torch.optim.lr_scheduler
    k = p["kind"]
    if k == "constant":
        return S.ConstantLR(opt, factor=1.0)
    if k == "step":
        return S.StepLR(opt, step_size=p["step_size"], gamma=p["gamma"])
    if k == "multistep":
        return S.MultiStepLR(opt, milestones=p["milestones"], gamma=p["gamma"])
    if k == "exponential":
        return S.ExponentialLR(opt, gamma=p["gamma"])
    if k == "linear":
        return S.LinearLR(opt, start_factor=p["start_factor"], end_factor=p["end_factor"],
                          total_iters=p["total_iters"])
    if k == "cosine":
        return S.LambdaLR(opt, cosine_factor(p))
    if k == "wsd":
        return S.LambdaLR(opt, wsd_factor(p))
    if k == "one_cycle":
        return S.OneCycleLR(opt, max_lr=p["max_lr"], total_steps=p["total_steps"], pct_start=p["pct_start"],
                            anneal_strategy=p["anneal_strategy"], cycle_momentum=p["cycle_momentum"],
                            base_momentum=p["base_momentum"], max_momentum=p["max_momentum"],
                            div_factor=p["div_factor"], final_div_factor=p["final_div_factor"],
                            three_phase=p["three_phase"])
    if k == "cyclic":
        return S.CyclicLR(opt, base_lr=p["base_lr"], max_lr=p["max_lr"], step_size_up=p["step_size_up"],
                          step_size_down=p["step_size_down"] or None, mode=p["mode"], gamma=p["gamma"],
                          cycle_momentum=p["cycle_momentum"], base_momentum=p["base_momentum"],
                          max_momentum=p["max_momentum"])
    raise ValueError(k)


def run(p):
    def fn():
        w = torch.nn.Parameter(torch.zeros(1))
        lr0 = p.get("base_lr", p.get("max_lr"))
        if p["optimizer"] == "adam":
            opt = torch.optim.Adam([w], lr=lr0, betas=(0.9, 0.999))
        else:
            opt = torch.optim.SGD([w], lr=lr0, momentum=0.9)
        sched = make_scheduler(opt, p)
        lrs, moms = [], []
        for _ in range(p["steps"]):
            g = opt.param_groups[0]
            lrs.append(g["lr"])
            moms.append(g["betas"][0] if p["optimizer"] == "adam" else g["momentum"])
            opt.step()
            sched.step()
        out = [torch.tensor(lrs, dtype=torch.float64)]
        if p.get("cycle_momentum", False):
            out.append(torch.tensor(moms, dtype=torch.float64))
        return tuple(out)
    return fn


def schedule_case(name, steps, optimizer="sgd", **p):
    p.update(steps=steps, optimizer=optimizer)
    # Closed form here against PyTorch's recursive updates (step, exponential, linear) and
    # LambdaLR's base_lr * factor: equal up to a few ulps per step, hence rtol 1e-12.
    return case("schedule_" + name, run(p), {}, dtype="f64", grad=False, params=p, atol=1e-18, rtol=1e-12)


def one_cycle(name, steps=None, optimizer="sgd", **o):
    full = dict(max_lr=0.1, total_steps=100, pct_start=0.3, anneal_strategy="cos", cycle_momentum=True,
                base_momentum=0.85, max_momentum=0.95, div_factor=25.0, final_div_factor=1e4, three_phase=False)
    full.update(o)
    return schedule_case(name, steps or full["total_steps"], optimizer, kind="one_cycle", **full)


def cyclic(name, steps=40, **o):
    full = dict(base_lr=1e-3, max_lr=6e-3, step_size_up=2000, step_size_down=0, mode="triangular", gamma=1.0,
                cycle_momentum=True, base_momentum=0.8, max_momentum=0.9)
    full.update(o)
    return schedule_case(name, steps, kind="cyclic", **full)


def cases():
    yield schedule_case("constant", 10, kind="constant", base_lr=0.1)
    yield schedule_case("step", 20, kind="step", base_lr=0.1, step_size=3, gamma=0.5)
    yield schedule_case("step_every", 30, kind="step", base_lr=0.05, step_size=1, gamma=0.9)
    yield schedule_case("multistep", 15, kind="multistep", base_lr=0.1, milestones=[2, 5, 9], gamma=0.1)
    yield schedule_case("multistep_at_zero", 8, kind="multistep", base_lr=0.3, milestones=[0, 4], gamma=0.5)
    yield schedule_case("exponential", 60, kind="exponential", base_lr=0.1, gamma=0.97)
    yield schedule_case("linear_default", 10, kind="linear", base_lr=0.1, start_factor=1 / 3, end_factor=1.0,
                        total_iters=5)
    yield schedule_case("linear_to_zero", 12, kind="linear", base_lr=0.2, start_factor=1.0, end_factor=0.0,
                        total_iters=7)
    yield schedule_case("linear_down", 12, kind="linear", base_lr=0.2, start_factor=0.5, end_factor=0.1,
                        total_iters=8)
    yield schedule_case("cosine", 60, kind="cosine", base_lr=0.1, warmup_steps=10, total_steps=50, min_lr=1e-3)
    yield schedule_case("cosine_no_warmup", 25, kind="cosine", base_lr=0.1, warmup_steps=0, total_steps=20,
                        min_lr=0.0)
    yield schedule_case("cosine_long_warmup", 12, kind="cosine", base_lr=0.1, warmup_steps=8, total_steps=5,
                        min_lr=0.01)
    yield schedule_case("wsd", 45, kind="wsd", base_lr=0.1, warmup_steps=5, decay_steps=10, total_steps=40,
                        min_lr=1e-3)
    yield schedule_case("wsd_no_warmup", 12, kind="wsd", base_lr=0.1, warmup_steps=0, decay_steps=1, total_steps=10,
                        min_lr=0.0)
    # 1cycle: every anneal strategy and phase count, fractional phase ends (37 * 0.3 = 11.1),
    # momentum cycled on SGD's momentum and on Adam's beta1, and without momentum cycling.
    yield one_cycle("one_cycle_default")
    yield one_cycle("one_cycle_linear", anneal_strategy="linear")
    yield one_cycle("one_cycle_three_phase", three_phase=True)
    yield one_cycle("one_cycle_three_phase_linear", total_steps=37, three_phase=True, anneal_strategy="linear")
    yield one_cycle("one_cycle_options", max_lr=0.5, total_steps=37, pct_start=0.25, div_factor=10.0,
                    final_div_factor=100.0, base_momentum=0.8, max_momentum=0.9)
    yield one_cycle("one_cycle_no_momentum", total_steps=30, cycle_momentum=False)
    yield one_cycle("one_cycle_adam", optimizer="adam", total_steps=50, pct_start=0.4)
    yield one_cycle("one_cycle_adam_three_phase_linear", optimizer="adam", total_steps=41, three_phase=True,
                    anneal_strategy="linear", base_momentum=0.75, max_momentum=0.92)
    yield one_cycle("one_cycle_tiny", total_steps=2)
    # Cyclic: each mode, asymmetric cycles, and without momentum cycling (PyTorch 1.13's CyclicLR
    # cycles only an SGD-style momentum, so there is no Adam case).
    yield cyclic("cyclic_triangular", base_lr=0.01, max_lr=0.1, step_size_up=4)
    yield cyclic("cyclic_triangular_asymmetric", base_lr=0.01, max_lr=0.1, step_size_up=4, step_size_down=6)
    yield cyclic("cyclic_triangular2", 50, base_lr=0.01, max_lr=0.1, step_size_up=3, step_size_down=5,
                 mode="triangular2")
    yield cyclic("cyclic_exp_range", base_lr=0.01, max_lr=0.1, step_size_up=4, mode="exp_range", gamma=0.97,
                 base_momentum=0.85, max_momentum=0.95)
    yield cyclic("cyclic_no_momentum", base_lr=0.001, max_lr=0.006, step_size_up=5, cycle_momentum=False)
