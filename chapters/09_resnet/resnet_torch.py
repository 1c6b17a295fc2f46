#!/usr/bin/python3
"""Chapter 09, PyTorch twin: d2l's ResNet-18 on Fashion-MNIST, data-parallel.

This is the reference the C++ program of this chapter is measured against.
It follows d2l section 13.6 ("Concise Implementation for Multiple GPUs"),
which, unlike 13.5 (chapter 01's twin), uses the framework on purpose:
the network is an nn.Module, the optimizer is torch.optim.SGD, and
nn.DataParallel spreads every minibatch over the GPUs.  So this file shows
what the framework hides, and the C++ program shows what it does:

  * nn.DataParallel, on every forward pass, copies the module to each GPU,
    cuts the batch into one shard per GPU, runs the shards side by side and
    gathers the logits on GPU 0; backward sums the replicas' gradients onto
    GPU 0's parameters.  That is data parallelism with a reduce instead of
    an all-reduce: only GPU 0 holds the parameters between steps.
  * BatchNorm is the interesting layer.  Under DataParallel each replica
    normalizes with its OWN shard's mean and variance, and only GPU 0's
    running statistics survive the step.  Synchronized BatchNorm (the C++
    program's --bn sync) computes the statistics over the whole batch
    instead, which is what one device with the whole batch would compute.

The network is exactly d2l's, with --width scaling its channels
(64 is d2l's: width, 2*width, 4*width, 8*width in the four stages).
Its parameter and buffer names (the state_dict keys, e.g.
"resnet_block2.0.conv3.weight") are the names the C++ program gives its
tensors, so crosscheck.py can compare the two tensor by tensor.

Run it with Debian's interpreter, which is where python3-torch lives:

    /usr/bin/python3 chapters/09_resnet/resnet_torch.py --width 16 --epochs 1 --limit-train 10000
"""

import argparse
import os
import sys
import time

# OpenMP threads that spin at their barriers starve each other on a machine with as many cores
# as threads: on 2 cores this network trained 5 times slower with torch's 2 threads spinning
# than waiting passively. The C++ programs wait passively too (common/openmp_waits.h); this
# must be set before torch starts its thread pool, that is, before the import.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F
from torch import nn

# The data loading and the command-line value types are chapter 01's twin's:
# import them from there rather than keep a second copy in step.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "01_lenet"))
from lenet_torch import (EVAL_BATCH, TEST_IMAGES, TEST_LABELS, TRAIN_IMAGES, TRAIN_LABELS,  # noqa: E402
                         add_precision_argument, check_precision, find_data_dir, load_split,
                         non_negative_int, positive_float, positive_int, seconds_per_epoch, use_precision,
                         add_run_name_argument, given_text, run_name, write_run_csv)

CHAPTER = "09_resnet_torch"


# --------------------------------------------------------------------------
# The model, exactly as in d2l 13.6 (7.6's Residual and ResNet)
# --------------------------------------------------------------------------

class Residual(nn.Module):
    """Two 3x3 convolutions with BatchNorm, plus a shortcut: relu(F(x) + x).

    When the block changes the shape (more channels, stride 2), x cannot be
    added as it is; conv3, a 1x1 convolution with the same stride, projects it.
    The submodules are registered in d2l's order (conv1, conv2, conv3, bn1,
    bn2) because that order is the order of the state_dict keys.
    """

    def __init__(self, input_channels, num_channels, use_1x1conv=False, strides=1):
        super().__init__()
        self.conv1 = nn.Conv2d(input_channels, num_channels, kernel_size=3, padding=1, stride=strides)
        self.conv2 = nn.Conv2d(num_channels, num_channels, kernel_size=3, padding=1)
        # A plain attribute when None: no parameters, no state_dict keys.
        self.conv3 = (nn.Conv2d(input_channels, num_channels, kernel_size=1, stride=strides)
                      if use_1x1conv else None)
        self.bn1 = nn.BatchNorm2d(num_channels)
        self.bn2 = nn.BatchNorm2d(num_channels)

    def forward(self, X):
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3 is not None:
            X = self.conv3(X)
        return F.relu(Y + X)


def resnet_block(input_channels, num_channels, num_residuals, first_block=False):
    """One stage: num_residuals blocks; all but the first stage halve the image side.

    The first stage follows a stem that keeps 28x28 and already has the
    stage's channel count, so its first block needs no projection.
    """
    blocks = []
    for i in range(num_residuals):
        if i == 0 and not first_block:
            blocks.append(Residual(input_channels, num_channels, use_1x1conv=True, strides=2))
        else:
            blocks.append(Residual(num_channels, num_channels))
    return nn.Sequential(*blocks)


def resnet18(num_classes=10, in_channels=1, width=64):
    """d2l 13.6's ResNet-18 for 28x28 images: a 3x3 stem without max-pooling.

    Image side per stage: 28, 14, 7, 4; channels: w, 2w, 4w, 8w.  The
    "18" counts the weighted layers: the stem, 4 stages x 2 blocks x 2
    convolutions, and fc (the 1x1 projections are not counted).
    """
    w = width
    net = nn.Sequential(
        nn.Conv2d(in_channels, w, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(w),
        nn.ReLU())
    net.add_module("resnet_block1", resnet_block(w, w, 2, first_block=True))
    net.add_module("resnet_block2", resnet_block(w, 2 * w, 2))
    net.add_module("resnet_block3", resnet_block(2 * w, 4 * w, 2))
    net.add_module("resnet_block4", resnet_block(4 * w, 8 * w, 2))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(8 * w, num_classes)))
    return net


def init_weights(module):
    """d2l's init: weights ~ N(0, 0.01^2) for every convolution and dense layer.

    Biases keep PyTorch's default (uniform in +-1/sqrt(fan_in)), as in d2l;
    BatchNorm starts as the identity (gamma 1, beta 0), PyTorch's default.
    """
    if type(module) in (nn.Linear, nn.Conv2d):
        nn.init.normal_(module.weight, std=0.01)


def build_net(width, seed):
    """The initialised network, on the CPU.

    Drawn on the CPU from a freshly seeded global generator, so a run on a
    GPU starts from the very same numbers as a run on the CPU.
    """
    torch.manual_seed(seed)
    net = resnet18(10, 1, width)
    net.apply(init_weights)
    return net


def count_parameters(net):
    return sum(p.numel() for p in net.parameters())


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def parse_args():
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    p = argparse.ArgumentParser(
        description="d2l's ResNet-18 on Fashion-MNIST in PyTorch, nn.DataParallel over k GPUs "
                    "(twin of the C++ chapter 09).")
    p.add_argument("--epochs", type=positive_int, default=10, help="passes over the training set (default 10)")
    p.add_argument("--batch-size", type=positive_int, default=256,
                   help="training minibatch size, over all devices together (default 256)")
    p.add_argument("--lr", type=positive_float, default=0.1,
                   help="SGD learning rate (default 0.1, d2l's one-GPU recipe)")
    p.add_argument("--devices", type=positive_int, default=1,
                   help="GPUs for nn.DataParallel (default 1; the CPU runs only 1)")
    p.add_argument("--width", type=positive_int, default=64,
                   help="channels of the first stage (default 64, d2l's); the others have 2x, 4x, 8x")
    p.add_argument("--data-dir", type=given_text, default=None,
                   help="directory holding the four Fashion-MNIST .gz files "
                        "(default: $FASHION_MNIST_DIR, data/fashion-mnist/, /usr/share/datasets/fashion-mnist/)")
    p.add_argument("--limit-train", type=non_negative_int, default=0,
                   help="use only the first N training images (0 = all)")
    p.add_argument("--seed", type=int, default=42, help="seed for initialisation and shuffling (default 42)")
    p.add_argument("--threads", type=positive_int, default=os.cpu_count() or 1,
                   help="CPU threads for torch (default: all cores, as chapter 01's twin)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=default_device,
                   help=f"where to train (default here: {default_device})")
    add_precision_argument(p)
    p.add_argument("--out", type=given_text, default="results", help="directory for the CSV (default results/)")
    add_run_name_argument(p)
    args = p.parse_args()
    args.run = run_name(p, args, CHAPTER)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda was requested but this torch sees no CUDA device")
    check_precision(p, args.precision, args.device)
    args.backend = args.device
    if args.backend == "cpu" and args.devices != 1:
        p.error(f"--devices {args.devices} needs {args.devices} CUDA GPUs and --device cuda "
                "(on the CPU only --devices 1 runs)")
    if args.backend == "cuda" and args.devices > torch.cuda.device_count():
        p.error(f"--devices {args.devices}: this torch sees only {torch.cuda.device_count()} CUDA GPU(s)")
    if args.precision == "bf16" and args.devices > 1:
        # nn.DataParallel runs each replica in a thread of its own, and autocast's setting is the
        # thread's: not every PyTorch carries its dtype (bf16) over to the replicas.
        p.error("--precision bf16 runs on one device only (--devices 1)")
    return args


# --------------------------------------------------------------------------
# Training, as d2l 13.6's train()
# --------------------------------------------------------------------------

def evaluate(net, X, y, precision_context):
    """Test accuracy in eval mode: BatchNorm uses its running statistics."""
    net.eval()
    correct = torch.zeros((), dtype=torch.int64, device=X.device)
    with torch.no_grad(), precision_context():
        for i in range(0, X.shape[0], EVAL_BATCH):
            logits = net(X[i:i + EVAL_BATCH])
            correct += (logits.argmax(dim=1) == y[i:i + EVAL_BATCH]).sum()
    return correct.item() / X.shape[0]


def peak_mib(backend, devices):
    """The most memory tensors held at once on one GPU since the training began (PyTorch's
    max_memory_allocated: tensors' bytes, as 09_resnet's peak_mib counts its buffers), in MiB;
    "none" on a CPU."""
    if backend != "cuda":
        return "none"
    return f"{max(torch.cuda.max_memory_allocated(d) for d in devices) / 2**20:.1f}"


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    precision_context = use_precision(args.precision, args.backend)

    data_dir = find_data_dir(args.data_dir)
    X_train, y_train = load_split(data_dir, TRAIN_IMAGES, TRAIN_LABELS)
    X_test, y_test = load_split(data_dir, TEST_IMAGES, TEST_LABELS)
    if args.limit_train:
        X_train, y_train = X_train[:args.limit_train], y_train[:args.limit_train]
    n_train = X_train.shape[0]

    net = build_net(args.width, args.seed)
    n_params = count_parameters(net)
    print(f"ResNet-18 at width {args.width}: {n_params:,} parameters in "
          f"{sum(1 for _ in net.parameters())} tensors", flush=True)

    if args.backend == "cuda":
        devices = [torch.device(f"cuda:{i}") for i in range(args.devices)]
        net = net.to(devices[0])
        if args.precision == "bf16":
            # Tensor cores read 16-bit convolutions fastest with the channels innermost (NHWC);
            # the layout PyTorch's mixed-precision guides pair with autocast.
            net = net.to(memory_format=torch.channels_last)
        # As d2l does, even for one GPU.  The module's parameters live on
        # GPU 0; DataParallel copies them to the others on every step.
        net = nn.DataParallel(net, device_ids=devices)
    else:
        devices = [torch.device("cpu")]
    print(f"backend {args.backend}, {args.devices} device(s), precision {args.precision}, "
          f"{torch.get_num_threads()} CPU thread(s), {n_train} training images", flush=True)

    # The data set is small, so it goes to GPU 0 once: batches are then index
    # selections, with no host-to-device copies inside the timed loop.
    # DataParallel scatters each batch from there.
    X_train, y_train = X_train.to(devices[0]), y_train.to(devices[0])
    X_test, y_test = X_test.to(devices[0]), y_test.to(devices[0])

    trainer = torch.optim.SGD(net.parameters(), lr=args.lr)
    loss = nn.CrossEntropyLoss()  # the mean over the batch, as d2l 13.6 (13.5 summed)
    # One fresh permutation per epoch from a separate generator, like
    # DataLoader(shuffle=True, generator=g): reproducible from --seed.
    shuffle_gen = torch.Generator().manual_seed(args.seed)

    rows = []
    epoch_times = []
    digits = len(str(args.epochs))

    if args.backend == "cuda":  # peak memory from here on: what is held now (model, data) and all allocated after
        for d in devices:
            torch.cuda.reset_peak_memory_stats(d)
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(n_train, generator=shuffle_gen).to(devices[0])
        # Running sums stay on the device: an .item() per batch would force
        # a GPU sync per step and distort the timing.
        loss_sum = torch.zeros((), device=devices[0])
        correct = torch.zeros((), dtype=torch.int64, device=devices[0])

        net.train()  # BatchNorm normalizes with the batch's (each shard's) statistics
        start = time.perf_counter()
        for i in range(0, n_train, args.batch_size):
            idx = order[i:i + args.batch_size]  # the last batch may be shorter
            X, y = X_train[idx], y_train[idx]
            trainer.zero_grad()
            with precision_context():  # the forward pass and the loss; backward follows its types
                logits = net(X)
                l = loss(logits, y)
            l.backward()
            trainer.step()
            loss_sum += l.detach() * X.shape[0]
            correct += (logits.detach().argmax(dim=1) == y).sum()
        if args.backend == "cuda":
            for d in devices:  # GPU work is asynchronous: wait for all of it before stopping the clock
                torch.cuda.synchronize(d)
        seconds = time.perf_counter() - start
        epoch_times.append(seconds)

        train_loss = loss_sum.item() / n_train
        train_acc = correct.item() / n_train
        test_acc = evaluate(net, X_test, y_test, precision_context)
        rows.append((epoch, train_loss, train_acc, test_acc, seconds))
        print(f"epoch {epoch:>{digits}}/{args.epochs}  loss {train_loss:.4f}  train_acc {train_acc:.4f}"
              f"  test_acc {test_acc:.4f}  sec {seconds:.2f}", flush=True)

    write_run_csv(args.out, args.run, rows)

    sec_per_epoch = seconds_per_epoch(epoch_times)
    samples_per_sec = round(n_train / sec_per_epoch)
    print(f"result: chapter={CHAPTER} backend=torch-{args.backend} devices={args.devices} epochs={args.epochs}"
          f" batch={args.batch_size} lr={args.lr:g} width={args.width} precision={args.precision}"
          f" test_acc={rows[-1][3]:.4f}"
          f" sec_per_epoch={sec_per_epoch:.3f} samples_per_sec={samples_per_sec}"
          f" first_epoch_sec={epoch_times[0]:.3f} peak_mib={peak_mib(args.backend, devices)}", flush=True)


if __name__ == "__main__":
    main()
