"""PFML vs pytorch-metric-learning's ProxyAnchorLoss: time per training step of the loss alone.

One step = loss forward + backward (gradients to the embeddings and the proxies) + an optimiser
step on the proxies, in one process, the same optimiser for both. Scales of PFML's datasets:
CUB (N=100 classes, M=15 proxies per class) and SOP (N=11,318, M=2), batch 100, D=512.

    python benchmarks/bench_losses.py                 # both scales, 40 timed steps each
    python benchmarks/bench_losses.py --scales cub --steps 20 --json out.json
    python benchmarks/bench_losses.py --scales sop --steps 600 --json sop.json   # about one SOP epoch:
        # the proxies' first steps are a transient (docs/benchmarks.md#pfml-at-sop-scale-on-cpus-without-bfloat16)

The two methods' steps alternate (same batches), so a load change on a shared machine hits both.
Reports the median and mean (amortised: neighbour-list refreshes included) step time, PFML's first
step (it builds the proxy neighbour list), the ratio to Proxy-Anchor, the most resident memory one
call (construction or a step) of each method added while it ran, how many neighbour-list rows
PFML searched again per step, and per window of `--window` timed steps the pairs the list held and
the largest proxy norm; `--json` also keeps every timed step. `--search-dtype` forces the precision of
PFML's near-pair searches (default: the loss's own choice, `search_precision.py`).
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
from dmlrepro.losses.search_precision import cpu_bfloat16_speedup, search_dtype_on

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
        yield (
            torch.nn.functional.normalize(centres + 0.5 * torch.randn(batch_size, dim, generator=g) / dim**0.5, dim=1),
            labels,
        )


class Method:
    """One loss and its optimiser, stepped on demand, with its step times and memory."""

    def __init__(self, name, scale, args):
        self.name, self.scale, self.args = name, scale, args
        self.times, self.rows, self.pairs, self.norms, self.peak_mb = [], [], [], [], 0.0
        torch.manual_seed(0)
        kwargs = (
            {
                "proxies_per_class": scale["proxies_per_class"],
                "delta": args.delta,
                "alpha": args.alpha,
                "pair_search": args.pair_search,
                "skin": args.skin,
                "search_dtype": None if args.search_dtype == "auto" else getattr(torch, args.search_dtype),
            }
            if name == "pfml"
            else {}
        )
        self._measured(lambda: self._build(kwargs))

    def _build(self, kwargs):
        self.loss = build_loss(self.name, self.scale["num_classes"], self.args.dim, **kwargs)
        self.optimiser = torch.optim.Adam(self.loss.parameters(), lr=self.args.lr, weight_decay=self.args.weight_decay)

    def _measured(self, work):
        """Run `work`, keeping the most resident memory one call of this method added while it ran."""
        with PeakRSS() as memory:
            work()
        self.peak_mb = max(self.peak_mb, memory.added_mb)

    def step(self, step, z, y):
        z = z.clone().requires_grad_()

        def work():
            start = time.perf_counter()
            self.optimiser.zero_grad(set_to_none=True)
            self.loss(z, y).backward()
            self.optimiser.step()
            self.elapsed = time.perf_counter() - start

        self._measured(work)
        if step == 0:
            self.first = self.elapsed
        if step >= self.args.warmup:
            self.times.append(self.elapsed)
            if self.name == "pfml":
                stats = self.loss.neighbour_stats()
                self.rows.append(stats["rows_refreshed"])
                self.pairs.append(stats["pairs"])
                self.norms.append(float(self.loss.proxies.detach().norm(dim=1).max()))

    def result(self):
        times = self.times
        result = {
            "method": self.name,
            "median_ms": 1e3 * statistics.median(times),
            "mean_ms": 1e3 * statistics.fmean(times),
            "first_step_ms": 1e3 * self.first,
            "peak_added_mb": self.peak_mb,
            "step_ms": [1e3 * t for t in times],
        }
        if self.rows:
            result.update(
                rows_refreshed=self.rows,
                rows_refreshed_mean=statistics.fmean(self.rows),
                rows_refreshed_max=max(self.rows),
                proxies=self.scale["num_classes"] * self.scale["proxies_per_class"],
                pairs_mean=statistics.fmean(self.pairs),
                pairs=self.pairs,
                max_proxy_norm=self.norms,
            )
        return result


def run_interleaved(scale, args):
    """Proxy-Anchor's and PFML's steps alternate on the same batches: a load change on a shared machine hits both."""
    methods = [Method("proxy_anchor", scale, args), Method("pfml", scale, args)]
    for step, (z, y) in enumerate(batches(scale["num_classes"], args.batch, args.dim, args.warmup + args.steps, 1)):
        for method in methods:
            method.step(step, z, y)
    return [method.result() for method in methods]


def print_windows(anchor, pfml, window):
    """Per window of timed steps: both methods' mean step, the ratio, and what PFML's list did."""
    print(
        "| timed steps | ProxyAnchor mean ms | PFML mean ms | ratio | rows searched (mean) | pairs held (max) "
        "| largest proxy norm |"
    )
    print("|---|---|---|---|---|---|---|")
    for start in range(0, len(pfml["step_ms"]), window):
        part = slice(start, start + window)
        a, p = statistics.fmean(anchor["step_ms"][part]), statistics.fmean(pfml["step_ms"][part])
        print(
            f"| {start + 1}–{start + len(pfml['step_ms'][part])} | {a:.0f} | {p:.0f} | {p / a:.2f}x "
            f"| {statistics.fmean(pfml['rows_refreshed'][part]):.0f} | {max(pfml['pairs'][part])} "
            f"| {max(pfml['max_proxy_norm'][part]):.2f} |"
        )


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
    parser.add_argument(
        "--search-dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="PFML's search precision"
    )
    parser.add_argument("--window", type=int, default=20, help="timed steps per window of the per-window table")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    search = args.search_dtype if args.search_dtype != "auto" else str(search_dtype_on(torch.device("cpu")))[6:]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, D {args.dim}, "
        f"Adam lr {args.lr} wd {args.weight_decay}, {args.steps} timed steps after {args.warmup}; "
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}, "
        f"bfloat16 search chunk {cpu_bfloat16_speedup():.2f}x faster than float32: PFML searches in {search}"
    )
    results = []
    for scale_name in args.scales:
        scale = SCALES[scale_name]
        anchor, pfml = run_interleaved(scale, args)
        for r in (anchor, pfml):
            r["scale"] = scale_name
        pfml["ratio_median"] = pfml["median_ms"] / anchor["median_ms"]
        pfml["ratio_mean"] = pfml["mean_ms"] / anchor["mean_ms"]
        results += [anchor, pfml]
        print(f"\n{scale_name.upper()}: N={scale['num_classes']}, M={scale['proxies_per_class']}")
        print("| method | median ms/step | mean ms/step | first step ms | peak added MB |")
        print("|---|---|---|---|---|")
        for r in (anchor, pfml):
            print(
                f"| {r['method']} | {r['median_ms']:.1f} | {r['mean_ms']:.1f} | {r['first_step_ms']:.0f} "
                f"| {r['peak_added_mb']:.0f} |"
            )
        print(
            f"PFML / ProxyAnchor: {pfml['ratio_median']:.2f}x (median), {pfml['ratio_mean']:.2f}x (mean); "
            f"neighbour-list rows searched per step: mean {pfml['rows_refreshed_mean']:.0f}, "
            f"max {pfml['rows_refreshed_max']} of {pfml['proxies']}; pairs held: mean {pfml['pairs_mean']:.0f}"
        )
        print_windows(anchor, pfml, args.window)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
