"""Exact k-nearest-neighbour search on faiss, in query chunks, with self-exclusion by index.

Memory stays O(N·D + chunk·k): faiss computes distances block-wise internally
(``IndexFlatL2``/``IndexFlatIP`` never materialise the N×N matrix) and this module only ever
holds the (chunk × (k+1)) result arrays of the current chunk.

Self-exclusion (query set == reference set) follows pytorch-metric-learning's
``inference.return_results``: search k+1 neighbours, drop the neighbour whose *index* equals the
query's own row; if the query's own index is not among the k+1 returned neighbours (exact ties
or duplicate vectors pushed it out), drop the last neighbour instead. The query itself therefore
never counts, while an exact duplicate of the query does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

DISTANCES = ("euclidean", "cosine")

# faiss GPU flat search supports k <= 2048 (faiss/gpu/utils/DeviceDefs.cuh, CUDA >= 9.5).
FAISS_GPU_MAX_K = 2048

# Default chunk: about 2**22 result entries (~50 MB of int64 indices + float32 scores), at most
# 16384 and at least 256 query rows.
_CHUNK_ELEMENTS = 2**22
_CHUNK_MAX_ROWS = 16384
_CHUNK_MIN_ROWS = 256


def import_faiss() -> Any:
    """Import faiss, or fail with a message naming the extras that provide it."""
    try:
        import faiss  # noqa: PLC0415  (lazy on purpose: faiss is an optional extra)
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "dmlrepro.evaluation needs faiss for exact k-NN search and k-means. Install one "
            "flavour: `pip install 'dmlrepro[cpu]'` (faiss-cpu) or `pip install 'dmlrepro[gpu]'` "
            "(faiss-gpu-cu12); never both."
        ) from err
    return faiss


def _is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def is_cuda_tensor(x: Any) -> bool:
    return _is_torch_tensor(x) and bool(getattr(x, "is_cuda", False))


def to_float32_matrix(x: Any, name: str = "embeddings") -> np.ndarray:
    """A C-contiguous float32 (N, D) numpy copy/view of a torch tensor or array-like.

    Raises ValueError for a wrong shape, an empty set or non-finite values (a diverged run must
    fail loudly instead of producing meaningless neighbours).
    """
    if _is_torch_tensor(x):
        x = x.detach().to("cpu").float().numpy()
    arr = np.ascontiguousarray(np.asarray(x), dtype=np.float32)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (N, D) array, got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape})")
    if not np.isfinite(arr).all():
        bad = int((~np.isfinite(arr).all(axis=1)).sum())
        raise ValueError(f"{name} contains NaN or Inf in {bad} of {arr.shape[0]} rows")
    return arr


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
    return int(min(_CHUNK_MAX_ROWS, max(_CHUNK_MIN_ROWS, _CHUNK_ELEMENTS // max(1, k))))


def _resolve_gpu(device: Any, inputs: tuple[Any, ...], faiss: Any) -> int | None:
    """GPU id to search on, or None for the CPU.

    ``device=None``: GPU iff faiss was built with GPU support, sees a GPU, and the (first) input
    is a CUDA tensor. ``device="cpu"``: CPU. ``device="cuda"``/``"cuda:i"``/int/torch.device:
    that GPU, or a ValueError if faiss cannot use GPUs.
    """
    faiss_gpus = faiss.get_num_gpus() if hasattr(faiss, "StandardGpuResources") else 0
    if device is None:
        if faiss_gpus > 0 and any(is_cuda_tensor(x) for x in inputs):
            for x in inputs:
                if is_cuda_tensor(x):
                    return int(x.device.index or 0)
        if any(is_cuda_tensor(x) for x in inputs):
            log.info("inputs are on CUDA but faiss has no GPU support: k-NN search runs on CPU")
        return None
    text = str(device)
    if text == "cpu":
        return None
    if isinstance(device, int):
        gpu = device
    elif text.startswith("cuda"):
        gpu = int(text.split(":", 1)[1]) if ":" in text else 0
    else:
        raise ValueError(f"device must be None, 'cpu', 'cuda' or 'cuda:<i>', got {device!r}")
    if faiss_gpus <= gpu:
        raise ValueError(
            f"device={device!r} was requested but faiss sees {faiss_gpus} GPU(s); install "
            "'dmlrepro[gpu]' (faiss-gpu-cu12) or pass device='cpu'"
        )
    return gpu


def _build_index(reference: np.ndarray, distance: str, gpu: int | None, k: int, faiss: Any):
    """Flat (exact) index over ``reference``; returns ``(index, gpu_resources_or_None)`` — the
    caller keeps the resources alive as long as the index."""
    d = reference.shape[1]
    index = faiss.IndexFlatL2(d) if distance == "euclidean" else faiss.IndexFlatIP(d)
    res = None
    if gpu is not None:
        if k <= FAISS_GPU_MAX_K:
            res = faiss.StandardGpuResources()
            index = faiss.index_cpu_to_gpu(res, gpu, index)
        else:
            log.warning(
                "k-NN search needs k=%d > %d, the faiss GPU maximum: searching on CPU",
                k,
                FAISS_GPU_MAX_K,
            )
    index.add(reference)
    return index, res


def _drop_self(
    indices: np.ndarray, scores: np.ndarray, start: int
) -> tuple[np.ndarray, np.ndarray]:
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


def iter_knn(
    query: Any,
    k: int,
    reference: Any = None,
    *,
    distance: str = "euclidean",
    device: Any = None,
    chunk_size: int | None = None,
) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """Yield ``(start, stop, scores, indices)`` for consecutive query chunks.

    ``reference=None`` searches the query set against itself with self-exclusion (see module
    docstring); ``k`` is then clamped to N-1. With a separate reference set ``k`` is clamped to
    its size. ``scores`` are squared L2 distances (ascending) for ``distance="euclidean"`` and
    cosine similarities (descending) for ``"cosine"``; ``indices`` are int64 rows of the reference.
    Embeddings are used as given for "euclidean" (RSW evaluates unnormalised vectors) and
    L2-normalised for "cosine".
    """
    if distance not in DISTANCES:
        raise ValueError(f"distance must be one of {DISTANCES}, got {distance!r}")
    faiss = import_faiss()
    gpu = _resolve_gpu(device, (query, reference), faiss)
    q = to_float32_matrix(query, "query embeddings" if reference is not None else "embeddings")
    self_search = reference is None
    if self_search:
        if q.shape[0] < 2:
            raise ValueError("k-NN within one set needs at least 2 embeddings")
        r = q
        k = min(int(k), q.shape[0] - 1)
    else:
        r = to_float32_matrix(reference, "reference embeddings")
        if r.shape[1] != q.shape[1]:
            raise ValueError(
                f"query dimension {q.shape[1]} differs from reference dimension {r.shape[1]}"
            )
        k = min(int(k), r.shape[0])
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if distance == "cosine":
        q = l2_normalize(q)
        r = q if self_search else l2_normalize(r)
    search_k = k + 1 if self_search else k
    chunk = int(chunk_size) if chunk_size is not None else default_chunk_size(search_k)
    if chunk < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    index, _gpu_resources = _build_index(r, distance, gpu, search_k, faiss)
    try:
        for start in range(0, q.shape[0], chunk):
            stop = min(start + chunk, q.shape[0])
            scores, indices = index.search(q[start:stop], search_k)
            indices = indices.astype(np.int64, copy=False)
            if self_search:
                indices, scores = _drop_self(indices, scores, start)
            yield start, stop, scores, indices
    finally:
        index.reset()


def knn_search(
    query: Any,
    k: int,
    reference: Any = None,
    *,
    distance: str = "euclidean",
    device: Any = None,
    chunk_size: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """All neighbours at once: ``(scores, indices)``, each (N_query, k). O(N·k) memory.

    Same semantics as :func:`iter_knn` (self-exclusion when ``reference is None``).
    """
    parts_s, parts_i = [], []
    for _, _, s, i in iter_knn(
        query, k, reference, distance=distance, device=device, chunk_size=chunk_size
    ):
        parts_s.append(s)
        parts_i.append(i)
    return np.concatenate(parts_s), np.concatenate(parts_i)
