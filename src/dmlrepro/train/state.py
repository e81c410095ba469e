"""What a run is at one moment (:class:`TrainState`) and where its files live (:class:`RunDir`).

``TrainState`` is the position a checkpoint records and a resume continues from; its
``to_dict``/``from_dict`` keep the checkpoint's ``position`` mapping of earlier versions, so old
checkpoints resume. ``RunDir`` owns every file name of a run folder (docs/training.md#run-directory):
the engine writes them; the report, the searches, the evaluation and the workflow's rules read them
by these names. No torch here: ``dmlrepro.report`` and the Snakefile import it without the engine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EMBEDDINGS_FILE = "embeddings_test.npz"  # the test split (the queries, with a gallery)
GALLERY_FILE = "embeddings_gallery.npz"  # dataset.gallery_split (query→gallery evaluation, In-Shop)
BEST_MODEL_FILE = "best_model.pt"  # eval.select best_test, in checkpoints/
BEST_VAL_MODEL_FILE = "best_val_model.pt"  # eval.select best_val, in checkpoints/
BEST_EMBEDDINGS_FILE = "best_test.npz"  # best_test's embeddings until the run ends, in checkpoints/
BEST_GALLERY_FILE = "best_gallery.npz"
VALIDATION_LOG_FILE = "validation_log.json"
VAL_EMBEDDINGS_DIR = "projections"
LOCK_FILE = ".lock"
LOCK_PID_FILE = ".lock.pid"

#: keys of the position that older checkpoints carry only once set
_OPTIONAL = ("stopped", "followup_start")


@dataclass
class TrainState:
    """The loop's position: the epoch being trained, the batch within it, the epoch's running loss,
    the per-epoch history (train_log.csv rows), best-test bookkeeping and the early-stop/followup epochs."""

    epoch: int = 1
    batch: int = 0
    global_step: int = 0
    epoch_loss_sum: float = 0.0
    epoch_steps: int = 0
    epoch_seconds: float = 0.0
    history: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None  # eval.select best_test: {"epoch", "recall@1"}
    stopped: int | None = None  # the epoch validation early stopping ended the run after
    followup_start: int | None = None  # followup.trigger plateau: the first phase-2 epoch

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in _OPTIONAL:
            if d[k] is None:
                del d[k]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainState:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def next_epoch(self) -> None:
        """The epoch's row is in the history: the position moves to the next epoch's start."""
        self.epoch += 1
        self.batch, self.epoch_loss_sum, self.epoch_steps, self.epoch_seconds = 0, 0.0, 0, 0.0

    def void_steps(self, n: int) -> None:
        """Set the position back by `n` steps (those from a non-finite one on do not count)."""
        self.batch -= n
        self.global_step -= n
        self.epoch_steps -= n


class RunDir:
    """The files of one run folder. The names are class attributes too, for readers that spell a
    path pattern rather than a folder (the workflow's rules: ``LAYOUT.run_file("{run}", RunDir.METRICS)``)."""

    CONFIG = "config.yaml"
    METRICS = "metrics.json"
    TRAIN_LOG = "train_log.csv"
    CHECKPOINTS = "checkpoints"
    FINAL_PROXIES = "final_proxies.npz"  # the loss's proxies after training, for the report (losses with proxies)
    VALIDATION_LOG = VALIDATION_LOG_FILE

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def __truediv__(self, name: str) -> Path:
        return self.root / name

    @property
    def config(self) -> Path:
        return self.root / self.CONFIG

    @property
    def metrics(self) -> Path:
        return self.root / self.METRICS

    @property
    def train_log(self) -> Path:
        return self.root / self.TRAIN_LOG

    @property
    def validation_log(self) -> Path:
        return self.root / self.VALIDATION_LOG

    @property
    def checkpoints(self) -> Path:
        return self.root / self.CHECKPOINTS

    @property
    def final_proxies(self) -> Path:
        return self.root / self.FINAL_PROXIES

    @property
    def val_embeddings(self) -> Path:
        return self.root / VAL_EMBEDDINGS_DIR

    @property
    def lock(self) -> Path:
        return self.root / LOCK_FILE

    @property
    def lock_pid(self) -> Path:
        return self.root / LOCK_PID_FILE

    def embeddings(self, gallery: bool = False) -> Path:
        return self.root / (GALLERY_FILE if gallery else EMBEDDINGS_FILE)

    def best_embeddings(self, gallery: bool = False) -> Path:
        return self.checkpoints / (BEST_GALLERY_FILE if gallery else BEST_EMBEDDINGS_FILE)

    def best_model(self, select: str) -> Path:
        """The saved selected model of ``eval.select`` best_test / best_val."""
        return self.checkpoints / {"best_test": BEST_MODEL_FILE, "best_val": BEST_VAL_MODEL_FILE}[select]

    def projection_embeddings(self, projection: int) -> Path:
        """The validation embeddings at projection `projection`'s solution (``asap.save_val_embeddings``)."""
        return self.val_embeddings / f"projection-{int(projection)}_val.npz"

    def saved_projections(self) -> list[Path]:
        """Every :meth:`projection_embeddings` file of the run, by projection."""
        return sorted(
            self.val_embeddings.glob("projection-*_val.npz"),
            key=lambda p: int(p.stem.removeprefix("projection-").removesuffix("_val")),
        )

    def temporaries(self) -> list[Path]:
        """Temporaries of atomic writes (``.NAME.RANDOM.tmp``) a killed process may leave."""
        return [*self.root.glob(".*.tmp"), *self.checkpoints.glob(".*.tmp")]
