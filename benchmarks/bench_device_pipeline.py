"""Device-side JPEG decoding and augmentation (dmlrepro.data.device_pipeline) against the CPU data path.

Times the CPU path (decode + the papers' train transform, image by image, one process: img/s per
core) and ``DevicePipeline`` on ``--device`` (batches of ``--batch``: img/s), on JPEGs made from
scikit-learn's two sample photographs (427 x 640), cropped and re-encoded at quality 90 to
``--images`` files. It also measures how far the device path's pixels are from the CPU path's
(train and eval transforms, normalisation "none", in 1/255 units), and two differences a CPU
alone can show: torchvision's decoder vs PIL's on the same files, and torchvision's uint8 resize
kernel (CPU) vs the float32 resize + rounding that CUDA runs for uint8 images.

    python benchmarks/bench_device_pipeline.py                         # the CPU: pixel differences, CPU timings
    python benchmarks/bench_device_pipeline.py --device cuda --json out.json   # on a GPU node
"""

from __future__ import annotations

import argparse
import io
import json
import time

import numpy as np
import torch
from PIL import Image

from dmlrepro.data.device_pipeline import DevicePipeline, decode_batch
from dmlrepro.data.transforms import build_transform


def photographs(count: int, seed: int = 0) -> list[bytes]:
    """`count` JPEG files (quality 90): random crops of the sample photographs, each resized to 640 x 480."""
    from sklearn.datasets import load_sample_images

    rng, sources, files = np.random.default_rng(seed), load_sample_images().images, []
    for k in range(count):
        src = sources[k % len(sources)]
        top, left = rng.integers(0, 60), rng.integers(0, 120)
        img = Image.fromarray(src[top : top + 360, left : left + 480]).resize((640, 480), Image.BICUBIC)
        if k % 2:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        buffer = io.BytesIO()
        img.save(buffer, format="JPEG", quality=90)
        files.append(buffer.getvalue())
    return files


def differences(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """Max and mean |a − b| in 1/255 units and the share of values that differ (a, b in [0, 1] or uint8)."""
    scale = 255.0 if a.is_floating_point() else 1.0
    d = (a.double().cpu() - b.double().cpu()).abs() * scale
    return {"max": float(d.max()), "mean": float(d.mean()), "share_differing": float((d > 1e-3).double().mean())}


def cpu_path(files, seeds, **kwargs):
    transform, out = build_transform(**kwargs), []
    for data, seed in zip(files, seeds):
        saved = torch.default_generator.get_state()
        if seed is not None:
            torch.default_generator.manual_seed(seed)
        out.append(transform(decode_cpu(data)))
        torch.default_generator.set_state(saved)
    return torch.stack(out)


def decode_cpu(data: bytes) -> torch.Tensor:
    return decode_batch([torch.frombuffer(bytearray(data), dtype=torch.uint8)], torch.device("cpu"))[0]


def decoder_differences(files) -> dict[str, float]:
    """torchvision's CPU decoder (the data layer's) vs PIL's on the same JPEG files."""
    tv = torch.stack([decode_cpu(data) for data in files])
    pil = torch.stack(
        [
            torch.from_numpy(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).copy()).permute(2, 0, 1)
            for data in files
        ]
    )
    return differences(tv, pil)


def resize_kernel_differences(files, size: int = 224) -> dict[str, float]:
    """The CPU's uint8 antialiased bilinear resize vs float32 resize + round (CUDA's way for uint8 images)."""
    from torchvision.transforms.v2 import functional as F

    uint8, floated = [], []
    for data in files:
        img = decode_cpu(data)
        uint8.append(F.resize(img, [256], antialias=True))
        floated.append(F.resize(img.float(), [256], antialias=True).round_().clamp_(0, 255).to(torch.uint8))
    return differences(torch.stack(uint8), torch.stack(floated))


def throughput(run, images: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return images / best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="where DevicePipeline runs: cpu or cuda (default cpu)")
    parser.add_argument("--images", type=int, default=200, help="JPEG files (default 200)")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads for the CPU path (default 1: per core)"
    )
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    files = photographs(args.images)
    encoded = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in files]
    seeds = list(range(1000, 1000 + len(files)))
    train = dict(train=True, size=224)
    result = {
        "device": args.device,
        "torch": torch.__version__,
        "images": len(files),
        "batch": args.batch,
        "decoder_torchvision_vs_pil": decoder_differences(files[:50]),
        "resize_uint8_vs_float": resize_kernel_differences(files[:50]),
    }
    pipeline = DevicePipeline(**train, normalization="none", device=args.device)
    for name, kwargs, draw in (("train", train, seeds), ("eval", dict(train=False, size=224), [None] * len(files))):
        device_out = DevicePipeline(**kwargs, normalization="none", device=args.device)(encoded[:50], draw[:50])
        result[f"device_vs_cpu_{name}"] = differences(
            device_out, cpu_path(files[:50], draw[:50], **kwargs, normalization="none")
        )
    result["cpu_path_img_per_s"] = throughput(lambda: cpu_path(files, seeds, **train), len(files), args.repeats)
    batches = [(encoded[s : s + args.batch], seeds[s : s + args.batch]) for s in range(0, len(files), args.batch)]
    result["device_path_img_per_s"] = throughput(lambda: [pipeline(e, s) for e, s in batches], len(files), args.repeats)
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
