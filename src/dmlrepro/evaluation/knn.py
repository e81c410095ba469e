"""Exact k-nearest-neighbour search in query chunks, on one of three backends, with one ranking rule.

**Ranking rule (every backend).** Neighbours are ranked by their float32 score — the squared L2
distance for ``distance="euclidean"``, the negated cosine similarity for ``"cosine"`` — and exact
ties by the smaller reference index. In leave-one-out search (``reference=None``) the query's own
row is removed by *index* (an exact duplicate of the query is a legitimate neighbour); the result
is the k first of the other items in that order. See docs/evaluation.md.

**Backends.** ``torch``: chunked matrix products + ``torch.topk`` on the embeddings' device (CPU or
CUDA). ``faiss-cpu``: faiss ``IndexFlatL2``/``IndexFlatIP``. ``faiss-gpu``: the same index on a GPU,
used only after a probe search in a subprocess succeeded on that GPU (a faiss wheel without
kernels for the GPU's architecture aborts the process, which no in-process fallback can catch);
only on request: dmlrepro installs no faiss GPU build. ``auto``: faiss-cpu on the CPU, torch on CUDA (exact,
and at SOP size far faster than faiss-cpu: docs/benchmarks.md#gpu-numbers-so-far). Each backend returns
the k + 1 best candidates (the one after the k-th only shows whether a tie group crosses the k boundary);
:func:`_canonical` orders them by the rule, and rows whose k-th and (k+1)-th scores are equal are recomputed
by :func:`exact_topk` (int64 keys = score bits ‖ index, exact). Both faiss and torch compute float32 scores,
so results are identical whenever their scores are (e.g. coordinates on a binary lattice, exact duplicates);
otherwise two float32 implementations may order near-ties (relative gaps ~1e-7) differently.

**Precision.** The torch backend's matrix products run in exact float32 whatever the run trains in
(:func:`exact_float32`: TF32 off for the product, restored after), so a run's metrics, its model
selection and ``dmlrepro evaluate`` rank the same neighbours on every GPU (docs/evaluation.md#precision).

Memory stays O(N·D + chunk·N) for torch and O(N·D + chunk·k) for faiss: no N×N matrix.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dmlrepro.config_names import KNN_BACKENDS
from dmlrepro.ieee_float32 import exact_float32

log = logging.getLogger(__name__)

DISTANCES = ("euclidean", "cosine")
BACKENDS = KNN_BACKENDS  # the config check's choices, torch-free in dmlrepro.config_names

# faiss GPU flat search supports k <= 2048 (faiss/gpu/utils/DeviceDefs.cuh, CUDA >= 9.5).
FAISS_GPU_MAX_K = 2048

# faiss chunk: about 2**22 result entries (~50 MB of int64 indices + float32 scores), at most
# 16384 and at least 256 query rows.
_CHUNK_ELEMENTS = 2**22
_CHUNK_MAX_ROWS = 16384
_CHUNK_MIN_ROWS = 256
# torch chunk: the (chunk × N) float32 score matrix holds about this many entries.
# CPU: 2**26 (256 MiB; 1,109 query rows at SOP size: with smaller chunks the matrix product runs slower
# than faiss's, docs/benchmarks.md#retrieval-backends-torch-vs-faiss-cpu); CUDA: 2**27 (512 MiB).
_TORCH_CHUNK_ELEMENTS = {"cpu": 2**26, "cuda": 2**27}

# The probe run in a fresh interpreter: a tiny exact search on GPU argv[1]; prints "ok" if right.
_PROBE_CODE = """
import sys
import numpy as np
import faiss
gpu = int(sys.argv[1])
x = np.eye(16, 8, dtype="float32") * np.arange(1, 17, dtype="float32")[:, None]
res = faiss.StandardGpuResources()
index = faiss.index_cpu_to_gpu(res, gpu, faiss.IndexFlatL2(8))
index.add(x)
_, i = index.search(x, 1)
print("ok" if (i[:, 0] == np.arange(16)).all() else "wrong")
"""
_PROBE_TIMEOUT_S = 300
_probe_cache: dict[int, bool] = {}


def import_faiss() -> Any:
    """Import faiss, or fail with a message naming the extras that provide it."""
    try:
        import faiss  # noqa: PLC0415  (lazy on purpose: faiss is an optional extra)
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "dmlrepro.evaluation needs faiss for exact k-NN search on the CPU and k-means: "
            "`pip install 'dmlrepro[cpu]'` (faiss-cpu; also on GPU machines, where k-NN runs in torch)"
        ) from err
    return faiss


def _is_torch_tensor(x: Any) -> bool:
    return torch.is_tensor(x)


def to_float32_matrix(x: Any, name: str = "embeddings") -> np.ndarray:
    """A C-contiguous float32 (N, D) numpy copy/view of a torch tensor or array-like.

    Raises ValueError for a wrong shape, an empty set or non-finite values (a diverged run must
    fail loudly instead of producing meaningless neighbours).
    """
    if _is_torch_tensor(x):
        x = x.detach().to("cpu").float().numpy()
    arr = np.ascontiguousarray(np.asarray(x), dtype=np.float32)
    _check_matrix(arr, name)
    if not np.isfinite(arr).all():
        bad = int((~np.isfinite(arr).all(axis=1)).sum())
        raise ValueError(f"{name} contains NaN or Inf in {bad} of {arr.shape[0]} rows")
    return arr


def _check_matrix(arr: Any, name: str) -> None:
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (N, D) array, got shape {tuple(arr.shape)}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(arr.shape)})")


def to_float32_tensor(x: Any, device: Any, name: str = "embeddings"):
    """A contiguous float32 (N, D) torch tensor on ``device`` (no copy if it is one already),
    with the checks of :func:`to_float32_matrix`."""
    if not _is_torch_tensor(x):
        x = torch.from_numpy(to_float32_matrix(x, name))
    t = x.detach().to(device=device, dtype=torch.float32).contiguous()
    _check_matrix(t, name)
    finite = torch.isfinite(t).all(dim=1)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        raise ValueError(f"{name} contains NaN or Inf in {bad} of {t.shape[0]} rows")
    return t


def to_label_vector(y: Any, n: int, name: str = "labels") -> np.ndarray:
    """A 1-D numpy array of labels of length ``n`` (torch tensors are moved to the CPU)."""
    if _is_torch_tensor(y):
        y = y.detach().to("cpu").numpy()
    arr = np.asarray(y)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.shape[0] != n:
        raise ValueError(f"{name} has {arr.shape[0]} entries but there are {n} embeddings")
    return arr


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Row-wise L2 normalisation in float32 (rows of norm < eps are divided by eps, like
    ``torch.nn.functional.normalize``)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norms, eps)).astype(np.float32, copy=False)


def default_chunk_size(k: int) -> int:
    """faiss query rows per chunk for a search of depth ``k``."""
    return int(min(_CHUNK_MAX_ROWS, max(_CHUNK_MIN_ROWS, _CHUNK_ELEMENTS // max(1, k))))


def torch_chunk_size(n_reference: int, device: Any) -> int:
    """torch query rows per chunk: the (chunk × N) score matrix has ~2**26 (CPU, 256 MiB) / 2**27
    (CUDA, 512 MiB) entries."""
    budget = _TORCH_CHUNK_ELEMENTS["cuda" if str(device).startswith("cuda") else "cpu"]
    return max(1, budget // max(1, n_reference))


# -- backend choice -------------------------------------------------------------------------------


def work_device(device: Any, inputs: tuple[Any, ...]):
    """The torch device the search runs on: ``device`` if given ("cpu", "cuda", "cuda:i", int,
    torch.device), else the device of the first torch-tensor input, else the CPU."""
    if device is None:
        for x in inputs:
            if _is_torch_tensor(x):
                return x.device
        return torch.device("cpu")
    if isinstance(device, int) and not isinstance(device, bool):
        device = f"cuda:{device}"
    text = str(device)
    if text != "cpu" and not text.startswith("cuda"):
        raise ValueError(f"device must be None, 'cpu', 'cuda' or 'cuda:<i>', got {device!r}")
    dev = torch.device(text)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was requested but torch sees no CUDA GPU; pass device='cpu'")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _faiss_or_none() -> Any:
    try:
        return import_faiss()
    except ImportError:
        return None


def faiss_gpu_count(faiss: Any) -> int:
    return int(faiss.get_num_gpus()) if faiss is not None and hasattr(faiss, "StandardGpuResources") else 0


def faiss_gpu_usable(gpu: int) -> bool:
    """Whether a faiss search on GPU ``gpu`` works, decided once per process by a probe search in
    a subprocess (an architecture without kernels in the wheel aborts that subprocess, not this one)."""
    if gpu not in _probe_cache:
        _probe_cache[gpu] = _run_probe(gpu)
    return _probe_cache[gpu]


def _run_probe(gpu: int) -> bool:
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE_CODE, str(gpu)], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        log.warning("faiss GPU probe on GPU %d failed to run (%s): k-NN search uses torch", gpu, err)
        return False
    ok = out.returncode == 0 and out.stdout.strip().endswith("ok")
    if not ok:
        tail = (out.stderr or out.stdout).strip()[-300:]
        log.warning(
            "faiss GPU probe on GPU %d failed (exit status %s: %s): k-NN search uses torch", gpu, out.returncode, tail
        )
    return ok


def resolve_backend(backend: str, dev: Any, search_k: int) -> str:
    """The concrete backend ("torch", "faiss-cpu" or "faiss-gpu") for a search of depth
    ``search_k`` on torch device ``dev``; an explicit request that cannot run is a ValueError."""
    if backend not in BACKENDS:
        raise ValueError(f"knn backend must be one of {BACKENDS}, got {backend!r}")
    on_cuda = dev.type == "cuda"
    if backend == "auto":
        return auto_backend(dev.type, faiss_installed=not on_cuda and _faiss_or_none() is not None)
    if backend == "torch":
        return "torch"
    if backend == "faiss-cpu":
        import_faiss()
        return "faiss-cpu"
    faiss, gpu = import_faiss(), dev.index if on_cuda else 0  # "faiss-gpu": a faiss GPU build the user installed
    if faiss_gpu_count(faiss) <= gpu:
        raise ValueError(
            f"knn backend 'faiss-gpu' on GPU {gpu} was requested but faiss sees "
            f"{faiss_gpu_count(faiss)} GPU(s); use 'torch' (or install a faiss GPU build)"
        )
    if search_k > FAISS_GPU_MAX_K:
        raise ValueError(f"knn backend 'faiss-gpu' cannot search k = {search_k} > {FAISS_GPU_MAX_K}")
    if not faiss_gpu_usable(gpu):
        raise ValueError(f"knn backend 'faiss-gpu': the probe search on GPU {gpu} failed (see the log)")
    return "faiss-gpu"


def auto_backend(device_type: str, faiss_installed: bool) -> str:
    """`auto`: torch on a GPU (exact, no faiss GPU build to install), faiss-cpu on the CPU where it is installed."""
    if device_type == "cpu" and faiss_installed:
        return "faiss-cpu"
    return "torch"


# -- precision ------------------------------------------------------------------------------------

#: the precision of every search's scores (metrics.json's ``precision.search``)
SEARCH_PRECISION = "float32"


# -- the ranking rule -----------------------------------------------------------------------------


def _costs(scores, distance: str):
    """Ascending ranking cost of faiss/torch scores: squared distance, or −similarity (exact)."""
    return scores if distance == "euclidean" else -scores


def _sort_keys(cost, index):
    """int64 keys ordering (cost, index) lexicographically: the float32 cost's bits mapped to an
    order-preserving int32 (−0 folded onto +0), times 2**32, plus the index (< 2**31)."""
    bits = (cost.float() + 0.0).contiguous().view(torch.int32)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)
    return ordered * 2**32 + index.to(torch.int64)


def _canonical(cost, index, k: int):
    """Candidates sorted by cost (any order within ties) → sorted by the rule. Returns the first
    k (cost, index) and a bool mask of the rows whose k-th and (k+1)-th cost tie (their k set
    depends on items the backend may not have returned)."""
    tied = (cost[:, 1:] == cost[:, :-1]).any(dim=1) if cost.shape[1] > 1 else None
    if tied is not None and bool(tied.any()):  # reorder only the rows with ties, by index
        rows = torch.nonzero(tied).flatten()
        order = torch.argsort(_sort_keys(cost[rows], index[rows]), dim=1)
        cost, index = cost.clone(), index.clone()
        cost[rows] = torch.gather(cost[rows], 1, order)
        index[rows] = torch.gather(index[rows], 1, order)
    if cost.shape[1] > k:
        ambiguous = cost[:, k - 1] == cost[:, k]
    else:
        ambiguous = torch.zeros(cost.shape[0], dtype=torch.bool, device=cost.device)
    return cost[:, :k], index[:, :k], ambiguous


def exact_topk(cost_rows, k: int):
    """The rule applied literally to full cost rows (r × N): the k smallest (cost, index) keys,
    in order; batched so that the int64 keys stay within the torch chunk budget."""
    out_c, out_i = [], []
    step = torch_chunk_size(cost_rows.shape[1], cost_rows.device)
    for s in range(0, cost_rows.shape[0], step):
        block = cost_rows[s : s + step]
        index = torch.arange(block.shape[1], device=block.device).expand_as(block)
        idx = torch.topk(_sort_keys(block, index), k, dim=1, largest=False, sorted=True).values & 0xFFFFFFFF
        out_c.append(torch.gather(block, 1, idx))
        out_i.append(idx)
    return torch.cat(out_c), torch.cat(out_i)


@dataclass
class Search:
    """A prepared search: float32 query/reference tensors on ``dev`` (unit rows for cosine)."""

    q: Any
    r: Any
    r_sq: Any
    distance: str
    self_search: bool
    dev: Any

    @property
    def n_candidates(self) -> int:
        return self.r.shape[0] - int(self.self_search)

    def cost_rows(self, rows):
        """(len(rows) × N) float32 cost of query rows ``rows`` (a slice, or a tensor of global
        query indices) against every reference row; the query itself at +inf in leave-one-out."""
        qr = self.q[rows]
        with exact_float32():
            if self.distance == "cosine":
                cost = torch.mm(qr, self.r.T).neg_()
            else:
                cost = torch.addmm(self.r_sq[None, :], qr, self.r.T, alpha=-2.0)
        if self.distance == "euclidean":
            cost.add_((qr * qr).sum(1, keepdim=True)).clamp_min_(0.0)
        if self.self_search:
            own = torch.arange(rows.start, rows.stop, device=cost.device) if isinstance(rows, slice) else rows
            cost[torch.arange(qr.shape[0], device=cost.device), own] = float("inf")
        return cost


def prepare_search(query: Any, reference: Any, distance: str, device: Any) -> Search:
    """Check and move the inputs (see :func:`iter_knn_torch`)."""
    if distance not in DISTANCES:
        raise ValueError(f"distance must be one of {DISTANCES}, got {distance!r}")
    dev = work_device(device, (query, reference))
    self_search = reference is None
    q = to_float32_tensor(query, dev, "embeddings" if self_search else "query embeddings")
    if self_search:
        if q.shape[0] < 2:
            raise ValueError("k-NN within one set needs at least 2 embeddings")
        r = q
    else:
        r = to_float32_tensor(reference, dev, "reference embeddings")
        if r.shape[1] != q.shape[1]:
            raise ValueError(f"query dimension {q.shape[1]} differs from reference dimension {r.shape[1]}")
    if distance == "cosine":
        q = torch.nn.functional.normalize(q, dim=1)
        r = q if self_search else torch.nn.functional.normalize(r, dim=1)
    r_sq = (r * r).sum(1) if distance == "euclidean" else None
    return Search(q, r, r_sq, distance, self_search, dev)


def topk_chunks(search: Search, k: int, backend: str, chunk_size: int | None = None):
    """Yield ``(start, stop, cost, index, full)`` per query chunk: the k first neighbours by the
    rule (``k`` <= number of candidates) and, for the torch backend, the chunk's full cost matrix
    (None for faiss). ``backend``: a concrete one (:func:`resolve_backend`)."""
    m = min(k + 1, search.n_candidates)  # one more than k shows a tie group crossing the boundary
    if backend == "torch":
        chunk = int(chunk_size) if chunk_size is not None else torch_chunk_size(search.r.shape[0], search.dev)
    else:
        chunk = int(chunk_size) if chunk_size is not None else default_chunk_size(m + 1)
    if chunk < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if backend == "torch":
        candidates = _torch_candidates(search, m, chunk)
    else:
        gpu = (search.dev.index if search.dev.type == "cuda" else 0) if backend == "faiss-gpu" else None
        candidates = _faiss_candidates(search, m, chunk, gpu)
    for start, stop, cost, idx, full in candidates:
        cost, idx, ambiguous = _canonical(cost, idx, k)
        if bool(ambiguous.any()):  # a tie group crosses the k boundary: apply the rule literally
            rows = torch.nonzero(ambiguous).flatten()
            rows_dev = rows.to(search.dev)
            full_rows = full[rows_dev] if full is not None else search.cost_rows(rows_dev + start)
            c2, i2 = exact_topk(full_rows, k)
            cost, idx = cost.clone(), idx.clone()
            cost[rows], idx[rows] = c2.to(cost.device), i2.to(idx.device)
        yield start, stop, cost, idx, full


def _torch_candidates(search: Search, m: int, chunk: int):
    for start in range(0, search.q.shape[0], chunk):
        stop = min(start + chunk, search.q.shape[0])
        full = search.cost_rows(slice(start, stop))
        cost, idx = torch.topk(full, m, dim=1, largest=False, sorted=True)
        yield start, stop, cost, idx, full


def _faiss_candidates(search: Search, m: int, chunk: int, gpu: int | None):
    faiss = import_faiss()
    qn = search.q.detach().cpu().numpy()
    rn = qn if search.self_search else search.r.detach().cpu().numpy()
    index = faiss.IndexFlatL2(rn.shape[1]) if search.distance == "euclidean" else faiss.IndexFlatIP(rn.shape[1])
    res = None
    if gpu is not None:
        res = faiss.StandardGpuResources()  # noqa: F841  (kept alive as long as the index)
        index = faiss.index_cpu_to_gpu(res, gpu, index)
    index.add(rn)
    search_m = min(m + 1, rn.shape[0]) if search.self_search else m
    try:
        for start in range(0, qn.shape[0], chunk):
            stop = min(start + chunk, qn.shape[0])
            scores, indices = index.search(qn[start:stop], search_m)
            indices = indices.astype(np.int64, copy=False)
            if search.self_search:
                indices, scores = _drop_self(indices, scores, start)
                indices, scores = indices[:, :m], scores[:, :m]
            cost = _costs(torch.from_numpy(np.ascontiguousarray(scores)), search.distance)
            yield start, stop, cost, torch.from_numpy(np.ascontiguousarray(indices)), None
    finally:
        index.reset()


def _drop_self(indices: np.ndarray, scores: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
    """Remove each row's own index (row r of the chunk is item start+r); drop the last column
    for rows whose own index was not returned."""
    n, kp1 = indices.shape
    own = np.arange(start, start + n, dtype=indices.dtype)[:, None]
    is_self = indices == own
    # If a row contains its own index more than once (impossible for a flat index) keep one drop.
    first = np.argmax(is_self, axis=1)
    has_self = is_self[np.arange(n), first]
    drop = np.where(has_self, first, kp1 - 1)
    keep = np.ones((n, kp1), dtype=bool)
    keep[np.arange(n), drop] = False
    return indices[keep].reshape(n, kp1 - 1), scores[keep].reshape(n, kp1 - 1)


# -- public search --------------------------------------------------------------------------------


def iter_knn_torch(
    query: Any,
    k: int,
    reference: Any = None,
    *,
    distance: str = "euclidean",
    device: Any = None,
    backend: str = "auto",
    chunk_size: int | None = None,
) -> Iterator[tuple[int, int, Any, Any]]:
    """Yield ``(start, stop, scores, indices)`` torch tensors for consecutive query chunks.

    ``reference=None`` searches the query set against itself without the query (``k`` is
    clamped to N-1); with a reference set ``k`` is clamped to its size. ``scores`` are squared L2
    distances (ascending) for ``distance="euclidean"`` and cosine similarities (descending) for
    ``"cosine"``; ``indices`` are int64 rows of the reference, in the order of the ranking rule
    (module docstring). Euclidean uses the vectors as given (RSW evaluates unnormalised ones);
    cosine L2-normalises them. The search runs on ``device`` (default: the first torch input's
    device, else the CPU; :func:`work_device`); results are on it for the torch backend and on
    the CPU for faiss. ``backend``: one of :data:`BACKENDS`.
    """
    search = prepare_search(query, reference, distance, device)
    k = min(int(k), search.n_candidates)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    chosen = resolve_backend(backend, search.dev, min(k + 1, search.n_candidates) + int(search.self_search))
    log.debug("k-NN: backend %s on %s, k = %d, %d queries", chosen, search.dev, k, search.q.shape[0])
    for start, stop, cost, idx, _ in topk_chunks(search, k, chosen, chunk_size):
        yield start, stop, _costs(cost, distance), idx


def iter_knn(
    query: Any,
    k: int,
    reference: Any = None,
    *,
    distance: str = "euclidean",
    device: Any = None,
    backend: str = "auto",
    chunk_size: int | None = None,
) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """:func:`iter_knn_torch` with numpy ``scores`` (float32) and ``indices`` (int64)."""
    for start, stop, s, i in iter_knn_torch(
        query, k, reference, distance=distance, device=device, backend=backend, chunk_size=chunk_size
    ):
        yield start, stop, s.cpu().numpy(), i.cpu().numpy()


def knn_search(
    query: Any,
    k: int,
    reference: Any = None,
    *,
    distance: str = "euclidean",
    device: Any = None,
    backend: str = "auto",
    chunk_size: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """All neighbours at once: ``(scores, indices)``, each (N_query, k). O(N·k) memory.

    Same semantics as :func:`iter_knn_torch` (self-exclusion when ``reference is None``).
    """
    parts_s, parts_i = [], []
    for _, _, s, i in iter_knn(
        query, k, reference, distance=distance, device=device, backend=backend, chunk_size=chunk_size
    ):
        parts_s.append(s)
        parts_i.append(i)
    return np.concatenate(parts_s), np.concatenate(parts_i)
