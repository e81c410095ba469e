"""A CUB_200_2011.tgz in the published archive's layout with a few images per class, for rehearsing the
cluster run (config/rehearsal.yaml, docs/slurm.md#rehearse-your-cluster-run) without the 1.1 GB download.

    .venv/bin/python tests/integration/cub_archive.py DIR [--per-class 3]

The layout is the release's (dmlrepro.data.benchmarks.read_cub reads it): attributes.txt beside the folder
CUB_200_2011/ holding README, images.txt (image id -> path), image_class_labels.txt (image id -> class id),
train_test_split.txt, classes.txt, bounding_boxes.txt and images/<NNN.Class>/<Class>_<id>.jpg for all 200
classes. The images are small JPEGs of seeded noise; the class names are stand-ins.
"""

from __future__ import annotations

import argparse
import io
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = 200
ARCHIVE = "CUB_200_2011.tgz"


def jpeg(rng: np.random.Generator, size: tuple[int, int] = (40, 30)) -> bytes:
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()


def members(per_class: int, seed: int = 0) -> dict[str, bytes]:
    """Archive path -> content, in the release's order: the tables first, then the images class by class."""
    rng = np.random.default_rng(seed)
    classes = [f"{c:03d}.Bird_{c}" for c in range(1, CLASSES + 1)]
    images, labels, split, boxes, files = [], [], [], [], {}
    for c, name in enumerate(classes, start=1):
        for j in range(per_class):
            k = len(images) + 1
            rel = f"{name}/Bird_{c}_{k:04d}_{j}.jpg"
            images.append(f"{k} {rel}")
            labels.append(f"{k} {c}")
            split.append(
                f"{k} {int(j % 2 == 0)}"
            )  # the release's own split: the benchmarks ignore it (classes 1-100 train)
            boxes.append(f"{k} 1.0 1.0 30.0 20.0")
            files[f"CUB_200_2011/images/{rel}"] = jpeg(rng)

    def table(lines: list[str]) -> bytes:
        return ("\n".join(lines) + "\n").encode()

    return {
        "attributes.txt": b"1 has_bill_shape::curved_(up_or_down)\n",
        "CUB_200_2011/README": b"A few images per class in the layout of CUB-200-2011 (Wah et al., 2011).\n",
        "CUB_200_2011/images.txt": table(images),
        "CUB_200_2011/image_class_labels.txt": table(labels),
        "CUB_200_2011/train_test_split.txt": table(split),
        "CUB_200_2011/classes.txt": table([f"{c} {name}" for c, name in enumerate(classes, start=1)]),
        "CUB_200_2011/bounding_boxes.txt": table(boxes),
        **files,
    }


def write_cub_archive(folder: Path, per_class: int = 3) -> Path:
    """Write `folder`/CUB_200_2011.tgz with `per_class` images for each of the 200 classes; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ARCHIVE
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members(per_class).items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help=f"where to write {ARCHIVE}")
    parser.add_argument("--per-class", type=int, default=3, help="images per class (default 3)")
    args = parser.parse_args(argv)
    print(write_cub_archive(args.folder, args.per_class))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
