"""Training throughput of the small backbones (forward + backward + SGD step), for
choosing the embedded default's network::

    python -m dmlrepro.models.bench --size 32 --batch 64 --threads 2

Prints one row per backbone: images/s from the median (``--best``: fastest) timed step (random init,
random data, linear head to 64-d, L2-normalised, a simple mean-of-squares loss).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from .model import build_model

SMALL_BACKBONES = ("tiny_cnn", "mobilenetv3_small_100", "resnet10t", "resnet18")


def measure(
    backbone: str,
    size: int = 32,
    batch: int = 64,
    warmup: int = 3,
    steps: int = 10,
    embedding_size: int = 64,
    best: bool = False,
    cpu_time: bool = False,
) -> float:
    """Training images/s of ``backbone`` at ``size`` px and batch ``batch``: from the median
    step time, or with ``best=True`` from the fastest step (less sensitive to other
    processes on a shared machine). ``cpu_time=True`` times steps by this process's CPU
    time instead of wall-clock time: with one thread this is the single-core throughput,
    independent of how busy the machine is."""
    torch.manual_seed(0)
    model = build_model(backbone=backbone, embedding_size=embedding_size, l2_normalize=True).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, 3, size, size)
    clock = time.process_time if cpu_time else time.perf_counter
    times = []
    for i in range(warmup + steps):
        t0 = clock()
        opt.zero_grad(set_to_none=True)
        z = model(x)
        loss = (z @ z.t()).pow(2).mean()
        loss.backward()
        opt.step()
        if i >= warmup:
            times.append(clock() - t0)
    return batch / (min(times) if best else statistics.median(times))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dmlrepro.models.bench")
    p.add_argument("--size", type=int, nargs="+", default=[32])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--best", action="store_true", help="report the fastest step instead of the median")
    p.add_argument("--cpu-time", action="store_true", help="time by process CPU time (use with --threads 1)")
    p.add_argument("backbones", nargs="*", default=list(SMALL_BACKBONES))
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, batch {args.batch}")
    print("| backbone | " + " | ".join(f"{s} px img/s" for s in args.size) + " |")
    for name in args.backbones:
        rates = [
            measure(name, s, args.batch, steps=args.steps, best=args.best, cpu_time=args.cpu_time) for s in args.size
        ]
        print(f"| {name} | " + " | ".join(f"{r:.0f}" for r in rates) + " |", flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
