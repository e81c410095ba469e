"""Fixtures for the data tests: a local HTTP server and tiny archives in the real layouts."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import threading
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from PIL import Image


def md5_of(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def tiny_jpeg(seed: int, size: int = 12) -> bytes:
    a = np.random.default_rng(seed).integers(0, 256, (size, size + 2, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def make_tgz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def make_zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


# ------------------------------------------------------------------ tiny datasets, real layouts
@dataclass
class TinyDataset:
    name: str
    files: dict[str, bytes]  # resource filename -> bytes
    rows: list[tuple[str, int, str]]  # expected manifest rows (path, label, split), file order
    item_ids: list[str] | None = None
    counts: dict[str, int] = field(default_factory=dict)
    pixels: dict[str, np.ndarray] = field(default_factory=dict)  # manifest path -> expected image (IDX data)

    @property
    def md5(self) -> dict[str, str]:
        return {k: md5_of(v) for k, v in self.files.items()}


def tiny_cub(n_classes: int = 4, per_class: int = 3, drop: str | None = None) -> TinyDataset:
    members, images, labels, rows = {}, [], [], []
    k = 0
    for c in range(1, n_classes + 1):
        cname = f"{c:03d}.Bird_{c}"
        for j in range(per_class):
            k += 1
            rel = f"{cname}/Bird_{c}_{j:04d}.jpg"
            members[f"CUB_200_2011/images/{rel}"] = tiny_jpeg(k)
            images.append(f"{k} {rel}")
            labels.append(f"{k} {c}")
            rows.append((f"CUB_200_2011/images/{rel}", c - 1, "train" if c <= n_classes // 2 else "test"))
    members["CUB_200_2011/images.txt"] = ("\n".join(images) + "\n").encode()
    members["CUB_200_2011/image_class_labels.txt"] = ("\n".join(labels) + "\n").encode()
    members["CUB_200_2011/classes.txt"] = "".join(f"{c} {c:03d}.Bird_{c}\n" for c in range(1, n_classes + 1)).encode()
    members["attributes.txt"] = b"1 has_bill_shape::curved\n"
    if drop:
        members.pop(drop)
    return TinyDataset("cub200", {"CUB_200_2011.tgz": make_tgz(members)}, rows)


def cars_mat_bytes(rel_paths: list[str], classes: list[int]) -> bytes:
    from scipy.io import savemat

    dt = [
        ("relative_im_path", "O"),
        ("bbox_x1", "O"),
        ("bbox_y1", "O"),
        ("bbox_x2", "O"),
        ("bbox_y2", "O"),
        ("class", "O"),
        ("test", "O"),
    ]
    ann = np.zeros((1, len(rel_paths)), dtype=dt)
    for i, (p, c) in enumerate(zip(rel_paths, classes)):
        ann[0, i] = (p, 1, 1, 10, 10, c, i % 2)
    names = np.array([f"Car {c}" for c in sorted(set(classes))], dtype=object)
    buf = io.BytesIO()
    savemat(buf, {"annotations": ann, "class_names": names[None, :]})
    return buf.getvalue()


def tiny_cars(n_classes: int = 4, per_class: int = 3) -> TinyDataset:
    members, rel, cls, rows = {}, [], [], []
    k = 0
    for _ in range(per_class):  # interleave classes, as the real file is ordered by image number
        for c in range(1, n_classes + 1):
            k += 1
            p = f"car_ims/{k:06d}.jpg"
            members[p] = tiny_jpeg(100 + k)
            rel.append(p)
            cls.append(c)
            rows.append((p, c - 1, "train" if c <= n_classes // 2 else "test"))
    return TinyDataset("cars196", {"car_ims.tgz": make_tgz(members), "cars_annos.mat": cars_mat_bytes(rel, cls)}, rows)


def tiny_sop(n_train_classes: int = 3, n_test_classes: int = 2, per_class: int = 2) -> TinyDataset:
    members, rows = {}, []
    lines = {"train": ["image_id class_id super_class_id path"], "test": ["image_id class_id super_class_id path"]}
    k, cls = 0, 0
    for split, n in (("train", n_train_classes), ("test", n_test_classes)):
        for _ in range(n):
            cls += 1
            for j in range(per_class):
                k += 1
                rel = f"bicycle_final/{1000 + cls}_{j}.JPG"
                members[f"Stanford_Online_Products/{rel}"] = tiny_jpeg(200 + k)
                lines[split].append(f"{k} {cls} 1 {rel}")
                rows.append((f"Stanford_Online_Products/{rel}", cls - 1, split))
    for split in ("train", "test"):
        members[f"Stanford_Online_Products/Ebay_{split}.txt"] = ("\n".join(lines[split]) + "\n").encode()
    members["Stanford_Online_Products/Ebay_info.txt"] = b"image_id class_id super_class_id path\n"
    return TinyDataset("sop", {"Stanford_Online_Products.zip": make_zip(members)}, rows)


def tiny_inshop() -> TinyDataset:
    # item ids deliberately not in sorted order in the file; two train items, two test items
    spec = [
        ("id_00000009", "train", 2),
        ("id_00000002", "train", 2),
        ("id_00000007", "query", 1),
        ("id_00000007", "gallery", 2),
        ("id_00000004", "query", 1),
        ("id_00000004", "gallery", 1),
    ]
    members, lines, rows, items = {}, [], [], []
    label = {"id_00000002": 0, "id_00000009": 1, "id_00000004": 2, "id_00000007": 3}
    k = 0
    for item, status, n in spec:
        for j in range(n):
            k += 1
            name = f"img/WOMEN/Dresses/{item}/{k:02d}_{j + 1}_front.jpg"
            members[name] = tiny_jpeg(300 + k)
            lines.append(f"{name}  {item}  {status}")
            rows.append((f"Img/{name}", label[item], status))
            items.append(item)
    part = f"{len(lines)}\nimage_name item_id evaluation_status\n" + "\n".join(lines) + "\n"
    return TinyDataset("inshop", {"img.zip": make_zip(members), "list_eval_partition.txt": part.encode()}, rows, items)


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    """An uncompressed IDX file: big-endian uint32 magic and dims, then the uint8 data."""
    head = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return head + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def tiny_mnist(name: str = "mnist", train_per_class: int = 3, test_per_class: int = 2) -> TinyDataset:
    """The four MNIST .gz files (in the release's order) with random 28x28 images, 3 per class in
    train and 2 in test by default, classes interleaved as in the release; ``pixels``: manifest path -> image."""
    files, rows, pixels = {}, [], {}
    for seed, (split, prefix, per_class) in enumerate(
        (("train", "train", train_per_class), ("test", "t10k", test_per_class))
    ):
        rng = np.random.default_rng(seed)
        labels = np.concatenate([rng.permutation(10) for _ in range(per_class)]).astype(np.uint8)
        images = rng.integers(0, 256, (len(labels), 28, 28), dtype=np.uint8)
        images[:, 0, :2] = (0, 255)  # both extremes in every image
        files[f"{prefix}-images-idx3-ubyte.gz"] = gz(idx_bytes(images, 2051))
        files[f"{prefix}-labels-idx1-ubyte.gz"] = gz(idx_bytes(labels, 2049))
        for i, (img, lab) in enumerate(zip(images, labels.tolist())):
            path = f"images/{split}/{lab}/{i:05d}.png"
            rows.append((path, lab, split))
            pixels[path] = img
    return TinyDataset(name, files, rows, pixels=pixels)


TINY = {"cub200": tiny_cub, "cars196": tiny_cars, "sop": tiny_sop, "inshop": tiny_inshop}


# ------------------------------------------------------------------------------ HTTP server
class FileServer:
    """Serves ``files`` (path -> bytes). Behaviour per path in ``mode``:
    ok (Range supported) | norange (ignores Range) | half (half the body, then close) |
    half_once (half the first time, then ok) | error500."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.mode: dict[str, str] = {}
        self.requests: list[tuple[str, str | None]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                path = self.path.lstrip("/")
                rng = self.headers.get("Range")
                server.requests.append((path, rng))
                if path not in server.files:
                    self.send_error(404)
                    return
                data, mode = server.files[path], server.mode.get(path, "ok")
                if mode == "error500":
                    self.send_error(500, "boom")
                    return
                start = 0
                if rng and mode != "norange" and rng.startswith("bytes="):
                    start = int(rng[6:].split("-")[0])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                if mode == "half" or (mode == "half_once" and sum(p == path for p, _ in server.requests) == 1):
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = FileServer()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch):
    """Keep retry back-off short in tests (the logic is the same)."""
    import dmlrepro.data.download as d

    orig = d.download

    def fast(*a, **k):
        k.setdefault("backoff", 0.01)
        k.setdefault("progress", False)
        return orig(*a, **k)

    monkeypatch.setattr(d, "download", fast)
    import dmlrepro.data.benchmarks as b

    monkeypatch.setattr(b, "download", fast)
