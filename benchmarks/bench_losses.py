"""PFML vs pytorch-metric-learning's ProxyAnchorLoss: time per training step of the loss alone.

One step = loss forward + backward (gradients to the embeddings and the proxies) + an optimiser
step on the proxies, in one process, the same optimiser for both. Scales of PFML's datasets:
CUB (N=100 classes, M=15 proxies per class) and SOP (N=11,318, M=2), batch 100, D=512.

    python benchmarks/bench_losses.py                 # both scales, 40 timed steps each
    python benchmarks/bench_losses.py --scales cub --steps 20 --json out.json

Reports the median and mean (amortised: neighbour-list refreshes included) step time, PFML's first
step (it builds the proxy neighbour list), the ratio to Proxy-Anchor, the peak resident memory
added while each method ran, and how many neighbour-list rows PFML searched again per step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import psutil
import torch

from dmlrepro.losses import build_loss
from dmlrepro.losses.search_precision import cpu_has_native_bfloat16, search_dtype_on

SCALES = {"cub": {"num_classes": 100, "proxies_per_class": 15}, "sop": {"num_classes": 11318, "proxies_per_class": 2}}


class PeakRSS:
    """Peak resident set size of this process above its level at entry, sampled every 2 ms."""

    def __enter__(self):
        self.process, self.start, self.peak, self.running = psutil.Process(), 0, 0, True
        self.start = self.peak = self.process.memory_info().rss
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.002)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()

    @property
    def added_mb(self) -> float:
        return (self.peak - self.start) / 2**20


def batches(num_classes, batch_size, dim, steps, seed):
    """Unit-norm embeddings around per-class centres (random sampler: labels drawn uniformly)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        labels = torch.randint(0, num_classes, (batch_size,), generator=g)
        centres = torch.nn.functional.normalize(torch.randn(batch_size, dim, generator=g), dim=1)
        yield torch.nn.functional.normalize(centres + 0.5 * torch.randn(batch_size, dim, generator=g) / dim**0.5, dim=1), labels


def run_method(name, scale, args):
    torch.manual_seed(0)
    kwargs = {"proxies_per_class": scale["proxies_per_class"], "delta": args.delta, "alpha": args.alpha,
              "pair_search": args.pair_search, "skin": args.skin} if name == "pfml" else {}
    times, rows, pairs = [], [], []
    with PeakRSS() as memory:
        loss = build_loss(name, scale["num_classes"], args.dim, **kwargs)
        optimiser = torch.optim.Adam(loss.parameters(), lr=args.lr, weight_decay=args.weight_decay)
        for step, (z, y) in enumerate(batches(scale["num_classes"], args.batch, args.dim, args.warmup + args.steps, 1)):
            z.requires_grad_()
            start = time.perf_counter()
            optimiser.zero_grad(set_to_none=True)
            loss(z, y).backward()
            optimiser.step()
            elapsed = time.perf_counter() - start
            if step == 0:
                first = elapsed
            if step >= args.warmup:
                times.append(elapsed)
                if name == "pfml":
                    stats = loss.neighbour_stats()
                    rows.append(stats["rows_refreshed"])
                    pairs.append(stats["pairs"])
    result = {"method": name, "median_ms": 1e3 * statistics.median(times), "mean_ms": 1e3 * statistics.fmean(times),
              "first_step_ms": 1e3 * first, "peak_added_mb": memory.added_mb}
    if rows:
        result.update(rows_refreshed_mean=statistics.fmean(rows), rows_refreshed_max=max(rows),
                      proxies=scale["num_classes"] * scale["proxies_per_class"], pairs_mean=statistics.fmean(pairs))
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scales", nargs="+", default=["cub", "sop"], choices=sorted(SCALES))
    parser.add_argument("--steps", type=int, default=40, help="timed steps per method (default 40)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--lr", type=float, default=0.01, help="proxy learning rate (PFML supp. Table 5: 0.01)")
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--delta", type=float, default=0.2)
    parser.add_argument("--alpha", type=float, default=4.0)
    parser.add_argument("--pair-search", default="auto", choices=["auto", "dense", "neighbour"])
    parser.add_argument("--skin", type=float, default=None, help="PFML neighbour-list skin (default: δ/10)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, D {args.dim}, "
          f"Adam lr {args.lr} wd {args.weight_decay}, {args.steps} timed steps after {args.warmup}; "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}, native bfloat16 {cpu_has_native_bfloat16()}: "
          f"PFML searches in {search_dtype_on(torch.device('cpu'))}")
    results = []
    for scale_name in args.scales:
        scale = SCALES[scale_name]
        anchor, pfml = run_method("proxy_anchor", scale, args), run_method("pfml", scale, args)
        for r in (anchor, pfml):
            r["scale"] = scale_name
        pfml["ratio_median"] = pfml["median_ms"] / anchor["median_ms"]
        pfml["ratio_mean"] = pfml["mean_ms"] / anchor["mean_ms"]
        results += [anchor, pfml]
        print(f"\n{scale_name.upper()}: N={scale['num_classes']}, M={scale['proxies_per_class']}")
        print("| method | median ms/step | mean ms/step | first step ms | peak added MB |")
        print("|---|---|---|---|---|")
        for r in (anchor, pfml):
            print(f"| {r['method']} | {r['median_ms']:.1f} | {r['mean_ms']:.1f} | {r['first_step_ms']:.0f} | {r['peak_added_mb']:.0f} |")
        print(f"PFML / ProxyAnchor: {pfml['ratio_median']:.2f}x (median), {pfml['ratio_mean']:.2f}x (mean); "
              f"neighbour-list rows searched per step: mean {pfml['rows_refreshed_mean']:.0f}, "
              f"max {pfml['rows_refreshed_max']} of {pfml['proxies']}; pairs held: mean {pfml['pairs_mean']:.0f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
