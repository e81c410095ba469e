"""The model a completed run reports (``eval.select``) and what its metrics.json adds to it.

* ``last``: the final model; its test embeddings were saved by the last epoch's evaluation.
* ``best_test``: the evaluated epoch with the highest test Recall@1 (first on ties; Proxy-Anchor's
  code); its embeddings, saved when it was evaluated, move into place.
* ``best_val``: the best validation-metric model (``checkpoints/best_val_model.pt``), loaded and
  evaluated on the test split now.

Embeddings missing or damaged at the finish (a kill mid-write) are computed again where the model
is at hand (``last`` at the end of training, ``best_val``); ``best_test``'s cannot be.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable
from typing import Any

from dmlrepro.evaluation.embeddings_io import load_embeddings

from .checkpoint import read_checkpoint
from .hooks import TestEvaluation
from .outputs import say as _say
from .run_evaluation import corruption_metrics
from .settings import RunSettings
from .state import RunDir, TrainState

#: evaluate(epoch, final) -> the test metrics (None: embeddings not finite), saving the final embeddings
Evaluate = Callable[[int, bool], dict[str, float] | None]


def select_model(
    settings: RunSettings,
    rundir: RunDir,
    state: TrainState,
    *,
    test_eval: TestEvaluation,
    evaluate: Evaluate,
    model,
    device,
) -> int:
    """Put the selected model's test embeddings in place; its epoch."""
    select, last_epoch = settings.select, state.stopped or settings.epochs
    if select == "best_val" and not rundir.embeddings().is_file():
        evaluate_best_val(rundir, evaluate=evaluate, model=model, device=device)
    if select == "best_test":
        for best, final in test_eval.files():
            if best.is_file():
                os.replace(best, final)
    return final_epoch(settings, rundir, state, last_epoch, evaluate=evaluate, model=model, device=device)


def final_epoch(
    settings: RunSettings, rundir: RunDir, state: TrainState, last_epoch: int, *, evaluate: Evaluate, model, device
) -> int:
    """The epoch of the selected model's saved test embeddings (computed again when missing)."""
    select, emb_path = settings.select, rundir.embeddings()
    try:
        epoch = int(load_embeddings(emb_path).meta.get("epoch", last_epoch))
        if settings.gallery:
            load_embeddings(rundir.embeddings(gallery=True))
        return epoch
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
        # missing or damaged (e.g. truncated by a kill mid-write): with select "last" the model in memory is the
        # final one (best_val: the saved best model), and evaluation is deterministic, so the file
        # is simply computed again
        if select == "best_test" or (select == "last" and state.epoch != last_epoch + 1):
            raise FileNotFoundError(
                f"{emb_path} is missing or damaged ({e}); run `dmlrepro evaluate {rundir.root}`"
            ) from None
        _say(
            f"{emb_path.name} is missing or damaged ({type(e).__name__}); computing it again from the "
            f"{'best-validation' if select == 'best_val' else 'final'} model"
        )
    if select == "best_val":
        return evaluate_best_val(rundir, evaluate=evaluate, model=model, device=device)
    if evaluate(last_epoch, True) is None:  # pragma: no cover - finite before
        raise RuntimeError(f"{rundir.root}: the final model's test embeddings are not finite")
    return last_epoch


def evaluate_best_val(rundir: RunDir, *, evaluate: Evaluate, model, device) -> int:
    """Load the best-validation model (eval.select best_val) and save its test embeddings; its epoch."""
    saved = read_checkpoint(rundir.best_model("best_val"), map_location=device)
    model.load_state_dict(saved["model"])
    if evaluate(int(saved["epoch"]), True) is None:
        raise RuntimeError(f"{rundir.root}: the best-validation model's test embeddings are not finite")
    return int(saved["epoch"])


def final_extras(
    cfg: dict,
    settings: RunSettings,
    state: TrainState,
    last_epoch: int,
    *,
    proxy_metrics: Callable[[], dict[str, float]],
    validation,
    model,
    manifest,
    device,
    progress: bool,
    stop,
) -> dict[str, Any]:
    """Proxy metrics, corruption metrics and the validation summary of a completed run."""
    extra: dict[str, Any] = {}
    if settings.proxy_metrics:
        last = state.history[-1] if state.history else {}
        logged = last.get("proxy_metrics") if last.get("epoch") == last_epoch else None
        extra["proxy_metrics"] = logged if logged is not None else proxy_metrics()
    if settings.corruptions:  # RSW Table IV: the final model on corrupted test images
        extra["corruption_metrics"] = corruption_metrics(
            model, cfg, manifest, device=device, progress=progress, stop=stop
        )
    if validation is not None:
        extra["validation"] = validation.summary()
    return extra
