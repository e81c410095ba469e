"""What the training precision does to the metrics (docs/readings/protocols.md#proto-r9): the same
runs, same seeds, trained in float32 and under bfloat16 autocast (and, on CUDA, float32 with TF32),
always evaluated in float32. The recipe is the digits check of tests/train/test_learning.py
(tiny_cnn, 64-d, cosine; digits 0-4 train, 5-9 test), for PFML (M = 4) and Proxy-Anchor.

    python benchmarks/bench_precision.py --seeds 0 1 2 3 4 --out precision.json [--device cuda]

Prints, per loss and precision, the untrained and final R@1 and MAP@R (mean ± sample std over seeds)
and the paired difference to float32 with its seed-level spread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from dmlrepro.data import prepare
from dmlrepro.evaluation import load_embeddings, retrieval_metrics
from dmlrepro.train import train_run

LOSSES = {
    "pfml": {"name": "pfml", "hparams": {"proxies_per_class": 4, "reduction": "mean"}},
    "proxy_anchor": {"name": "proxy_anchor"},
}
PRECISIONS = {
    "float32": {"amp": {"enabled": False}},
    "bfloat16": {"amp": {"enabled": True, "dtype": "bfloat16"}},
    "tf32": {"amp": {"enabled": False}, "speed": {"tf32": True}},
}


def run_config(root: Path, loss: str, precision: str, seed: int, device: str, epochs: int) -> dict:
    cfg = {
        "dataset": {
            "name": "digits",
            "root": str(root),
            "image_size": 32,
            "resize": 32,
            "train_crop": "random",
            "sampler": "random",
            "batch_size": 64,
        },
        "model": {"backbone": "tiny_cnn", "embedding_size": 64, "l2_normalize": True},
        "loss": LOSSES[loss],
        "optimizer": {"name": "adam", "lr": 3e-3, "lr_mult": {"loss": 100}},
        "eval": {"every": 0, "before_training": True, "distance": "cosine"},
        "epochs": epochs,
        "seed": seed,
        "threads": 2,
        "device": device,
    }
    return {**cfg, **PRECISIONS[precision]}


def bf16_rounded_metrics(outdir: Path) -> dict:
    """The run's test metrics on its float32 embeddings rounded to bfloat16: what an evaluation
    that keeps the autocast output's 8-bit mantissa reports."""
    import torch

    emb = load_embeddings(outdir / "embeddings_test.npz")
    rounded = torch.from_numpy(emb.embeddings).bfloat16().float().numpy()
    return retrieval_metrics(rounded, emb.labels, ks=(1,), distance="cosine")


def _mean_std(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return f"{100 * statistics.mean(values):.2f} ± {100 * sd:.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--precisions", nargs="+", default=["float32", "bfloat16"], choices=sorted(PRECISIONS))
    p.add_argument("--losses", nargs="+", default=sorted(LOSSES), choices=sorted(LOSSES))
    p.add_argument("--device", default="cpu")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--out")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        prepare("digits", root, progress=False)
        for seed in args.seeds:  # seed-major: a cut run still has paired rows
            for loss in args.losses:
                for precision in args.precisions:
                    t0 = time.perf_counter()
                    res = train_run(
                        run_config(root, loss, precision, seed, args.device, args.epochs),
                        Path(tmp) / f"{loss}-{precision}-{seed}",
                        progress=False,
                    )
                    rounded = bf16_rounded_metrics(Path(tmp) / f"{loss}-{precision}-{seed}")
                    rows.append(
                        {
                            "loss": loss,
                            "precision": precision,
                            "seed": seed,
                            "train_precision": res["precision"]["train"],
                            "seconds": time.perf_counter() - t0,
                            **{f"untrained_{k}": res["untrained_metrics"][k] for k in ("recall@1", "map@r")},
                            **{k: res["metrics"][k] for k in ("recall@1", "map@r")},
                            **{f"bf16_rounded_{k}": rounded[k] for k in ("recall@1", "map@r")},
                        }
                    )
                    print(json.dumps(rows[-1]), flush=True)
    print(
        f"\n{'loss':<13} {'precision':<9} {'R@1 untrained':>14} {'R@1':>14} {'MAP@R':>14} "
        f"{'ΔR@1 vs fp32':>14} {'MAP@R bf16-rounded':>19} {'s/run':>6}"
    )
    for loss in args.losses:
        base = {r["seed"]: r for r in rows if r["loss"] == loss and r["precision"] == "float32"}
        for precision in args.precisions:
            sel = [r for r in rows if r["loss"] == loss and r["precision"] == precision]
            delta = [r["recall@1"] - base[r["seed"]]["recall@1"] for r in sel if r["seed"] in base]
            print(
                f"{loss:<13} {precision:<9} {_mean_std([r['untrained_recall@1'] for r in sel]):>14} "
                f"{_mean_std([r['recall@1'] for r in sel]):>14} {_mean_std([r['map@r'] for r in sel]):>14} "
                f"{_mean_std(delta) if base and precision != 'float32' else '':>14} "
                f"{_mean_std([r['bf16_rounded_map@r'] for r in sel]):>19} "
                f"{statistics.mean(r['seconds'] for r in sel):>6.1f}"
            )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
