#!/usr/bin/python3
"""Chapters 02 and 05, PyTorch twin: d2l 13.5's data-parallel LeNet, written with DDP.

d2l 13.5 spreads LeNet over k GPUs from one Python process with hand-written
get_params, allreduce, split_batch and train_batch; chapter 02 does the same
in C++.  PyTorch users today write that program differently, and this file
is that program:

  * one process per device, started K times by a launcher (torchrun on one
    machine; torchrun, mpirun or srun across machines), each told its rank
    by the environment;
  * torch.distributed's process group: gloo on CPUs, NCCL on GPUs;
  * DistributedDataParallel (DDP) around an ordinary nn.Module: its
    constructor broadcasts rank 0's parameters, and backward averages the
    gradients over the ranks, bucket by bucket, while it still runs;
  * DistributedSampler: each rank trains on its own share of every epoch.

One script serves both chapters, because DDP IS one process per device:
chapter 02 launches it with torchrun on one machine, chapter 05 with
mpirun or srun, exactly as its C++ program is launched.  --chapter only
names the run (the CSV and the result line) after the chapter it is
compared with.

    torchrun --nproc_per_node=2 chapters/02_data_parallel/ddp_torch.py --epochs 2 --limit-train 10000
    mpirun -np 2 /usr/bin/python3 chapters/02_data_parallel/ddp_torch.py --chapter 05_multi_process
    /usr/bin/python3 chapters/02_data_parallel/ddp_torch.py            # no launcher: a world of one

(torchrun is `python3 -m torch.distributed.run`; Debian's python3-torch
installs it as /usr/bin/torchrun.  On Debian 12 it needs two more flags,
which chapters/02_data_parallel/torchrun_local.sh adds and explains.)  The model, its initial weights, the data
and the flags are chapter 01's twin's; the global batch (--batch-size, cut
over the processes) and the learning rate are chapter 02's.
"""

import argparse
import datetime
import os
import socket
import sys
import time
from dataclasses import dataclass

# OpenMP threads that spin at their barriers starve each other on a machine with as many cores
# as threads (chapter 09's twin measured it); must be set before torch starts its thread pool.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

# The data loading, d2l's initial weights and the command-line value types are chapter 01's
# twin's: import them from there rather than keep a second copy in step.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "01_lenet"))
from lenet_torch import (EVAL_BATCH, TEST_IMAGES, TEST_LABELS, TRAIN_IMAGES, TRAIN_LABELS,  # noqa: E402
                         add_run_name_argument, find_data_dir, given_text, init_params, load_split,
                         non_negative_int, positive_float, positive_int, run_name, seconds_per_epoch,
                         use_precision, write_run_csv)

CHAPTERS = ("02_data_parallel", "05_multi_process")


# --------------------------------------------------------------------------
# Who am I? The launcher says so in the environment
# --------------------------------------------------------------------------

@dataclass
class World:
    rank: int        # 0..size-1
    size: int        # K, the number of processes
    local_rank: int  # the number on this machine: picks the GPU
    local_size: int  # processes on this machine; 0 where the launcher does not say
    launcher: str    # who started us: torchrun, mpirun, srun or none


def env_int(name):
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        fail(f"the launcher set {name}={value!r}, which is not a whole number")


def find_world():
    """Reads the rank and the world size from whichever launcher started this process.

    torchrun sets RANK, WORLD_SIZE, LOCAL_RANK (and MASTER_ADDR, MASTER_PORT: where rank 0's
    key-value store listens). Open MPI's mpirun sets OMPI_COMM_WORLD_*, SLURM's srun SLURM_*:
    the same three facts under other names (chapter 05's README has the table). Nothing set:
    the script was started directly, a world of one, as chapter 05's program is without mpirun.
    """
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return World(env_int("RANK"), env_int("WORLD_SIZE"), env_int("LOCAL_RANK") if "LOCAL_RANK" in env else 0,
                     env_int("LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else 0, "torchrun")
    if "OMPI_COMM_WORLD_RANK" in env:
        return World(env_int("OMPI_COMM_WORLD_RANK"), env_int("OMPI_COMM_WORLD_SIZE"),
                     env_int("OMPI_COMM_WORLD_LOCAL_RANK"), env_int("OMPI_COMM_WORLD_LOCAL_SIZE"), "mpirun")
    # Not SLURM_NTASKS: that is the job's count, also set in a batch script's own environment,
    # where the script is one process. SLURM_STEP_NUM_TASKS counts the tasks of this srun step.
    if "SLURM_PROCID" in env and "SLURM_STEP_NUM_TASKS" in env:
        return World(env_int("SLURM_PROCID"), env_int("SLURM_STEP_NUM_TASKS"), env_int("SLURM_LOCALID"), 0, "srun")
    return World(0, 1, 0, 1, "none")


def all_on_this_machine(world):
    if world.local_size:
        return world.local_size == world.size
    return os.environ.get("SLURM_STEP_NUM_NODES") == "1"


def join_process_group(world, backend):
    """Every rank meets the others through rank 0's TCP key-value store (the env:// rendezvous).

    torchrun sets MASTER_ADDR and MASTER_PORT itself. Under mpirun or srun they are ours to give:
    where every rank runs on this machine, 127.0.0.1 and torch's usual port 29500 serve (give
    another MASTER_PORT to run two jobs at once); across machines, MASTER_ADDR must name rank 0's.
    This is chapter 05's NCCL bootstrap, with a TCP store where the C++ program has MPI_Bcast.
    """
    if world.launcher == "none":
        # A world of one needs no rendezvous: an in-process store.
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        return
    if "MASTER_ADDR" not in os.environ:
        if not all_on_this_machine(world):
            fail(f"{world.launcher} started ranks on several machines: set MASTER_ADDR to rank 0's host name "
                 "(under SLURM: MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1))")
        os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ.setdefault("MASTER_PORT", "29500")
    # A rank that never arrives (a typo in -np, a crashed host) stops the others after this long.
    dist.init_process_group(backend, init_method="env://", rank=world.rank, world_size=world.size,
                            timeout=datetime.timedelta(minutes=5))


# --------------------------------------------------------------------------
# Command line: chapter 01's twin's flags, plus --devices and --chapter
# --------------------------------------------------------------------------

def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def default_threads(world):
    """CPU threads for this process: what OMP_NUM_THREADS says (torchrun sets 1 when it starts
    more than one process), else the cores this process may run on, shared with the other
    ranks of this machine unless the launcher pinned each rank to cores of its own (Open MPI
    does for 1 or 2 ranks, srun with task/affinity always), as chapter 05's program does."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        return int(os.environ["OMP_NUM_THREADS"])
    mine = len(os.sched_getaffinity(0))
    if mine < (os.cpu_count() or mine):
        return mine
    return max(1, mine // max(1, world.local_size))


def parse_args(world):
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    p = argparse.ArgumentParser(
        description="d2l's LeNet on Fashion-MNIST with DistributedDataParallel, one process per device "
                    "(PyTorch twin of the C++ chapters 02 and 05). Start it with a launcher: "
                    "torchrun --nproc_per_node=K, mpirun -np K or srun -n K.")
    p.add_argument("--epochs", type=positive_int, default=10, help="passes over the training set (default 10)")
    p.add_argument("--batch-size", type=positive_int, default=256,
                   help="the global batch, cut evenly over the processes (default 256)")
    p.add_argument("--lr", type=positive_float, default=0.2, help="SGD learning rate (default 0.2)")
    p.add_argument("--devices", type=positive_int, default=None,
                   help="must equal the number of processes the launcher started, if given")
    p.add_argument("--data-dir", type=given_text, default=None,
                   help="directory holding the four Fashion-MNIST .gz files "
                        "(default: $FASHION_MNIST_DIR, data/fashion-mnist/, /usr/share/datasets/fashion-mnist/)")
    p.add_argument("--limit-train", type=non_negative_int, default=0,
                   help="use only the first N training images (0 = all)")
    p.add_argument("--seed", type=int, default=42, help="seed for initialisation and shuffling (default 42)")
    p.add_argument("--threads", type=positive_int, default=default_threads(world),
                   help="CPU threads per process (default here: %(default)s)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=default_device,
                   help=f"where to train (default here: {default_device}); cuda: the GPU of the local rank")
    p.add_argument("--chapter", choices=CHAPTERS, default=CHAPTERS[0],
                   help="the C++ chapter this run is compared with: names the CSV (<chapter>_torch..., "
                        "as --run-name says) and the result line (default %(default)s)")
    p.add_argument("--out", type=given_text, default="results", help="directory for the CSV (default results/)")
    add_run_name_argument(p)
    args = p.parse_args()
    # The number of processes is the launcher's, not an argument's: it goes into the name as
    # --devices would (05_multi_process_devices-2 in C++), whether or not --devices was given.
    args.run = run_name(p, args, f"{args.chapter}_torch", not_in_name=("chapter", "devices"))
    if not args.run_name and world.size > 1:
        args.run += f"_devices-{world.size}"
    if args.devices is not None and args.devices != world.size:
        started = (f"{world.launcher} started {world.size} process(es)" if world.launcher != "none"
                   else "no launcher started this process (a world of one)")
        p.error(f"--devices {args.devices}, but {started}: start {args.devices} "
                f"(torchrun --nproc_per_node={args.devices}, mpirun -np {args.devices})")
    if args.batch_size % world.size != 0:
        p.error(f"--batch-size {args.batch_size} does not split evenly over {world.size} processes: "
                "DDP averages the processes' gradients, which is the whole batch's mean only when every "
                "process has as many examples")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda was requested but this torch sees no CUDA device")
    return args


# --------------------------------------------------------------------------
# The model: d2l 13.5's LeNet as an nn.Module, from chapter 01's initial weights
# --------------------------------------------------------------------------

def lenet():
    """The same layers as chapter 01's twin's lenet(), which DDP needs as a module."""
    net = nn.Sequential(
        nn.Conv2d(1, 20, kernel_size=3), nn.ReLU(), nn.AvgPool2d(2, stride=2),   # (B,20,13,13)
        nn.Conv2d(20, 50, kernel_size=5), nn.ReLU(), nn.AvgPool2d(2, stride=2),  # (B,50,4,4)
        nn.Flatten(),                                                            # (B,800)
        nn.Linear(800, 128), nn.ReLU(),                                          # (B,128)
        nn.Linear(128, 10))                                                      # (B,10) logits
    # Chapter 01's twin's numbers: weights ~ N(0, 0.01^2) drawn in the same order, biases zero.
    # Its dense weights are (in, out) for X @ W; nn.Linear keeps (out, in): transposed here.
    W1, b1, W2, b2, W3, b3, W4, b4 = init_params("cpu")
    with torch.no_grad():
        for layer, W, b in ((net[0], W1, b1), (net[3], W2, b2), (net[7], W3.T, b3), (net[9], W4.T, b4)):
            layer.weight.copy_(W)
            layer.bias.copy_(b)
    return net


def block_of(n, ranks, rank):
    """Rank `rank`'s consecutive share of n items: n // ranks, one more for the first n % ranks
    (chapter 05's block_of). Used for the test set, which every rank scores a part of."""
    base, extra = divmod(n, ranks)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def evaluate(net, X, y, world, device):
    """Test accuracy: each rank classifies its block of the test set, the hit counts are summed."""
    begin, end = block_of(X.shape[0], world.size, world.rank)
    hits = torch.zeros((), dtype=torch.int64, device=device)
    net.eval()
    with torch.no_grad():
        for i in range(begin, end, EVAL_BATCH):
            Xb = X[i:min(i + EVAL_BATCH, end)].to(device)
            yb = y[i:min(i + EVAL_BATCH, end)].to(device)
            hits += (net(Xb).argmax(dim=1) == yb).sum()
    net.train()
    dist.all_reduce(hits)  # SUM over the ranks
    return hits.item() / X.shape[0]


# --------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------

def main():
    world = find_world()
    args = parse_args(world)
    torch.set_num_threads(args.threads)
    if args.device == "cuda":
        torch.cuda.set_device(world.local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    use_precision("fp32", device.type)  # on a GPU: TF32 off, so fp32 is fp32 as in the C++ programs
    backend = "nccl" if device.type == "cuda" else "gloo"
    join_process_group(world, backend)
    chapter = f"{args.chapter}_torch"

    # Every rank says where it runs; rank 0 prints the lines in rank order.
    me = f"rank {world.rank}: host {socket.gethostname()}, local rank {world.local_rank}, {device}, " \
         f"{args.threads} thread{'s' if args.threads > 1 else ''}"
    everyone = [None] * world.size
    dist.all_gather_object(everyone, me)
    if world.rank == 0:
        print(f"{chapter}: {world.size} process(es) started by {world.launcher}, DDP over {backend}, "
              f"global batch {args.batch_size} = {args.batch_size // world.size} per process", flush=True)
        print("\n".join(everyone), flush=True)

    torch.manual_seed(args.seed)  # the same draw on every rank; DDP broadcasts rank 0's anyway
    data_dir = find_data_dir(args.data_dir)
    X_train, y_train = load_split(data_dir, TRAIN_IMAGES, TRAIN_LABELS)
    X_test, y_test = load_split(data_dir, TEST_IMAGES, TEST_LABELS)
    if args.limit_train:
        X_train, y_train = X_train[:args.limit_train], y_train[:args.limit_train]
    n_train = X_train.shape[0]

    # DistributedSampler: every rank draws the same permutation of the epoch (from seed + epoch)
    # and takes every K-th example of it, from its rank on; if K does not divide the set, the
    # permutation is padded with its own first examples so that every rank gets as many.
    # Chapter 05's C++ sampler cuts each global batch into consecutive blocks instead; a step
    # covers the same positions of the permutation either way, only dealt out differently.
    train_set = TensorDataset(X_train, y_train)
    sampler = DistributedSampler(train_set, num_replicas=world.size, rank=world.rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size // world.size, sampler=sampler,
                        pin_memory=device.type == "cuda")

    net = lenet().to(device)
    # DDP: the constructor broadcasts rank 0's parameters to every rank; every backward then
    # averages the gradients over the ranks (allreduce of ~25 MB buckets as they fill up, while
    # backward still runs: chapter 05's overlap), so every rank takes the same SGD step.
    model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    rows, epoch_times = [], []
    width = len(str(args.epochs))
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)  # without it every epoch would repeat the first one's order
        # This rank's running sums stay on the device: .item() every step would make a GPU
        # wait for each step before queueing the next.
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        hits = torch.zeros((), dtype=torch.int64, device=device)
        seen = 0
        start = time.perf_counter()
        for X, y in loader:
            X, y = X.to(device, non_blocking=True), y.to(device, non_blocking=True)
            logits = model(X)
            # The mean over this rank's examples; DDP's average over the ranks makes it the mean
            # over the global batch (all ranks have as many), which is d2l's sum / batch_size.
            loss = F.cross_entropy(logits, y)
            optimizer.zero_grad()
            loss.backward()  # here DDP sums and divides by K
            optimizer.step()
            loss_sum += loss.detach().double() * y.shape[0]
            hits += (logits.detach().argmax(dim=1) == y).sum()
            seen += y.shape[0]
        if device.type == "cuda":
            torch.cuda.synchronize()  # GPU work is asynchronous; wait before stopping the clock
        seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the epoch lasts as long as its slowest rank
        epoch_times.append(seconds.item())
        sums = torch.stack([loss_sum, hits.double(), torch.tensor(float(seen), dtype=torch.float64, device=device)])
        dist.all_reduce(sums)  # SUM over the ranks: the epoch's loss, hits and examples
        loss_sum, hits, seen = sums.tolist()

        test_acc = evaluate(net, X_test, y_test, world, device)
        rows.append((epoch, loss_sum / seen, hits / seen, test_acc, epoch_times[-1]))
        if world.rank == 0:
            print(f"epoch {epoch:>{width}}/{args.epochs}  loss {rows[-1][1]:.4f}  train_acc {rows[-1][2]:.4f}"
                  f"  test_acc {test_acc:.4f}  sec {epoch_times[-1]:.2f}", flush=True)

    if world.rank == 0:
        write_run_csv(args.out, args.run, rows)
        sec_per_epoch = seconds_per_epoch(epoch_times)
        print(f"result: chapter={chapter} backend=torch-{device.type} devices={world.size} epochs={args.epochs}"
              f" batch={args.batch_size} lr={args.lr:g} precision=fp32 test_acc={rows[-1][3]:.4f}"
              f" sec_per_epoch={sec_per_epoch:.2f} samples_per_sec={round(n_train / sec_per_epoch)}"
              f" first_epoch_sec={epoch_times[0]:.2f} launcher={world.launcher} collective={backend}", flush=True)
    # Leave together: no rank tears its connections down while rank 0 still writes its results.
    dist.barrier()
    if backend == "gloo" and torch.__version__.startswith("1."):
        # torch 1.13 (Debian 12's) can hang here for good. Destroying the gloo process group
        # (destroy_process_group, or DDP's reducer when main() returns) joins gloo's worker
        # threads while holding Python's GIL, and a worker still freeing the tensor of a
        # finished collective waits for the GIL while holding the lock the others need: a
        # deadlock (gdb shows ~ProcessGroupGloo in std::thread::join, a worker in
        # ~TensorImpl). On the 2-core machine it caught one rank in about four runs. Every
        # result is written by now, so the process leaves without tearing anything down.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
