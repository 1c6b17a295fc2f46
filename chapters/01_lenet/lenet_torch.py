#!/usr/bin/python3
"""Chapter 01, PyTorch twin: the scratch LeNet of d2l's "Training on Multiple GPUs".

This script is the reference the C++ program of this chapter is measured
against.  It follows d2l section 13.5 line by line for ONE device: the
parameters are plain tensors, the network is a function, and SGD is written
out by hand.  Nothing here uses torch.nn.Module, torchvision or the d2l
package, so every step that the C++ version has to implement is visible.

Run it with Debian's interpreter, which is where python3-torch lives:

    /usr/bin/python3 chapters/01_lenet/lenet_torch.py --epochs 2 --limit-train 10000
"""

import argparse
import contextlib
import csv
import gzip
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

CHAPTER = "01_lenet_torch"
TRAIN_IMAGES = "train-images-idx3-ubyte.gz"
TRAIN_LABELS = "train-labels-idx1-ubyte.gz"
TEST_IMAGES = "t10k-images-idx3-ubyte.gz"
TEST_LABELS = "t10k-labels-idx1-ubyte.gz"
EVAL_BATCH = 256

# chapters/01_lenet/lenet_torch.py -> the repository root is two levels up.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def non_negative_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    # float() happily parses "nan" and "inf"; neither is a usable learning rate.
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def given_text(text):
    """A folder's or a name's value: not empty ("--out=" or --out "" would write into nothing), as
    the C++ programs' mgpu::text and file_name_part refuse it."""
    if not text:
        raise argparse.ArgumentTypeError("expected a value, got an empty one")
    return text


# The arguments that change neither what a run computes nor what it measures, and so stay out of
# its name: where the data is read and where the files go (as in the C++ programs' run names).
NOT_IN_RUN_NAME = ("data_dir", "out", "run_name")


def add_run_name_argument(p):
    p.add_argument("--run-name", type=given_text, default=None,
                   help="name of the CSV (default: the program's name, then each setting that is "
                        "not its default, as the C++ programs name their runs)")
    return p


def run_name(p, args, program, not_in_name=()):
    """The name of the run's CSV: --run-name when given; else `program`, then "_<flag>-<value>" for
    every argument that is not at its default, in the order --help lists them (a character other
    than a letter, digit, '.' or '-' becomes 'x'). The same settings give the same name, as in
    the C++ programs (common/report.h): 01_lenet_torch, 01_lenet_torch_epochs-2_limit-train-10000.
    Call it on the parser's own result, before anything else is added to `args`."""
    if args.run_name:
        return args.run_name
    name = program
    for dest, value in vars(args).items():  # argparse sets them in the order they were added
        if dest in NOT_IN_RUN_NAME or dest in not_in_name or value == p.get_default(dest):
            continue
        text = "".join(c if c.isalnum() or c in ".-" else "x" for c in str(value))
        name += f"_{dest.replace('_', '-')}-{text}"
    return name


def write_run_csv(out, run, rows):
    """<out>/<run>.csv, saying so. A file of the same name (the same settings, unless --run-name
    gave both runs one name) is replaced, after a line that says it is: the twins keep no JSON of
    their settings to tell the two apart, as the C++ programs do."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{run}.csv")
    if os.path.exists(path):
        print(f"replacing {path}: an earlier run of the same name", flush=True)
    write_csv(path, rows)
    print(f"wrote {path}", flush=True)
    return path


def parse_args():
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    p = argparse.ArgumentParser(
        description="Scratch LeNet on Fashion-MNIST in PyTorch (twin of the C++ chapter 01).")
    p.add_argument("--epochs", type=positive_int, default=10, help="passes over the training set (default 10)")
    p.add_argument("--batch-size", type=positive_int, default=256, help="training minibatch size (default 256)")
    p.add_argument("--lr", type=positive_float, default=0.2, help="SGD learning rate (default 0.2)")
    p.add_argument("--data-dir", type=given_text, default=None,
                   help="directory holding the four Fashion-MNIST .gz files "
                        "(default: $FASHION_MNIST_DIR, data/fashion-mnist/, /usr/share/datasets/fashion-mnist/)")
    p.add_argument("--limit-train", type=non_negative_int, default=0,
                   help="use only the first N training images (0 = all)")
    p.add_argument("--seed", type=int, default=42, help="seed for initialisation and shuffling (default 42)")
    p.add_argument("--threads", type=positive_int, default=os.cpu_count() or 1,
                   help="CPU threads for torch (default: all cores)")
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
    return args


# --------------------------------------------------------------------------
# Precision: what the C++ programs' --precision means, in PyTorch's switches
# --------------------------------------------------------------------------

PRECISIONS = ("fp32", "tf32", "bf16")


def add_precision_argument(p):
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="fp32 (default): every product in fp32, TF32 off; tf32: TF32 tensor cores in "
                        "matmuls and convolutions (CUDA only); bf16: autocast to bfloat16")
    return p


def check_precision(p, precision, device):
    if precision == "tf32" and device != "cuda":
        p.error("--precision tf32 is a format of NVIDIA's tensor cores: it needs --device cuda")


def use_precision(precision, device_type):
    """Sets PyTorch's switches for `precision` and returns a function that makes the context
    the forward pass runs in.

    fp32  TF32 off in cuBLAS's matmuls and in cuDNN's convolutions. PyTorch's default lets
          cuDNN's convolutions read their fp32 inputs as TF32 on Ampere and newer GPUs, which
          the C++ programs' fp32 never does: without this the comparison is not like for like.
    tf32  TF32 on in both (the C++ --precision tf32 reads every GEMM's inputs as TF32).
    bf16  torch.autocast to bfloat16: convolutions and matmuls take bf16 inputs and accumulate
          in fp32, the weights stay fp32 (as the C++ --precision bf16).
    On the CPU nothing is switched: fp32 there is what it always was.
    """
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
    if precision == "bf16":
        return lambda: torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext


# --------------------------------------------------------------------------
# Data: Fashion-MNIST straight from the IDX files
# --------------------------------------------------------------------------

def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def find_data_dir(explicit):
    """Pick the dataset directory as the C++ programs do (common/fashion_mnist.h): --data-dir,
    else $FASHION_MNIST_DIR when set (either used as named or refused, never passed over), else
    the first known place that has the files."""
    if explicit is not None:
        return explicit
    chosen = os.environ.get("FASHION_MNIST_DIR")
    if chosen:
        if not os.path.isdir(chosen):
            fail(f"FASHION_MNIST_DIR={chosen}: no such directory")
        return chosen
    candidates = []
    candidates.append(os.path.join(REPO_ROOT, "data", "fashion-mnist"))
    candidates.append("/usr/share/datasets/fashion-mnist")
    for d in candidates:
        if os.path.isfile(os.path.join(d, TRAIN_IMAGES)):
            return d
    fail(f"Fashion-MNIST not found; looked for {TRAIN_IMAGES} in: " + ", ".join(candidates)
         + " (use --data-dir DIR)")


def read_idx(path, magic, header_words):
    """Return (header fields, payload bytes) of one gzip'd IDX file, or exit with a message.

    An IDX file starts with big-endian 32-bit words: the magic number
    (2051 = unsigned-byte 3-D array for images, 2049 = 1-D for labels),
    then one size per dimension.  The raw bytes follow.
    """
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:  # missing file, not gzip, truncated stream
        fail(f"cannot read {path}: {e}")
    header_size = 4 * (1 + header_words)
    if len(raw) < header_size:
        fail(f"{path} is too short to be an IDX file")
    fields = struct.unpack(f">{1 + header_words}I", raw[:header_size])
    if fields[0] != magic:
        fail(f"{path}: magic number {fields[0]}, expected {magic}")
    payload = raw[header_size:]
    expected = int(np.prod(fields[1:]))
    if len(payload) != expected:
        fail(f"{path}: header promises {expected} bytes of data, file holds {len(payload)}")
    return fields[1:], payload


def load_split(data_dir, images_name, labels_name):
    images_path = os.path.join(data_dir, images_name)
    labels_path = os.path.join(data_dir, labels_name)
    (n, rows, cols), pixels = read_idx(images_path, 2051, 3)
    (n_labels,), labels = read_idx(labels_path, 2049, 1)
    if (rows, cols) != (28, 28):
        fail(f"{images_path}: images are {rows}x{cols}, expected 28x28")
    if n_labels != n:
        fail(f"{labels_path}: {n_labels} labels for {n} images in {images_path}")
    y = np.frombuffer(labels, dtype=np.uint8)
    if y.max(initial=0) > 9:
        fail(f"{labels_path}: label {y.max()} is outside 0..9")
    # Bytes 0..255 -> float32 in [0, 1], laid out as (N, channels=1, H, W).
    X = np.frombuffer(pixels, dtype=np.uint8).reshape(n, 1, rows, cols).astype(np.float32) / 255.0
    return torch.from_numpy(X), torch.from_numpy(y.astype(np.int64))


# --------------------------------------------------------------------------
# The model, exactly as in d2l 13.5
# --------------------------------------------------------------------------

def init_params(device):
    """Weights ~ N(0, 0.01^2), biases zero.

    The numbers are drawn on the CPU (from the global generator, seeded in
    main) and only then moved, so --device cpu and --device cuda start from
    the very same parameters.
    """
    scale = 0.01
    shapes = [
        ((20, 1, 3, 3), (20,)),     # conv 1: 1 -> 20 channels, 3x3 kernel
        ((50, 20, 5, 5), (50,)),    # conv 2: 20 -> 50 channels, 5x5 kernel
        ((800, 128), (128,)),       # dense 1: 50*4*4 = 800 -> 128
        ((128, 10), (10,)),         # dense 2: 128 -> 10 classes
    ]
    params = []
    for w_shape, b_shape in shapes:
        params.append(torch.randn(w_shape) * scale)
        params.append(torch.zeros(b_shape))
    return [p.to(device).requires_grad_() for p in params]


def lenet(X, params):
    W1, b1, W2, b2, W3, b3, W4, b4 = params
    h = F.avg_pool2d(F.relu(F.conv2d(X, W1, b1)), kernel_size=2, stride=2)  # (B,20,13,13)
    h = F.avg_pool2d(F.relu(F.conv2d(h, W2, b2)), kernel_size=2, stride=2)  # (B,50,4,4)
    h = h.reshape(h.shape[0], -1)                                           # (B,800)
    h = F.relu(torch.mm(h, W3) + b3)                                        # (B,128)
    return torch.mm(h, W4) + b4                                             # (B,10) logits


# reduction='none' gives one loss per example; we sum them ourselves so that
# the SGD step below can divide by the batch size, as d2l does.
loss_fn = nn.CrossEntropyLoss(reduction="none")


def sgd(params, lr, batch_size):
    with torch.no_grad():  # the update itself must not be recorded by autograd
        for p in params:
            p -= lr * p.grad / batch_size
            p.grad.zero_()  # PyTorch accumulates gradients unless we clear them


def evaluate(params, X, y, precision_context=contextlib.nullcontext):
    correct = torch.zeros((), dtype=torch.int64, device=X.device)
    with torch.no_grad(), precision_context():
        for i in range(0, X.shape[0], EVAL_BATCH):
            logits = lenet(X[i:i + EVAL_BATCH], params)
            correct += (logits.argmax(dim=1) == y[i:i + EVAL_BATCH]).sum()
    return correct.item() / X.shape[0]


# --------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------

def write_csv(path, rows):
    """One row per epoch, (epoch, train_loss, train_acc, test_acc, seconds), as the C++ programs write it."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["epoch", "train_loss", "train_acc", "test_acc", "seconds"])
        for epoch, train_loss, train_acc, test_acc, seconds in rows:
            w.writerow([epoch, f"{train_loss:.6f}", f"{train_acc:.6f}", f"{test_acc:.6f}", f"{seconds:.4f}"])


def seconds_per_epoch(epoch_times):
    """As the C++ programs do: the first epoch pays one-time set-up, so with more than one epoch
    the mean of the others."""
    timed = epoch_times[1:] if len(epoch_times) > 1 else epoch_times
    return sum(timed) / len(timed)


def peak_mib(device):
    """The most memory tensors held at once on the GPU since the training began (PyTorch's
    max_memory_allocated: tensors' bytes, as 01_lenet's peak_mib counts its buffers), in MiB;
    "none" on a CPU."""
    if device.type != "cuda":
        return "none"
    return f"{torch.cuda.max_memory_allocated(device) / 2**20:.1f}"


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    precision_context = use_precision(args.precision, device.type)

    data_dir = find_data_dir(args.data_dir)
    X_train, y_train = load_split(data_dir, TRAIN_IMAGES, TRAIN_LABELS)
    X_test, y_test = load_split(data_dir, TEST_IMAGES, TEST_LABELS)
    if args.limit_train:
        X_train, y_train = X_train[:args.limit_train], y_train[:args.limit_train]
    n_train = X_train.shape[0]

    # The whole data set is small (~200 MB as float32), so it is moved to the
    # device once; batches are then just index selections, with no copies
    # from host memory inside the timed loop.
    X_train, y_train = X_train.to(device), y_train.to(device)
    X_test, y_test = X_test.to(device), y_test.to(device)

    params = init_params(device)
    # A separate generator for shuffling, like DataLoader(shuffle=True,
    # generator=g): one fresh permutation per epoch, reproducible from --seed.
    shuffle_gen = torch.Generator().manual_seed(args.seed)

    rows = []
    epoch_times = []
    width = len(str(args.epochs))

    if device.type == "cuda":  # peak memory from here on: what is held now (model, data) and all allocated after
        torch.cuda.reset_peak_memory_stats(device)
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(n_train, generator=shuffle_gen).to(device)
        # Running sums stay on the device: calling .item() every batch would
        # force a GPU sync per step and distort the timing.
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), dtype=torch.int64, device=device)

        start = time.perf_counter()
        for i in range(0, n_train, args.batch_size):
            idx = order[i:i + args.batch_size]  # the last batch may be shorter
            X, y = X_train[idx], y_train[idx]
            with precision_context():  # the forward pass and the loss; backward follows its types
                logits = lenet(X, params)
                l = loss_fn(logits, y).sum()
            l.backward()
            sgd(params, args.lr, X.shape[0])
            loss_sum += l.detach()
            correct += (logits.detach().argmax(dim=1) == y).sum()
        if device.type == "cuda":
            torch.cuda.synchronize()  # GPU work is asynchronous; wait before stopping the clock
        seconds = time.perf_counter() - start
        epoch_times.append(seconds)

        train_loss = loss_sum.item() / n_train
        train_acc = correct.item() / n_train
        test_acc = evaluate(params, X_test, y_test, precision_context)
        rows.append((epoch, train_loss, train_acc, test_acc, seconds))
        print(f"epoch {epoch:>{width}}/{args.epochs}  loss {train_loss:.4f}  train_acc {train_acc:.4f}"
              f"  test_acc {test_acc:.4f}  sec {seconds:.2f}", flush=True)

    write_run_csv(args.out, args.run, rows)
    sec_per_epoch = seconds_per_epoch(epoch_times)
    samples_per_sec = round(n_train / sec_per_epoch)
    print(f"result: chapter={CHAPTER} backend=torch-{device.type} devices=1 epochs={args.epochs}"
          f" batch={args.batch_size} lr={args.lr:g} precision={args.precision} test_acc={rows[-1][3]:.4f}"
          f" sec_per_epoch={sec_per_epoch:.2f} samples_per_sec={samples_per_sec}"
          f" first_epoch_sec={epoch_times[0]:.2f} peak_mib={peak_mib(device)}", flush=True)


if __name__ == "__main__":
    main()
