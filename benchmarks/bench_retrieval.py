"""Benchmark dmlrepro.evaluation.retrieval_metrics on SOP-sized random clustered embeddings.

Times, in one process and on the same data:

* ``ours``        retrieval_metrics(x, y, ks=(1,)) — P@1, R-Precision, MAP@R (k = max class − 1);
* ``ours-sop-ks`` retrieval_metrics(x, y, ks=(1, 10, 100, 1000)) — the SOP Recall@K set (k = 1000);
* anchor ``pml``  pytorch-metric-learning AccuracyCalculator(k="max_bin_count") on the same three
                  metrics (faiss IndexFlatL2 underneath, one search over all queries);
* anchor ``torch`` a brute-force chunked torch GEMM + topk (4096 query rows per chunk) computing
                  the same three metrics,

and prints wall time, the ratio to each anchor, and the peak extra memory of each step
(resident-set high-water mark above the RSS before the step, Linux; plus tracemalloc's peak of
Python/numpy allocations). Usage::

    python benchmarks/bench_retrieval.py [--n 60502 --dim 512] [--anchors pml,torch]

``--backends faiss-cpu,torch`` instead compares our k-NN backends (docs/evaluation.md#backends)
on the same data in the same process: ``compute_retrieval`` with ks=(1,) and with the SOP set
(1, 10, 100, 1000) (search depth k = 1000, as ``eval.ks`` of the SOP runs gives), on
``--distance`` (the runs' default: cosine), each backend ``--repeats`` times (best time kept);
it prints every time, the ratio of each backend to the first one, and whether the metrics are
equal. ``--device cuda`` runs the torch path (and faiss-gpu, if listed) on the GPU::

    python benchmarks/bench_retrieval.py --n 60502 --dim 512 --backends faiss-cpu,torch
"""

from __future__ import annotations

import argparse
import platform
import time
import tracemalloc

import numpy as np


def sop_like(n: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit-norm clustered embeddings with SOP-like class sizes (2–12, mean ≈ 5.35)."""
    rng = np.random.default_rng(seed)
    sizes = []
    total = 0
    while total < n:
        s = int(min(2 + rng.binomial(10, 0.335), n - total))
        if n - total - s == 1:
            s += 1
        sizes.append(max(s, 1))
        total += sizes[-1]
    labels = np.repeat(np.arange(len(sizes)), sizes)[:n]
    centers = rng.standard_normal((len(sizes), dim), dtype=np.float32)
    x = np.empty((n, dim), dtype=np.float32)
    for s in range(0, n, 8192):
        e = min(n, s + 8192)
        x[s:e] = centers[labels[s:e]] + 2.3 * rng.standard_normal((e - s, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    perm = rng.permutation(n)
    return np.ascontiguousarray(x[perm]), labels[perm]


def _status_bytes(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def measure(fn):
    """(result, seconds, peak extra RSS bytes or None, traced peak bytes)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM (Linux >= 4.0)
            f.write("5")
        hwm_ok = True
    except OSError:
        hwm_ok = False
    rss0 = _status_bytes("VmRSS")
    tracemalloc.start()
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    hwm = _status_bytes("VmHWM")
    extra = (hwm - rss0) if (hwm_ok and hwm is not None and rss0 is not None) else None
    return out, dt, extra, traced


def pml_anchor(x, y):
    import torch
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    calc = AccuracyCalculator(
        include=("precision_at_1", "r_precision", "mean_average_precision_at_r"),
        k="max_bin_count",
    )
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    r = calc.get_accuracy(xt, yt, xt, yt, ref_includes_query=True)
    return {
        "precision@1": r["precision_at_1"],
        "r_precision": r["r_precision"],
        "map@r": r["mean_average_precision_at_r"],
    }


def torch_anchor(x, y, chunk=4096):
    """Brute force: chunked squared-L2 GEMM, self set to +inf, topk(k_max), metrics in torch."""
    import torch

    xt = torch.from_numpy(x)
    yt = torch.from_numpy(y)
    counts = torch.bincount(yt)
    r_all = counts[yt] - 1
    k = int(r_all.max())
    sq = (xt * xt).sum(1)
    ar = torch.arange(1, k + 1, dtype=torch.float64)
    p1 = rp = mapr = 0.0
    nq = 0
    for s in range(0, len(xt), chunk):
        e = min(len(xt), s + chunk)
        d = torch.addmm(sq[None, :], xt[s:e], xt.T, alpha=-2.0).add_(sq[s:e, None])
        d[torch.arange(e - s), torch.arange(s, e)] = float("inf")
        idx = torch.topk(d, k, dim=1, largest=False).indices
        del d
        r = r_all[s:e]
        valid = r > 0
        rel = (yt[idx] == yt[s:e, None])[valid]
        r = r[valid].to(torch.float64)
        rel_r = rel & (ar[None, :] <= r[:, None])
        p1 += rel[:, 0].sum().item()
        rp += (rel_r.sum(1) / r).sum().item()
        cum = torch.cumsum(rel_r, 1).to(torch.float64)
        mapr += ((cum / ar * rel_r).sum(1) / r).sum().item()
        nq += int(valid.sum())
    return {"precision@1": p1 / nq, "r_precision": rp / nq, "map@r": mapr / nq}


def compare_backends(x, y, backends, args) -> None:
    """Time compute_retrieval per backend on the same data; ratio to the first backend."""
    from dmlrepro.evaluation import compute_retrieval

    for b in backends:  # warm-up (BLAS/OpenMP/CUDA initialisation, the faiss GPU probe)
        compute_retrieval(x[:2000], y[:2000], (1,), distance=args.distance, device=args.device, backend=b)
    for ks in ((1,), (1, 10, 100, 1000)):
        results = {}
        for _ in range(max(1, args.repeats)):  # backends interleaved: a load change hits both
            for b in backends:
                res, dt, extra, _ = measure(
                    lambda: compute_retrieval(x, y, ks, distance=args.distance, device=args.device, backend=b)  # noqa: B023 (called in this iteration)
                )
                print(
                    f"ks={ks!s:20s} {b:10s} {dt:8.2f} s  peak extra RSS "
                    f"{(extra or 0) / 2**20:6.0f} MiB  k searched {res.k_searched}  device {res.info['device']}"
                    f"  R@1 {res.metrics['recall@1']:.4f} MAP@R {res.metrics['map@r']:.4f}",
                    flush=True,
                )
                if b not in results or dt < results[b][1]:
                    results[b] = (res, dt, extra)
        first = backends[0]
        for b in backends[1:]:
            same = results[b][0].metrics == results[first][0].metrics
            diff = max(abs(results[b][0].metrics[k] - results[first][0].metrics[k]) for k in results[first][0].metrics)
            print(
                f"ks={ks!s:20s} ratio {b} / {first}: {results[b][1] / results[first][1]:.2f}"
                f"  metrics identical: {same} (max |diff| {diff:.1e})",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=60502)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--anchors", default="pml,torch", help="comma list of: pml, torch")
    ap.add_argument("--no-sop-ks", action="store_true", help="skip the k=1000 SOP Recall@K run")
    ap.add_argument(
        "--backends",
        default=None,
        help="comma list of k-NN backends to compare (faiss-cpu, torch, faiss-gpu); skips the anchors",
    )
    ap.add_argument("--distance", default="cosine", help="distance of the backend comparison")
    ap.add_argument("--repeats", type=int, default=1, help="runs per backend and ks set (best time kept)")
    ap.add_argument(
        "--device",
        default=None,
        help="our metrics' device: cpu, cuda, cuda:N (faiss on the GPU needs a faiss GPU build); "
        "default: where the inputs are (numpy: CPU)",
    )
    args = ap.parse_args()

    import faiss
    import torch

    from dmlrepro.evaluation import retrieval_metrics

    x, y = sop_like(args.n, args.dim, args.seed)
    counts = np.bincount(y)
    print(
        f"n={args.n} dim={args.dim} classes={len(counts)} class sizes {counts.min()}–{counts.max()}"
        f" | {platform.processor() or platform.machine()}, torch threads {torch.get_num_threads()},"
        f" faiss {faiss.__version__} omp threads {faiss.omp_get_max_threads()}"
    )
    print(f"an N×N float32 matrix would be {args.n**2 * 4 / 2**30:.1f} GiB")
    if args.backends:
        compare_backends(x, y, [b.strip() for b in args.backends.split(",") if b.strip()], args)
        return
    retrieval_metrics(x[:2000], y[:2000], device=args.device)  # warm-up (faiss/BLAS/OpenMP/CUDA initialisation)

    steps = [("ours", lambda: retrieval_metrics(x, y, ks=(1,), device=args.device))]
    if not args.no_sop_ks:
        steps.append(("ours-sop-ks", lambda: retrieval_metrics(x, y, ks=(1, 10, 100, 1000), device=args.device)))
    anchors = [a.strip() for a in args.anchors.split(",") if a.strip()]
    for a in anchors:
        if a == "pml":
            steps.append(("pml", lambda: pml_anchor(x, y)))
        elif a == "torch":
            steps.append(("torch", lambda: torch_anchor(x, y)))
        else:
            raise SystemExit(f"unknown anchor {a!r}; expected pml or torch")

    rows = {}
    for name, fn in steps:
        res, dt, extra, traced = measure(fn)
        rows[name] = (res, dt, extra, traced)
        mem = f"{extra / 2**20:8.0f} MiB" if extra is not None else "     n/a"
        print(
            f"{name:12s} {dt:8.2f} s   peak extra RSS {mem}   traced {traced / 2**20:7.0f} MiB   "
            f"P@1 {res['precision@1']:.4f}  MAP@R {res['map@r']:.4f}"
        )
    ours = rows["ours"][1]
    for a in anchors:
        print(f"ratio ours / {a}: {ours / rows[a][1]:.2f}")
        for key in ("precision@1", "r_precision", "map@r"):
            diff = abs(rows["ours"][0][key] - rows[a][0][key])
            print(f"  |ours − {a}| {key}: {diff:.2e}")


if __name__ == "__main__":
    main()
