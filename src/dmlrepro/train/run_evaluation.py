"""Evaluation inside a run: test-set embeddings of a model, their metrics (retrieval, NMI, the
corrupted test sets of RSW Table IV), the final metrics.json, and ``evaluate_run``: (re)compute a
run's metrics.json. The metric computations themselves are ``dmlrepro.evaluation``'s."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from dmlrepro.asap.normalisation import normalize_array
from dmlrepro.atomic import write_json_atomic
from dmlrepro.data.corruptions import build_corruption
from dmlrepro.evaluation import (
    evaluate_embeddings_file,
    retrieval_metrics,
    retrieval_metrics_query_gallery,
    save_embeddings,
)
from dmlrepro.evaluation.clustering import nmi_from_config

from .checkpoint import CheckpointError, list_checkpoints, read_checkpoint
from .config import corruption_suffix, load_run_config, resolve_run_config
from .embedder import embed_batches
from .model_and_loss import build_run_model
from .run_data import build_datasets, build_gallery, build_test_corrupted, loader_generator, open_manifest, worker_init
from .runtime import evaluation_device, run_device
from .state import EMBEDDINGS_FILE, RunDir

log = logging.getLogger(__name__)


def compute_embeddings(
    model,
    ds,
    *,
    batch_size: int,
    device: torch.device,
    num_workers: int = 0,
    progress: bool = False,
    desc: str = "embed",
    on_device: bool = False,
    stop: Any = None,
):
    """Embeddings computed in float32 (:func:`~dmlrepro.train.embedder.embed_batches`; numpy,
    or with ``on_device`` a tensor left on ``device``, for the metrics to search there), labels
    and manifest rows of every item of ``ds``, in order, through a loader of ``num_workers``
    workers (pinned memory on CUDA). A true `stop` (the run's stop flag) after a batch abandons
    the pass: :class:`~dmlrepro.train.embedder.EmbeddingInterrupted`."""
    loader = DataLoader(
        ds,
        batch_size=batch_size,
        shuffle=False,
        num_workers=num_workers,
        worker_init_fn=worker_init if num_workers else None,
        generator=loader_generator(0, 0, 17),
        pin_memory=device.type == "cuda",
    )
    batches = tqdm(loader, desc=desc, disable=not progress, leave=False, dynamic_ncols=True)
    emb, labels = embed_batches(model, batches, device, desc=desc, stop=stop)
    return (emb if on_device else emb.cpu().numpy()), labels.numpy(), np.asarray(ds.rows, dtype=np.int64)


def embedding_metrics(
    emb: np.ndarray | torch.Tensor,
    labels: np.ndarray,
    cfg: dict[str, Any],
    gallery: tuple[np.ndarray, np.ndarray] | None = None,
    *,
    with_nmi: bool = True,
) -> dict[str, float] | None:
    """Retrieval metrics (+ NMI where `eval.nmi` asks and `with_nmi`) on the given embeddings, or of
    the queries `emb` against `gallery` = (embeddings, labels); None if any value is not finite. The
    k-NN search runs where `emb` is (a device tensor from ``compute_embeddings(on_device=True)``: that
    device) with the backend ``speed.knn_backend`` (docs/evaluation.md#backends)."""
    if not _all_finite(emb) or (gallery is not None and not _all_finite(gallery[0])):
        return None
    e = cfg["eval"]
    if e.get("normalize", "none") != "none":  # ASAP §4.4: v / max(1, ‖v‖) before the distance
        emb = normalize_array(_host(emb), e["normalize"])
        gallery = None if gallery is None else (normalize_array(_host(gallery[0]), e["normalize"]), gallery[1])
    if gallery is None:
        metrics = dict(
            retrieval_metrics(emb, labels, ks=tuple(e["ks"]), distance=e["distance"], backend=knn_backend(cfg))
        )
    else:
        metrics = dict(
            retrieval_metrics_query_gallery(
                emb, labels, *gallery, ks=tuple(e["ks"]), distance=e["distance"], backend=knn_backend(cfg)
            )
        )
    if e["nmi"] and with_nmi:
        metrics["nmi"] = float(nmi_from_config(emb, labels, e["nmi"], seed=cfg["seed"]))
    return metrics


def knn_backend(cfg: dict[str, Any]) -> str:
    """The run's k-NN backend (runtime key ``speed.knn_backend``; "auto" for configs without it)."""
    return (cfg.get("speed") or {}).get("knn_backend", "auto")


def _all_finite(x) -> bool:
    return bool(torch.isfinite(x).all()) if torch.is_tensor(x) else bool(np.isfinite(x).all())


def _host(x):
    return x.detach().cpu().numpy() if torch.is_tensor(x) else x


#: the seed of every corruption's per-image draw: the same corrupted test images for every run
CORRUPTION_SEED = 0


def corruption_metrics(
    model, cfg: dict[str, Any], manifest, *, device: torch.device, progress: bool = False, stop: Any = None
) -> dict[str, float | None]:
    """Test metrics of `model` with every test image corrupted by each `eval.corruptions` entry
    (RSW Table IV: train clean, evaluate corrupted), flat: `<metric>@<name>_<severity>` (e.g.
    `recall@1@gaussian_3`; `<metric>@<name>` for imgaug's default range). The retrieval metrics
    only: Table IV prints R@1, and NMI's k-means would cost more than the rest. A corruption whose
    embeddings are not finite gives None for its metrics. The stop flag `stop` is honoured after
    every batch (:class:`~dmlrepro.train.embedder.EmbeddingInterrupted`)."""
    out: dict[str, float | None] = {}
    names = [f"recall@{k}" for k in cfg["eval"]["ks"]] + ["precision@1", "r_precision", "map@r"]
    ds = None  # each corruption's test set reuses the first one's decoded images
    for item in cfg["eval"]["corruptions"]:
        corruption = build_corruption(item["name"], severity=item["severity"], seed=CORRUPTION_SEED)
        ds = build_test_corrupted(cfg["dataset"], manifest, model, corruption, ds)
        emb, labels, _ = compute_embeddings(
            model,
            ds,
            batch_size=cfg["dataset"]["eval_batch_size"],
            device=device,
            num_workers=cfg["num_workers"],
            progress=progress,
            desc=f"eval test, {corruption_suffix(item)}",
            on_device=True,
            stop=stop,
        )
        metrics = embedding_metrics(emb, labels, cfg, with_nmi=False)
        suffix = corruption_suffix(item)
        for name in names if metrics is None else metrics:
            out[f"{name}@{suffix}"] = None if metrics is None else float(metrics[name])
    return out


def final_metrics(outdir: Path, cfg: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """metrics.json content from the saved embeddings (searched on the run's resolved device; the
    metrics are the same on every device, docs/evaluation.md#backends), merged with the run's
    record ``extra``."""
    e, rundir = cfg["eval"], RunDir(outdir)
    gallery = rundir.embeddings(gallery=True) if cfg["dataset"]["gallery_split"] else None
    res = evaluate_embeddings_file(
        rundir.embeddings(),
        None,
        ks=tuple(e["ks"]),
        distance=e["distance"],
        nmi=e["nmi"],
        nmi_seed=cfg["seed"],
        gallery_path=gallery,
        device=run_device(cfg),
        backend=knn_backend(cfg),
        normalize=e.get("normalize", "none"),
    )
    res.update(extra)
    write_json_atomic(rundir.metrics, res)
    return res


def evaluate_run(outdir, *, device: str | None = None, progress: bool | None = None) -> dict[str, Any]:
    """Recompute ``<outdir>/metrics.json`` from ``embeddings_test.npz``; if that file is missing,
    first recompute the embeddings from the selected model (``checkpoints/best_model.pt`` for
    ``eval.select: best_test``, ``best_val_model.pt`` for ``best_val``, else the final checkpoint). A diverged run
    has no final model: its recorded metrics.json is returned unchanged."""
    outdir = Path(outdir)
    rundir = RunDir(outdir)
    cfg = resolve_run_config(load_run_config(rundir.config))
    dev = evaluation_device(device, cfg["device"])
    cfg["device"] = str(dev)
    mpath = rundir.metrics
    record = json.loads(mpath.read_text()) if mpath.is_file() else {}
    if record.get("status") == "diverged":
        log.info("%s: the run diverged; its recorded metrics are kept", outdir)
        return record
    if not rundir.embeddings().is_file():
        model_state, epoch = _selected_model(rundir, cfg, record)
        _embed_test_sets(rundir, cfg, model_state, epoch, dev, bool(progress))
        record.setdefault("epoch", int(epoch))
    keep = {
        k: v
        for k, v in record.items()
        if k not in ("metrics", "num_items", "num_queries", "num_excluded_queries", "embeddings_file")
    }
    keep.setdefault("status", "completed")
    return final_metrics(outdir, cfg, keep)


def _embed_test_sets(
    rundir: RunDir, cfg: dict[str, Any], model_state: dict[str, Any], epoch: int, device: torch.device, progress: bool
) -> None:
    """The test (and gallery) embedding files of the model with weights `model_state`."""
    model = build_run_model(cfg)
    model.load_state_dict(model_state)
    model.to(device)
    manifest = open_manifest(cfg["dataset"])
    _, test_ds, _ = build_datasets(cfg["dataset"], manifest, model)
    meta = {"epoch": int(epoch), "select": cfg["eval"]["select"], "source": "evaluate_run"}
    sets = [(test_ds, rundir.embeddings(), cfg["dataset"]["test_split"])]
    gallery_ds = build_gallery(cfg["dataset"], manifest, model)
    if gallery_ds is not None:
        sets.append((gallery_ds, rundir.embeddings(gallery=True), cfg["dataset"]["gallery_split"]))
    for ds, path, split in sets:
        emb, labels, rows = compute_embeddings(
            model,
            ds,
            batch_size=cfg["dataset"]["eval_batch_size"],
            device=device,
            num_workers=cfg["num_workers"],
            progress=progress,
        )
        save_embeddings(path, emb, labels, rows, split=split, meta=meta)


def _selected_model(rundir: RunDir, cfg: dict[str, Any], record: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """(weights, epoch) of the model a run reports: its best model for ``best_test`` / ``best_val``,
    else the final checkpoint, read without renaming any. Neither left: FileNotFoundError, and a
    metrics.json saying "completed" is removed (nothing supports its numbers any more)."""
    select = cfg["eval"]["select"]
    best_file = rundir.best_model(select) if select in ("best_test", "best_val") else None
    if best_file and best_file.is_file():
        state = read_checkpoint(best_file)
        return state["model"], state["epoch"]
    found, unreadable = None, []
    for path in reversed(list_checkpoints(rundir.checkpoints)):
        try:
            found = read_checkpoint(path)
            break
        except (CheckpointError, OSError) as error:
            unreadable.append(f"{path.name}: {error}")
    if found is not None and found["position"]["epoch"] > cfg["epochs"]:
        return found["model"], cfg["epochs"]
    stale = record.get("status") == "completed"
    if stale:
        rundir.metrics.unlink()
    damaged = f" (unreadable: {'; '.join(unreadable)})" if unreadable else ""
    raise FileNotFoundError(
        f"{rundir.root}: no {EMBEDDINGS_FILE} and no final checkpoint{damaged}"
        f"{'; its metrics.json removed' if stale else ''}; "
        f"run `dmlrepro train {rundir.config} {rundir.root}` first"
    )
