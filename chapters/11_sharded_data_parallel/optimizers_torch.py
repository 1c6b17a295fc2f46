#!/usr/bin/env python3
"""The optimizers of common/optimizer.h as PyTorch runs them: torch.optim.AdamW,
torch.optim.SGD(momentum=...) and torch.nn.utils.clip_grad_norm_, on made-up inputs that
tests/test_optimizer.cpp builds the same way. Its output is the reference that test holds our
kernels to (tests/fixtures/optimizers_torch.txt, made by this script):

    /usr/bin/python3 chapters/11_sharded_data_parallel/optimizers_torch.py > tests/fixtures/optimizers_torch.txt
    /usr/bin/python3 chapters/11_sharded_data_parallel/optimizers_torch.py --check tests/fixtures/optimizers_torch.txt

The inputs are small exact fractions (k / 64, k / 32), the same floats in C++ and Python.
One line per case and step: `case STEP v0 v1 ...`, the parameters after that step (for the
clipping case, the factor clip_grad_norm_ applied first, then the two tensors' parameters).
"""
import argparse
import sys

try:
    import torch
except ImportError:
    print("SKIPPED: needs PyTorch (apt-get install python3-torch; run with /usr/bin/python3)")
    sys.exit(77)

STEPS = 5


def params(n, offset=0):
    """p_i = ((37 (i + offset)) mod 101 - 50) / 64"""
    return torch.tensor([((37 * (i + offset)) % 101 - 50) / 64 for i in range(n)], dtype=torch.float32)


def grads(n, step, offset=0):
    """g_i(t) = ((13 (i + offset) + 7 t) mod 53 - 26) / 32"""
    return torch.tensor([((13 * (i + offset) + 7 * step) % 53 - 26) / 32 for i in range(n)], dtype=torch.float32)


def run_single(make_optimizer, n=37):
    p = torch.nn.Parameter(params(n))
    opt = make_optimizer([p])
    rows = []
    for t in range(1, STEPS + 1):
        p.grad = grads(n, t)
        opt.step()
        rows.append(p.detach().clone().tolist())
    return rows


def run_clipped(max_norm):
    # Two tensors, as a model has several: the norm is over both, one factor for both.
    a = torch.nn.Parameter(params(37))
    b = torch.nn.Parameter(params(13, offset=100))
    opt = torch.optim.AdamW([a, b])
    rows = []
    for t in range(1, STEPS + 1):
        a.grad = grads(37, t)
        b.grad = grads(13, t, offset=100)
        norm = torch.nn.utils.clip_grad_norm_([a, b], max_norm)
        factor = min(1.0, max_norm / (float(norm) + 1e-6))
        opt.step()
        rows.append([factor] + a.detach().tolist() + b.detach().tolist())
    return rows


def cases():
    return {
        "adamw_default": run_single(lambda ps: torch.optim.AdamW(ps)),
        "adamw_tuned": run_single(lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.8, 0.99), eps=1e-6,
                                                               weight_decay=0.1)),
        "sgd_momentum": run_single(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
        "sgd_momentum_decay": run_single(lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3)),
        "adamw_clipped": run_clipped(max_norm=1.0),
    }


def lines():
    out = [f"# torch {torch.__version__}: each case's values after each step (optimizers_torch.py)"]
    for name, rows in cases().items():
        for t, row in enumerate(rows, start=1):
            out.append(f"{name} {t} " + " ".join(f"{x:.9g}" for x in row))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", metavar="FILE",
                        help="compare with FILE (the committed reference) instead of printing; exit 1 on a difference")
    args = parser.parse_args()
    ours = lines()
    if not args.check:
        print("\n".join(ours))
        return 0
    with open(args.check) as f:
        theirs = [line.rstrip("\n") for line in f]
    # The header names the PyTorch version that wrote it; the numbers must agree to 1e-6.
    worst = 0.0
    if len(ours) != len(theirs):
        print(f"{args.check}: {len(theirs)} lines, this PyTorch gives {len(ours)}")
        return 1
    for a, b in zip(ours[1:], theirs[1:]):
        wa, wb = a.split(), b.split()
        if wa[:2] != wb[:2] or len(wa) != len(wb):
            print(f"{args.check}: line '{b[:40]}...' does not match '{a[:40]}...'")
            return 1
        for x, y in zip(wa[2:], wb[2:]):
            worst = max(worst, abs(float(x) - float(y)) / max(1.0, abs(float(y))))
    print(f"largest difference from {args.check}: {worst:.3g} (bound 1e-6)")
    return 0 if worst <= 1e-6 else 1


if __name__ == "__main__":
    sys.exit(main())
