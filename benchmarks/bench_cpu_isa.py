"""What pinning torch's CPU kernels to AVX2 costs (dmlrepro.cpu_isa, docs/training.md#bit-exactness):
each workload timed under ``DMLREPRO_CPU_ISA=native`` (the anchor: each library's own pick for this
host) and ``avx2`` (the default), in fresh interpreters, the two levels alternating, ``--repeats``
times; the median of each and the ratio avx2 / native.

Workloads (one torch thread each, float32, no data on disk):

* ``trunk`` — the embedded default's digit-trunk pretraining (config/config.yaml: tiny_cnn 24-48-96-96
  on scikit-learn's digits, 32 px, batches of 128) for ``--trunk-epochs`` epochs, on its fixed 2 threads;
* ``step`` — ``--steps`` training steps of tiny_cnn with a 64-d head on batches of 64 random 32 px
  images (the miniature's shape), cross-entropy, Adam;
* ``search`` — one float32 search product of 2,048 queries x 512 dims x 22,636 items (an SOP-sized
  chunk of the exact k-NN search).

    python benchmarks/bench_cpu_isa.py --out bench_cpu_isa.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

from dmlrepro.cpu_isa import LEVELS as PINS

LEVELS = ("native", "avx2")  # the anchor first

WORKLOAD = textwrap.dedent(
    """
    import json, sys, time
    import dmlrepro
    import torch
    from dmlrepro.cpu_isa import cpu_isa_record
    from dmlrepro.models.backbones import create_backbone
    from dmlrepro.models.digit_trunk import pretrain

    name, size = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if name == "trunk":
        recipe = {"dataset": "double_digits", "backbone": "tiny_cnn", "backbone_kwargs": {"widths": [24, 48, 96, 96]},
                  "size": 32, "epochs": size, "batch_size": 128, "lr": 2.0e-3, "weight_decay": 5.0e-4, "seed": 0}
        t0 = time.perf_counter()
        pretrain(recipe, sys.argv[3], log=lambda *a: None)
    elif name == "step":
        trunk = create_backbone("tiny_cnn", widths=[24, 48, 96, 96])
        net = torch.nn.Sequential(trunk, torch.nn.Linear(int(trunk.num_features), 64))
        opt = torch.optim.Adam(net.parameters(), 1e-3)
        x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 64, (64,))
        t0 = time.perf_counter()
        for _ in range(size):
            loss = torch.nn.functional.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    else:
        q, g = torch.randn(2048, 512), torch.randn(22636, 512)
        q @ g.T
        t0 = time.perf_counter()
        for _ in range(size):
            q @ g.T
    print(json.dumps({"seconds": time.perf_counter() - t0, **cpu_isa_record()}))
    """
)


def timed(level: str, name: str, size: int, scratch: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in PINS["avx2"]}  # each child pins for its level
    out = subprocess.run(
        [sys.executable, "-c", WORKLOAD, name, str(size), os.path.join(scratch, f"trunk-{level}.pt")],
        env={**env, "DMLREPRO_CPU_ISA": level},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--trunk-epochs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--searches", type=int, default=3)
    ap.add_argument("--scratch", default="/tmp/bench_cpu_isa")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    os.makedirs(a.scratch, exist_ok=True)
    sizes = {"trunk": a.trunk_epochs, "step": a.steps, "search": a.searches}
    results = {}
    for name, size in sizes.items():
        runs = {level: [] for level in LEVELS}
        for _ in range(a.repeats):
            for level in LEVELS:
                runs[level].append(timed(level, name, size, a.scratch))
        median = {level: statistics.median(r["seconds"] for r in runs[level]) for level in LEVELS}
        kernels = {level: runs[level][0]["cpu_kernels"] for level in LEVELS}
        results[name] = {
            "size": size,
            "seconds": median,
            "kernels": kernels,
            "ratio": median["avx2"] / median["native"],
        }
        print(
            f"{name:7s} native ({kernels['native']}) {median['native']:.2f} s, "
            f"avx2 ({kernels['avx2']}) {median['avx2']:.2f} s: x{results[name]['ratio']:.2f}",
            flush=True,
        )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
