#!/usr/bin/python3
"""Chapter 09: check one training step of the C++ ResNet-18 against PyTorch.

The C++ program writes one step's tensors with --dump-step DIR: the
parameters and BatchNorm running statistics it started from, the batch
(the first n training images, cut into one shard per device), and what the
step computed: logits, mean loss, the gradient of the mean loss (summed
over devices and divided by n) and device 0's running statistics after the
forward pass.  This script recomputes the same step with the PyTorch twin's
network (resnet_torch.py), loaded with the very same numbers, and compares
every tensor.

How the reference treats BatchNorm is the point of the exercise:

  * eval_logits: the same batch once more in evaluation mode (running
    statistics, as the test accuracy is computed), which the C++ program
    writes after the step; the reference uses the running statistics its own
    step left.
  * bn=sync, or one device: the whole batch in one forward pass.  Synchronized
    BatchNorm sums each channel's statistics over all devices, so every device
    normalizes with the whole batch's mean and variance, exactly what one
    device holding the whole batch computes.
  * bn=device (nn.DataParallel's BatchNorm): each shard goes through the
    network on its own, so each normalizes with its own shard's statistics.
    The loss is the sum of all examples' losses over n, and the running
    statistics to compare are those after shard 0's pass (device 0's, the
    ones DataParallel keeps).

The reference runs in float32, as the C++ program does.  The same step also
runs in float64, for two reasons:

  * the last two columns give the C++ program's and PyTorch-float32's
    distances from it: when both are of the same size, the C++ program is as
    exact as PyTorch;
  * ReLU has a kink.  A ReLU input that lies within float32 rounding of 0
    (a "tie") may come out positive in one program and negative in the
    other; that element's gradient then passes in one and is cut in the
    other, and every gradient computed after it (the layers before it)
    moves.  With millions of ReLU inputs a few such flips per step are
    normal, and each moves gradients by up to a few percent of their largest
    value: far more than rounding, with nothing wrong.  So the script finds
    the ties (inputs closer to 0 than a few times their layer's float32
    rounding error, measured against float64), works out what flipping each
    one would change, and takes out of the C++ program's error the flips
    whose signature it carries.  It names them, and judges the gradients by
    the error left (the "w/o ties" column).  Forward tensors need none of
    this: ReLU itself is continuous.

A bias right before a BatchNorm (the stem's, every conv1 and conv2) has a
gradient of exactly 0, which both programs compute as float32 noise; its
error is measured against the sum of the absolute terms that cancel.

The tensors are listed in the order the step computes them: running
statistics and logits in the forward order, gradients in the backward order
(fc first).  When something is wrong, read from the top: the first tensor
that disagrees is where to look; everything computed from it disagrees too.

    build/bin/09_resnet --dump-step /tmp/step --batch-size 64 --devices 2 --width 8
    /usr/bin/python3 chapters/09_resnet/crosscheck.py /tmp/step

Small dumps check in seconds (width 8, batch 64: about 3 s on 2 cores).  At
width 64 and batch 256 the float64 step takes minutes on a CPU and the ties
are too many to weigh one by one.  Exit status: 0 when every tensor is
within --tolerance, 1 when one is not, 2 for bad usage or a dump that
cannot be read.
"""

import argparse
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resnet_torch import Residual, resnet18  # noqa: E402
from lenet_torch import positive_float, positive_int  # noqa: E402  (chapter 01's; resnet_torch put it on the path)

TIE_MARGIN = 4      # a tie: |ReLU input| <= this many times the layer's RMS float32 rounding error


def refuse(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args():
    p = argparse.ArgumentParser(
        description="Compare one training step dumped by build/bin/09_resnet --dump-step DIR with PyTorch.")
    p.add_argument("dump", help="the folder written by --dump-step")
    p.add_argument("--tolerance", type=positive_float, default=1e-3,
                   help="largest relative error that passes (default 1e-3)")
    p.add_argument("--no-float64", action="store_true",
                   help="skip the float64 step: no f64 columns and no ReLU tie analysis (gradients then "
                        "compare as they are and may fail from ties alone)")
    p.add_argument("--max-ties", type=positive_int, default=200,
                   help="weigh the ReLU ties one by one up to this many (one backward pass each; default 200)")
    return p.parse_args()


# --------------------------------------------------------------------------
# Reading the dump
# --------------------------------------------------------------------------

def read_meta(path):
    """meta.txt: key=value lines.  Keys this script does not know are kept and ignored."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        refuse(f"cannot read {path}: {e}")
    meta = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep:
            refuse(f"{path}:{number}: expected key=value, got {line!r}")
        meta[key.strip()] = value.strip()
    for key in ("width", "devices", "bn", "batch", "shards"):
        if key not in meta:
            refuse(f"{path} has no '{key}=' line")
    try:
        width, devices, batch = int(meta["width"]), int(meta["devices"]), int(meta["batch"])
        shards = [int(s) for s in meta["shards"].split(",")]
        momentum = float(meta.get("momentum", "0.1"))  # PyTorch's defaults when absent
        eps = float(meta.get("eps", "1e-05"))
    except ValueError as e:
        refuse(f"{path}: {e}")
    if meta["bn"] not in ("device", "sync"):
        refuse(f"{path}: bn must be 'device' or 'sync', got {meta['bn']!r}")
    if min(width, devices, batch) <= 0 or min(shards) <= 0:
        refuse(f"{path}: width, devices, batch and every shard must be positive")
    if len(shards) != devices or sum(shards) != batch:
        refuse(f"{path}: shards {meta['shards']} should be {devices} sizes adding up to batch {batch}")
    return dict(meta, width=width, devices=devices, batch=batch, shards=shards, momentum=momentum, eps=eps)


def read_raw(path, dtype, shape):
    """One headerless little-endian file holding exactly prod(shape) values."""
    count = int(np.prod(shape))
    try:
        size = os.path.getsize(path)
    except OSError:
        refuse(f"{path} is missing")
    expected = count * np.dtype(dtype).itemsize
    if size != expected:
        refuse(f"{path} holds {size} bytes; shape {list(shape)} needs {expected}")
    return torch.from_numpy(np.fromfile(path, dtype=dtype).reshape(shape))


def read_tensors(folder, shapes):
    """{name: tensor} for every name in shapes, from folder/<name>.f32."""
    if not os.path.isdir(folder):
        refuse(f"{folder} is missing")
    tensors = {name: read_raw(os.path.join(folder, name + ".f32"), "<f4", shape) for name, shape in shapes.items()}
    # A file the net has no tensor for is usually a name spelt differently on the two sides.
    extra = sorted(f for f in os.listdir(folder) if f.endswith(".f32") and f[:-4] not in shapes)
    if extra:
        print(f"note: {folder} has files this network has no tensor for: {', '.join(extra)}")
    return tensors


# --------------------------------------------------------------------------
# The network's structure
# --------------------------------------------------------------------------

def running_stat_names(net):
    return [k for k in net.state_dict() if k.endswith(("running_mean", "running_var"))]


def forward_order(net, X):
    """The layers that hold tensors, named, in the order a forward pass calls them."""
    order = []
    hooks = [m.register_forward_hook(lambda m, i, o, name=name: order.append(name))
             for name, m in net.named_modules() if isinstance(m, (nn.Conv2d, nn.BatchNorm2d, nn.Linear))]
    net.eval()  # eval mode: the pass leaves the running statistics alone
    with torch.no_grad():
        net(X[:1])
    for h in hooks:
        h.remove()
    return order


def conv_before_batchnorm(net):
    """{conv name: the BatchNorm that normalizes its output}: the stem's and each block's conv1, conv2.

    Such a convolution's bias has a gradient of exactly 0: the BatchNorm
    subtracts the channel's batch mean, so adding a constant to the channel
    changes nothing after it.  Both programs compute it as a sum of many
    terms that cancel, so what they print is rounding noise, and the noise
    scales with the size of the terms, not with their (zero) sum.
    """
    pairs = {}
    for name, m in net.named_modules():
        if isinstance(m, nn.Sequential):
            children = list(m.named_children())
            for (a, conv), (b, bn) in zip(children, children[1:]):
                if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d):
                    pairs[f"{name}.{a}".lstrip(".")] = f"{name}.{b}".lstrip(".")
        elif isinstance(m, Residual):
            pairs[f"{name}.conv1"] = f"{name}.bn1"
            pairs[f"{name}.conv2"] = f"{name}.bn2"
    return pairs


# --------------------------------------------------------------------------
# The reference step
# --------------------------------------------------------------------------

class Recorder:
    """Keeps what the tie analysis and the bias check need from one step.

    Every ReLU call: its input and output (the graph's own tensors) and a
    readable name.  The network calls ReLU both as a module (the stem's
    nn.ReLU) and as F.relu (inside Residual); nn.ReLU calls F.relu too, so
    swapping F.relu for the step's duration sees all of them.  And every
    convolution that feeds a BatchNorm: its output, to measure the size of
    the terms its bias gradient sums.
    """

    def __init__(self, net):
        self.relus = []        # (name, shard, input, output)
        self.conv_out = {}     # conv name -> its outputs (one per shard)
        self.shard = 0
        self.offsets = [0]     # each shard's first example in the whole batch
        self._where, self._calls = "?", 0
        self._hooks = []
        for name, m in net.named_modules():
            if isinstance(m, (Residual, nn.ReLU)):
                self._hooks.append(m.register_forward_pre_hook(self._enter(name, isinstance(m, Residual))))
        for name in conv_before_batchnorm(net):
            conv = net.get_submodule(name)
            self._hooks.append(conv.register_forward_hook(self._keep_output(name)))

    def _enter(self, name, numbered):
        def hook(module, inputs):
            self._where, self._calls = (name, 0) if numbered else (f"stem ReLU ({name})", None)
        return hook

    def _keep_output(self, name):
        def hook(module, inputs, output):
            output.retain_grad()
            self.conv_out.setdefault(name, []).append(output)
        return hook

    def _relu(self, x, inplace=False):
        y = self._original(x)
        if self._calls is None:
            name = self._where
        else:
            self._calls += 1
            name = f"{self._where}.relu{self._calls}"  # Residual: relu1 after bn1, relu2 on the sum
        y.retain_grad()
        self.relus.append((name, self.shard, x, y))
        return y

    def __enter__(self):
        self._original = F.relu
        F.relu = self._relu
        return self

    def __exit__(self, *exc):
        F.relu = self._original
        for h in self._hooks:
            h.remove()


def reference_step(net, X, y, meta):
    """One training forward and backward of the dumped batch.

    Returns ({name: tensor} of everything the dump holds, the Recorder);
    the autograd graph is kept for the tie analysis.
    """
    net.train()
    stats = running_stat_names(net)
    per_device = meta["bn"] == "device" and meta["devices"] > 1
    with Recorder(net) as rec:
        if per_device:
            # Each shard on its own: its BatchNorms see only its examples.  The
            # shards go through ONE module, one after the other; a train-mode
            # pass only reads the batch's statistics, so the order changes no
            # logit, but each pass updates the running statistics, so device 0's
            # are taken right after shard 0.
            logits, after_shard0, start = [], None, 0
            rec.offsets = [sum(meta["shards"][:i]) for i in range(len(meta["shards"]))]
            for i, size in enumerate(meta["shards"]):
                rec.shard = i
                logits.append(net(X[start:start + size]))
                start += size
                if after_shard0 is None:
                    after_shard0 = {k: v.detach().clone() for k, v in net.state_dict().items() if k in stats}
            logits = torch.cat(logits)
        else:
            logits = net(X)
    # The sum over every example, divided by n: the mean loss whatever the shards.
    loss = F.cross_entropy(logits, y, reduction="sum") / X.shape[0]
    net.zero_grad()
    loss.backward(retain_graph=True)
    out = {"logits": logits.detach(), "loss": loss.detach().reshape(1)}
    state = net.state_dict()
    out.update({"state_after/" + k: (after_shard0[k] if per_device else state[k].detach().clone()) for k in stats})
    out.update({"grads/" + k: p.grad.detach().clone() for k, p in net.named_parameters()})
    return out, rec


def evaluation_logits(meta, params, ref, stats, X, dtype):
    """The batch in evaluation mode: the step's starting parameters, normalized with the
    running statistics the reference step left (device 0's), as the test accuracy is computed."""
    after = {k: ref["state_after/" + k].to(dtype) for k in stats}
    net = load_net(meta, params, after, dtype)
    net.eval()
    with torch.no_grad():
        return net(X)


def load_net(meta, params, state, dtype):
    net = resnet18(10, 1, meta["width"])
    net.load_state_dict(dict(params, **state), strict=False)  # num_batches_tracked is not in the dump
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.momentum, m.eps = meta["momentum"], meta["eps"]
    return net.to(dtype)


def bias_term_sizes(rec):
    """{conv name: the largest over channels of sum |dL/d(output)|}: the size of the terms its bias gradient sums."""
    return {name: sum(o.grad.abs().sum(dim=(0, 2, 3)) for o in outs).max().item()
            for name, outs in rec.conv_out.items()}


# --------------------------------------------------------------------------
# ReLU ties
# --------------------------------------------------------------------------

def find_ties(rec32, rec64):
    """Every ReLU input closer to 0 than TIE_MARGIN times that call's RMS float32 rounding error.

    The rounding error is measured: the float32 step's ReLU input minus the
    float64 step's.  Another float32 program rounds differently, and may see
    such an input on the other side of 0.  Returns the ties, one dict each,
    and per ReLU call (name, shard, ties, inputs, ties float32 PyTorch itself
    put on the other side from float64, margin) for the listing.
    """
    ties, summary = [], []
    for i, ((name, shard, x32, _), (_, _, x64, _)) in enumerate(zip(rec32.relus, rec64.relus)):
        x32, x64 = x32.detach().reshape(-1), x64.detach().reshape(-1)
        margin = TIE_MARGIN * (x32.double() - x64).pow(2).mean().sqrt().item()
        near = torch.nonzero(x64.abs() <= margin).reshape(-1)
        if near.numel():
            flipped = int(((x32[near] > 0) != (x64[near] > 0)).sum())
            summary.append((name, shard, near.numel(), x32.numel(), flipped, margin))
            for e in near.tolist():
                b, c, h, w = np.unravel_index(e, rec32.relus[i][2].shape)
                ties.append({"relu": i, "name": name, "at": e, "x": x32[e].item(),
                             "example": int(b) + rec32.offsets[shard], "channel": int(c), "row": int(h),
                             "column": int(w)})
    return ties, summary


def tie_effects(net, rec, ties):
    """For each tie: {gradient name: change} if PyTorch had put it on the other side of 0.

    Only that element's backward changes: a ReLU passes the incoming
    gradient g where its input is > 0 and cuts it elsewhere, so the flip adds
    (or removes) g at that one input.  The parameters' gradients then change
    by the backward pass of that one number, which autograd computes from the
    kept graph (no new forward pass).
    """
    names = [k for k, _ in net.named_parameters()]
    params = [p for _, p in net.named_parameters()]
    effects = []
    for tie in ties:
        _, _, x, y = rec.relus[tie["relu"]]
        g = y.grad.reshape(-1)[tie["at"]]
        delta = torch.zeros(x.numel(), dtype=x.dtype)
        delta[tie["at"]] = -g if tie["x"] > 0 else g  # passed -> now cut; cut -> now passed
        changes = torch.autograd.grad([x], params, grad_outputs=[delta.reshape(x.shape)],
                                      retain_graph=True, allow_unused=True)
        effects.append({k: (torch.zeros_like(p) if c is None else c) for k, p, c in zip(names, params, changes)})
    return effects


def explain_with_ties(errors, effects, tol):
    """Which ties, put on the other side, account for the gradient errors?

    errors: {name: (C++ - torch) / scale}, effects: per tie {name: change / scale}.
    First greedily, one tie at a time: a tie is taken when the remaining
    error holds its signature (projected on its effect: between half and one
    and a half times it) and taking it shrinks the error overall.  Then a
    check that keeps a real bug's error from being traded for ties (the
    greedy shrinks the total, and may do it by spreading the error to
    tensors that were right): a tensor that passed before may not end worse
    than max(its error before, tol/2); while one does, the tie whose removal
    helps most is put back.  Returns the ties taken and {name: the error left}.
    """
    keys = list(errors)
    sizes = [errors[k].numel() for k in keys]
    # A NaN or inf (a broken tensor) would poison every dot product: it fails on its own anyway.
    e = torch.nan_to_num(torch.cat([errors[k].reshape(-1) for k in keys]).double(), nan=0.0, posinf=0.0, neginf=0.0)
    C = torch.stack([torch.cat([x[k].reshape(-1) for k in keys]) for x in effects]).double()
    norms = (C * C).sum(dim=1)

    def worst_per_tensor(v):
        return torch.stack([part.abs().max() for part in v.split(sizes)])

    taken, r = [], e.clone()
    while True:
        dots = C @ r
        gain = 2 * dots - norms  # how much ||r||^2 shrinks when the tie is taken
        fit = dots / norms.clamp_min(1e-300)
        usable = (fit >= 0.5) & (fit <= 1.5) & (gain > 0)
        usable[taken] = False
        if not usable.any():
            break
        j = int(torch.where(usable, gain, torch.full_like(gain, -math.inf)).argmax())
        taken.append(j)
        r -= C[j]

    start = worst_per_tensor(e)
    limit = torch.where(start <= tol, start.clamp(min=tol / 2), torch.full_like(start, math.inf))

    def overshoot(v):
        return (worst_per_tensor(v) - limit).clamp(min=0).sum().item()

    while taken and overshoot(r) > 0:
        j = min(taken, key=lambda j: overshoot(r + C[j]))
        taken.remove(j)
        r += C[j]
    return taken, dict(zip(keys, (part.reshape(errors[k].shape) for k, part in zip(keys, r.split(sizes)))))


# --------------------------------------------------------------------------
# The comparison
# --------------------------------------------------------------------------

def compare(name, got, ref, f64, scale=None):
    """One row: the errors of got (C++) against ref (PyTorch float32), and both against f64.

    The relative error is the largest absolute error over the largest
    |reference| value (or over `scale` where the reference is itself noise):
    one number per tensor, insensitive to the entries that are near zero.
    """
    ref_max = scale if scale is not None else ref.abs().max().item()
    denom = ref_max if ref_max > 0 else 1.0
    diff = got - ref
    abs_err = diff.abs().max().item()
    row = {"name": name, "ref_max": ref_max, "denom": denom, "error": diff / denom,
           "abs_err": abs_err, "rel_err": abs_err / denom, "left": abs_err / denom,
           "got_vs_f64": None, "ref_vs_f64": None, "noise": scale is not None}
    if f64 is not None:
        row["got_vs_f64"] = (got.double() - f64).abs().max().item() / denom
        row["ref_vs_f64"] = (ref.double() - f64).abs().max().item() / denom
    return row


def passes(row, tol):
    return row["left"] <= tol  # False for NaN too


def print_rows(title, rows, tol, with_f64, with_ties):
    print(f"\n{title}")
    header = f"  {'tensor':<34} {'max|torch|':>10} {'abs err':>9} {'rel err':>9}"
    if with_ties:
        header += f" {'w/o ties':>9}"
    if with_f64:
        header += f"   {'C++:f64':>8} {'torch:f64':>9}"
    print(header)
    for r in rows:
        shown = r["name"].split("/")[-1]  # the section says which folder
        line = f"  {shown:<34} {r['ref_max']:>10.3e} {r['abs_err']:>9.2e} {r['rel_err']:>9.2e}"
        if with_ties:
            line += f" {r['left']:>9.2e}"
        if with_f64:
            line += f"   {r['got_vs_f64']:>8.1e} {r['ref_vs_f64']:>9.1e}"
        if r["noise"]:
            line += "  exact 0: bias before BN, vs sum|terms|"
        print(line + ("" if passes(r, tol) else "  <-- FAILS"))


def print_ties(summary, ties, taken, per_device):
    total = sum(t[2] for t in summary)
    print(f"\nReLU ties: {total} ReLU inputs within {TIE_MARGIN}x their layer's RMS float32 rounding error of 0"
          f" (float32 PyTorch itself put {sum(t[4] for t in summary)} on the other side of 0 from float64)")
    for name, shard, count, size, flipped, margin in summary:
        where = name + (f" (shard {shard})" if per_device else "")
        print(f"  {where:<40} {count:>4} of {size:>8}, |x| <= {margin:.1e}; {flipped} flipped by float32")
    if taken is None:
        return
    print(f"the C++ gradients say it put {len(taken)} of them on the other side of 0 from PyTorch"
          + (" (the 'w/o ties' column: the error left once their effect is taken out):" if taken else ""))
    for j in taken:
        t = ties[j]
        print(f"  {t['name']:<28} example {t['example']}, channel {t['channel']}, row {t['row']}, column"
              f" {t['column']}: PyTorch float32 x = {t['x']:+.2e}")


def main():
    args = parse_args()
    if not os.path.isdir(args.dump):
        refuse(f"{args.dump} is not a folder (write one with build/bin/09_resnet --dump-step DIR)")
    meta = read_meta(os.path.join(args.dump, "meta.txt"))
    n, k = meta["batch"], meta["devices"]
    per_device = meta["bn"] == "device" and k > 1

    template = resnet18(10, 1, meta["width"])
    stats = running_stat_names(template)
    param_shapes = {name: tuple(p.shape) for name, p in template.named_parameters()}
    stat_shapes = {name: tuple(template.state_dict()[name].shape) for name in stats}

    params = read_tensors(os.path.join(args.dump, "params"), param_shapes)
    state = read_tensors(os.path.join(args.dump, "state"), stat_shapes)
    X = read_raw(os.path.join(args.dump, "images.f32"), "<f4", (n, 1, 28, 28))
    y = read_raw(os.path.join(args.dump, "labels.i32"), "<i4", (n,)).long()
    if y.min() < 0 or y.max() > 9:
        refuse(f"{args.dump}/labels.i32: labels outside 0..9")
    got = {"logits": read_raw(os.path.join(args.dump, "logits.f32"), "<f4", (n, 10)),
           "loss": read_raw(os.path.join(args.dump, "loss.f32"), "<f4", (1,)),
           "eval_logits": read_raw(os.path.join(args.dump, "eval_logits.f32"), "<f4", (n, 10))}
    got.update({"state_after/" + k_: v for k_, v in
                read_tensors(os.path.join(args.dump, "state_after"), stat_shapes).items()})
    got.update({"grads/" + k_: v for k_, v in
                read_tensors(os.path.join(args.dump, "grads"), param_shapes).items()})

    bn_words = ("per device (each shard its own statistics, as nn.DataParallel)" if per_device
                else "synchronized (SyncBN: statistics of the whole batch)")
    print(f"crosscheck of {args.dump}: ResNet-18 width {meta['width']}, {k} device(s), batch {n}"
          f" = shards {','.join(map(str, meta['shards']))}, BatchNorm {bn_words}")
    print(f"reference: PyTorch {torch.__version__} in float32, as the C++ program computes"
          + ("" if args.no_float64 else "; f64 columns: distance from the float64 step, same scale as rel err"))
    print(f"rel err = max|C++ - torch| / max|torch|; passes when <= {args.tolerance:g}"
          + ("" if args.no_float64 else " (for gradients: once the ReLU ties are taken out)"))
    if meta.get("precision", "fp32") != "fp32":
        print(f"note: the dump was made on a GPU with --precision {meta['precision']}: its GEMMs read their inputs "
              "with 10-bit (tf32) or 7-bit (bf16) mantissas, so expect errors near 1e-3 (tf32) to 1e-2 (bf16) "
              "(try --tolerance 3e-2)")

    net32 = load_net(meta, params, state, torch.float32)
    ref, rec32 = reference_step(net32, X, y, meta)
    ref["eval_logits"] = evaluation_logits(meta, params, ref, stats, X, torch.float32)
    f64 = None
    if not args.no_float64:
        f64, rec64 = reference_step(load_net(meta, params, state, torch.float64), X.double(), y, meta)
        f64["eval_logits"] = evaluation_logits(meta, params, f64, stats, X.double(), torch.float64)
    term_sizes = bias_term_sizes(rec32)

    def row(name, scale=None):
        return compare(name, got[name].float(), ref[name], None if f64 is None else f64[name], scale)

    order = forward_order(template, X)
    batchnorms = [m for m in order if m + ".running_mean" in stat_shapes]
    forward_rows = [row(f"state_after/{bn}.{s}") for bn in batchnorms for s in ("running_mean", "running_var")]
    output_rows = [row("logits"), row("loss"), row("eval_logits")]
    backward_rows = []
    for layer in reversed(order):
        for p in ("weight", "bias"):
            name = f"{layer}.{p}"
            if name in param_shapes:
                backward_rows.append(row("grads/" + name, term_sizes.get(layer) if p == "bias" else None))
    listed = {r["name"] for r in forward_rows + output_rows + backward_rows}
    missed = sorted(set(got) - listed)
    assert not missed, f"tensors left out of the listing: {missed}"  # a net whose layers the hooks miss

    ties = taken = None
    forward_ok = all(passes(r, args.tolerance) for r in forward_rows + output_rows)
    if f64 is not None:
        ties, tie_summary = find_ties(rec32, rec64)
        # With a wrong forward pass every gradient is off anyway, and ties explain nothing.
        if forward_ok and 0 < len(ties) <= args.max_ties:
            by_name = {r["name"]: r for r in backward_rows}
            effects = [{"grads/" + k_: c / by_name["grads/" + k_]["denom"] for k_, c in e.items()}
                       for e in tie_effects(net32, rec32, ties)]
            taken, left = explain_with_ties({r["name"]: r["error"] for r in backward_rows}, effects,
                                             args.tolerance)
            for r in backward_rows:
                if math.isfinite(r["rel_err"]):
                    r["left"] = left[r["name"]].abs().max().item()

    with_f64 = f64 is not None
    print_rows("forward: BatchNorm running statistics after the step (state_after/)"
               + (", device 0's: shard 0's" if per_device else "") + ", in forward order",
               forward_rows, args.tolerance, with_f64, False)
    print_rows("forward: the output (logits, loss; eval_logits: the batch again in evaluation mode)",
               output_rows, args.tolerance, with_f64, False)
    if ties:
        print_ties(tie_summary, ties, taken, per_device)
        if not forward_ok:
            print("  not weighed: the forward pass already disagrees (fix that first)")
        elif taken is None:
            print(f"  too many to weigh one by one (more than --max-ties {args.max_ties}): gradients are"
                  " compared as they are and may fail from ties alone; a smaller dump"
                  " (--width 8 --batch-size 64) has fewer")
    print_rows("backward: gradients of the mean loss (grads/), in backward order: fc first",
               backward_rows, args.tolerance, with_f64, taken is not None)

    everything = forward_rows + output_rows + backward_rows
    bad = [r for r in everything if not passes(r, args.tolerance)]
    print()
    if not bad:
        worst = max(everything, key=lambda r: r["left"])
        print(f"summary: PASS: all {len(everything)} tensors within {args.tolerance:g}"
              f" (largest: {worst['name']}, {worst['left']:.2e}"
              + (f", after {len(taken)} ReLU ties)" if taken else ")"))
        return 0
    print(f"summary: FAIL: {len(bad)} of {len(everything)} tensors exceed {args.tolerance:g}")
    for title, rows in (("forward", forward_rows + output_rows), ("backward", backward_rows)):
        first = next((r for r in rows if not passes(r, args.tolerance)), None)
        if first is not None:
            print(f"  first to disagree in the {title} pass: {first['name']} ({first['left']:.2e})")
    print("  start with the first one: a forward error spoils every gradient, and a gradient"
          " error spoils those computed after it")
    print("  (a BatchNorm's running statistics come from its input: a bug inside one layer shows first"
          " in the statistics of the next BatchNorm)")
    if taken is None and forward_ok:
        print("  (the ReLU ties were not weighed: gradient errors of a few percent may be ties alone)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
