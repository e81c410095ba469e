"""Bayesian-optimisation search over run-config keys (optuna study, GP sampler by default).

One trial = one point of the search space = one training run per cross-validation fold; its value
is the mean over the folds of each run's best validation metric (``validation_log.json``, the
highest ``map_r`` among its evaluations). This is ASAP Fig. 2 (a GP surrogate over λ × proxies per
class, C2-ASAP on CUB, ASAP-R27) and the metric-learning reality check's protocol (Musgrave
et al. 2020: 50 BO iterations per loss, validation MAP@R averaged over 4 class-disjoint folds).

    space = parse_space({"asap.lam": {"type": "float", "low": 1e-6, "high": 1.0, "log": True, "zero": True},
                         "loss.hparams.proxies_per_class": {"type": "int", "low": 1, "high": 12}})
    run_search(base_config, space, "results/tune/fig2", trials=35, folds=[0], seed=0)
    s = posterior_surface(load_trials("results/tune/fig2"), "asap.lam", "loss.hparams.proxies_per_class",
                          log_x=True, space=space)

Files in OUTDIR: ``study.db`` (the optuna study, sqlite; what makes a search resumable),
``trials/<hash>/fold-<k>/`` (one run folder per trial point and fold; identical points share
folders), ``trials.csv`` and ``best.json`` (rewritten atomically after every trial),
``.search.lock`` (one search per folder at a time). docs/tuning.md describes every rule.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import io
import json
import math
import os
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from tqdm.auto import tqdm

from dmlrepro.atomic import atomic_write_text, write_json_atomic
from dmlrepro.nested import deep_merge, dotted_get, undotted
from dmlrepro.search_space import ZERO_SUFFIX, Param, is_finite_number, parse_space
from dmlrepro.train.config import DEFAULTS, config_identity, resolve_run_config
from dmlrepro.train.state import RunDir

STUDY_FILE = "study.db"
STUDY_NAME = "search"
TRIALS_DIR = "trials"
TRIALS_CSV = "trials.csv"
BEST_JSON = "best.json"
LOCK_FILE = ".search.lock"
SAMPLERS = ("gp", "tpe", "random")
DIRECTIONS = ("maximize", "minimize")
# The validation metrics (map@r, r_precision, precision@1, recall@1) all lie in [0, 1]: a diverged
# run (or one without a finite validation value) scores the worst end of that range.
WORST = {"maximize": 0.0, "minimize": 1.0}
HASH_LENGTH = 12


class SearchError(RuntimeError):
    """The output folder holds another search, or another process is running this one."""


# ----------------------------------------------------------------------------- helpers


def train_run(config: Mapping, outdir: Path, **kwargs: Any) -> dict[str, Any]:
    """dmlrepro.train.train_run, imported at the first trial: the workflow's Snakefile imports this
    module for its file names, not to train (tests replace this name)."""
    from dmlrepro.train.engine import train_run as engine_train_run

    return engine_train_run(config, outdir, **kwargs)


def params_hash(params: Mapping[str, Any]) -> str:
    """Short hash of the values the runs get (dotted keys): the trial's folder name under trials/."""
    text = json.dumps({k: params[k] for k in sorted(params)}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]


def fingerprint(base_config: Mapping, space: Sequence[Param], folds: list[int] | None, direction: str) -> str:
    """Identity of a search: what must not change between a search and its resumption. The base
    config counts as a run's identity does (train.config.config_identity: not the data root, device, workers
    or threads), so a search resumes after the data moved."""
    base = config_identity(resolve_run_config(copy.deepcopy(dict(base_config))))
    text = json.dumps(
        {"base": base, "space": {p.key: p.spec() for p in space}, "folds": folds, "direction": direction},
        sort_keys=True,
        default=repr,
    )
    return hashlib.sha256(text.encode()).hexdigest()


def best_validation_value(run_dir: str | os.PathLike, metric: str = "map_r") -> float | None:
    """The highest finite ``metric`` among the evaluations of ``run_dir/validation_log.json``
    (None if there is no finite value). The log's ``map_r`` field holds the run's
    ``validation.metric`` (MAP@R by default; the log's top-level ``metric`` names it)."""
    path = RunDir(run_dir).validation_log
    if not path.is_file():
        return None
    log = json.loads(path.read_text())
    values = [e.get(metric) for e in log.get("evaluations", [])]
    values = [float(v) for v in values if is_finite_number(v)]
    return max(values) if values else None


def _run_folder(trial_dir: Path, fold: int | None) -> Path:
    return trial_dir / ("run" if fold is None else f"fold-{fold}")


@contextlib.contextmanager
def _search_lock(outdir: Path) -> Iterator[None]:
    fh = open(outdir / LOCK_FILE, "a+")
    try:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SearchError(
                f"{outdir}: another process is running this search ({outdir / LOCK_FILE} is locked)"
            ) from None
        yield
    finally:
        fh.close()


def _quiet_optuna():
    import optuna  # deferred: optuna (seconds); the Snakefile imports this module

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def make_sampler(name: str, seed: int, startup_trials: int):
    """The optuna sampler ``name`` (gp = GPSampler, tpe = TPESampler, random = RandomSampler), its
    first ``startup_trials`` trials drawn at random."""
    optuna = _quiet_optuna()
    if name == "gp":
        return optuna.samplers.GPSampler(
            seed=seed,
            n_startup_trials=startup_trials,
            independent_sampler=optuna.samplers.RandomSampler(seed=seed),
            warn_independent_sampling=False,
        )
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup_trials, multivariate=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"sampler = {name!r}: expected one of {', '.join(SAMPLERS)}")


def _trial_seed(seed: int, n_complete: int) -> int:
    """The sampler seed for the next trial: a function of the search seed and how many trials are
    complete, so a resumed search draws what an uninterrupted one would have drawn."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{n_complete}".encode()).digest()[:4], "little")


def _check_config(base_config: Mapping, space: Sequence[Param], folds: list[int] | None) -> None:
    """Fail before any training on: a fold list without a fold split, a base without a split, a
    searched key that is not a run-config key (the run-config schema names it)."""
    split = dotted_get(base_config, "validation.split")
    if folds is not None:
        if (
            not isinstance(folds, (list, tuple))
            or not folds
            or not all(isinstance(f, int) and not isinstance(f, bool) and f >= 0 for f in folds)
        ):
            raise ValueError(f"folds = {folds!r}: expected a non-empty list of fold numbers (ints >= 0) or null")
        if len(set(folds)) != len(folds):
            raise ValueError(f"folds = {list(folds)!r}: a fold is listed twice")
        if split != "fold":
            raise ValueError(
                f"folds = {list(folds)!r} needs the base config's validation.split = 'fold' (it is {split!r})"
            )
        n = dotted_get(base_config, "validation.n_folds") or DEFAULTS["validation"]["n_folds"]
        if max(folds) >= n:
            raise ValueError(f"folds = {list(folds)!r}: expected folds < validation.n_folds = {n}")
        if any(p.key == "validation" or p.key.startswith("validation.fold") for p in space):
            raise ValueError("search space: validation.fold is set by `folds`; do not search it")
    elif split is None:
        raise ValueError(
            "folds = null needs a validation split in the base config (validation.split: fold or holdout): "
            "the objective is the run's best validation value"
        )
    example = undotted({p.key: p.example() for p in space})
    fold = {"validation": {"fold": folds[0]}} if folds else {}
    resolve_run_config(deep_merge(deep_merge(base_config, example), fold))


# ----------------------------------------------------------------------------- the search


def run_search(
    base_config: Mapping,
    space: Mapping | Sequence[Param],
    outdir: str | os.PathLike,
    *,
    trials: int,
    folds: list[int] | None = None,
    seed: int = 0,
    sampler: str = "gp",
    direction: str = "maximize",
    startup_trials: int = 10,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Search ``space`` until the study in ``outdir`` holds ``trials`` completed trials; returns
    best.json's content.

    Each trial trains one run per fold (``deep_merge(base, params, {"validation": {"fold": f}}``)
    into ``outdir/trials/<params_hash>/fold-<f>`` (``run`` when ``folds`` is None) and scores the
    mean over folds of the runs' best validation ``map_r``; a diverged run scores ``WORST``.
    Calling again with the same arguments resumes (trials of a dead process are re-run with their
    parameters, their run folders resume from checkpoints); another base config, space, fold list
    or direction in the same ``outdir`` raises :class:`SearchError`.
    """
    params = parse_space(space)
    _check_arguments(
        base_config, trials=trials, startup_trials=startup_trials, sampler=sampler, direction=direction, seed=seed
    )
    base_config = copy.deepcopy(dict(base_config))
    folds = list(folds) if folds is not None else None
    _check_config(base_config, params, folds)

    optuna = _quiet_optuna()
    from optuna.trial import TrialState  # deferred with optuna

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    fp = fingerprint(base_config, params, folds, direction)
    with _search_lock(outdir):
        storage = optuna.storages.RDBStorage(f"sqlite:///{(outdir / STUDY_FILE).resolve()}")
        study = optuna.create_study(storage=storage, study_name=STUDY_NAME, direction=direction, load_if_exists=True)
        _check_fingerprint(study, outdir, fp, base_config, params, folds, direction)
        _requeue_interrupted(study, storage, TrialState)

        def n_complete() -> int:
            return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))

        _write_outputs(study, outdir, params, folds, direction)
        show = sys.stderr.isatty() if progress is None else progress
        with tqdm(
            total=trials, initial=min(n_complete(), trials), desc="search", unit="trial", disable=not show
        ) as bar:
            while (done := n_complete()) < trials:
                study.sampler = make_sampler(sampler, _trial_seed(seed, done), startup_trials)
                _run_trial(study, TrialState, base_config, params, folds, outdir, direction)
                best = _write_outputs(study, outdir, params, folds, direction)
                bar.update(1)
                if best is not None:
                    bar.set_postfix(best=f"{best['value']:.4f}")
        return _write_outputs(study, outdir, params, folds, direction)


def _check_arguments(
    base_config: Any, *, trials: Any, startup_trials: Any, sampler: str, direction: str, seed: Any
) -> None:
    """One-line errors for run_search's arguments, before any study is opened."""
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise ValueError(f"trials = {trials!r}: expected an integer >= 1")
    if not isinstance(startup_trials, int) or isinstance(startup_trials, bool) or startup_trials < 0:
        raise ValueError(f"startup_trials = {startup_trials!r}: expected an integer >= 0")
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler = {sampler!r}: expected one of {', '.join(SAMPLERS)}")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction = {direction!r}: expected 'maximize' or 'minimize'")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed = {seed!r}: expected an integer")
    if not isinstance(base_config, Mapping):
        raise ValueError(f"base config: expected a mapping (a partial run config), got {type(base_config).__name__}")


def _run_trial(study, trial_state, base_config: dict, params, folds, outdir: Path, direction: str) -> None:
    """Ask the study for one trial, train and score it, tell the study; a trial that raises is told
    FAIL with its error (the outputs rewritten) and the error propagates."""
    trial = study.ask()
    try:
        value, attrs = _evaluate(trial, base_config, params, folds, outdir, direction)
    except BaseException as error:
        trial.set_user_attr("error", f"{type(error).__name__}: {error}"[:2000])
        study.tell(trial, state=trial_state.FAIL)
        _write_outputs(study, outdir, params, folds, direction)
        raise
    for k, v in attrs.items():
        trial.set_user_attr(k, v)
    study.tell(trial, value)


def _check_fingerprint(study, outdir: Path, fp: str, base_config, params, folds, direction) -> None:
    attrs = study.user_attrs
    if "fingerprint" not in attrs:
        if study.get_trials(deepcopy=False):
            raise SearchError(f"{outdir / STUDY_FILE}: a study without a search fingerprint; use another OUTDIR")
        study.set_user_attr(
            "search",
            {"base": base_config, "space": {p.key: p.spec() for p in params}, "folds": folds, "direction": direction},
        )
        study.set_user_attr("fingerprint", fp)
        return
    if attrs["fingerprint"] != fp:
        old = attrs.get("search", {})
        new = {"base": base_config, "space": {p.key: p.spec() for p in params}, "folds": folds, "direction": direction}
        differ = [
            k
            for k in new
            if json.dumps(old.get(k), sort_keys=True, default=repr) != json.dumps(new[k], sort_keys=True, default=repr)
        ] or ["(fingerprint)"]
        raise SearchError(
            f"{outdir}: holds another search (its {', '.join(differ)} differ from this call's); "
            "use another OUTDIR or the same search config"
        )


def _requeue_interrupted(study, storage, TrialState) -> None:
    """Trials left RUNNING by a dead process (the search lock says no other process runs) become
    FAIL; those and the trials that failed with an exception are enqueued again with the same
    parameters (each once), so the next trials re-run them and their run folders resume."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        storage.set_trial_user_attr(t._trial_id, "error", "interrupted (the search process died)")
        storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
    requeued = set(study.user_attrs.get("requeued", []))
    waiting = [t.params for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))]
    new = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        if t.number in requeued:
            continue
        if t.params and t.params not in waiting:
            study.enqueue_trial(t.params, user_attrs={"requeued_from": t.number})
            waiting.append(t.params)
        new.append(t.number)
    if new:
        study.set_user_attr("requeued", sorted(requeued | set(new)))


def _evaluate(trial, base_config, params: Sequence[Param], folds, outdir: Path, direction: str):
    values: dict[str, Any] = {}
    for p in params:
        value, _ = p.suggest(trial)
        values[p.key] = value
    h = params_hash(values)
    trial_dir = outdir / TRIALS_DIR / h
    fold_values, runs, diverged = [], [], []
    for fold in folds if folds is not None else [None]:
        config = deep_merge(base_config, undotted(values))
        if fold is not None:
            config = deep_merge(config, {"validation": {"fold": fold}})
        run_dir = _run_folder(trial_dir, fold)
        record = train_run(config, run_dir, progress=False)
        best = best_validation_value(run_dir)
        if (record or {}).get("status") == "diverged" or best is None:
            diverged.append(fold if fold is not None else 0)
            best = WORST[direction]
        fold_values.append(best)
        runs.append(run_dir.relative_to(outdir).as_posix())
    value = float(np.mean(fold_values))
    return value, {"hash": h, "params": values, "fold_values": fold_values, "runs": runs, "diverged": diverged}


# ----------------------------------------------------------------------------- outputs


def study_frame(study, params: Sequence[Param], folds: list[int] | None):
    """One row per trial: number, state, value, each searched key (the value the runs got), each
    ``<key>@zero``, the per-fold values, the diverged folds, the run folders."""
    import pandas as pd  # deferred: pandas; the Snakefile imports this module

    rows = []
    for t in study.get_trials(deepcopy=False):
        values = t.user_attrs.get("params") or _effective(t.params, params)
        row: dict[str, Any] = {
            "number": t.number,
            "state": t.state.name,
            "value": t.value if t.state.name == "COMPLETE" else None,
        }
        for p in params:
            row[p.key] = values.get(p.key)
            if p.zero:
                row[p.key + ZERO_SUFFIX] = t.params.get(p.key + ZERO_SUFFIX)
        fold_values = t.user_attrs.get("fold_values") or []
        for i, fold in enumerate(folds if folds is not None else [None]):
            row["value_" + ("run" if fold is None else f"fold{fold}")] = (
                fold_values[i] if i < len(fold_values) else None
            )
        row["diverged"] = ";".join(str(f) for f in t.user_attrs.get("diverged", []))
        row["hash"] = t.user_attrs.get("hash") or (params_hash(values) if len(values) == len(params) else "")
        row["runs"] = ";".join(t.user_attrs.get("runs", []))
        row["error"] = t.user_attrs.get("error", "")
        rows.append(row)
    columns = ["number", "state", "value"] + [
        c for p in params for c in ([p.key] + ([p.key + ZERO_SUFFIX] if p.zero else []))
    ]
    return pd.DataFrame(rows, columns=columns + [c for c in (rows[0] if rows else {}) if c not in columns])


def _effective(raw: Mapping[str, Any], params: Sequence[Param]) -> dict[str, Any]:
    out = {}
    for p in params:
        if p.key in raw:
            out[p.key] = (0 if p.type == "int" else 0.0) if raw.get(p.key + ZERO_SUFFIX) else raw[p.key]
    return out


def _write_outputs(study, outdir: Path, params, folds, direction) -> dict[str, Any] | None:
    frame = study_frame(study, params, folds)
    buf = io.StringIO()
    frame.to_csv(buf, index=False)
    atomic_write_text(outdir / TRIALS_CSV, buf.getvalue())
    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if not complete:
        return None
    best = study.best_trial
    record = {
        "params": best.user_attrs["params"],
        "value": best.value,
        "trial": best.number,
        "hash": best.user_attrs["hash"],
        "runs": best.user_attrs["runs"],
        "fold_values": best.user_attrs["fold_values"],
        "n_trials": len(complete),
        "n_failed": sum(t.state.name == "FAIL" for t in study.get_trials(deepcopy=False)),
        "direction": direction,
        "folds": folds,
    }
    write_json_atomic(outdir / BEST_JSON, record)
    return record


def load_trials(outdir: str | os.PathLike):
    """``outdir/trials.csv`` as a DataFrame (``diverged``, ``hash``, ``runs``, ``error`` as strings,
    empty where there is nothing)."""
    import pandas as pd  # deferred: pandas; the Snakefile imports this module

    text = ("diverged", "hash", "runs", "error")
    frame = pd.read_csv(Path(outdir) / TRIALS_CSV, dtype={c: str for c in text})
    for c in text:
        if c in frame.columns:
            frame[c] = frame[c].fillna("")
    return frame


# ----------------------------------------------------------------------------- GP posterior surface


class Surface(NamedTuple):
    """GP posterior over a (x, y) plane: grid arrays ``X``, ``Y``, ``mean``, ``std`` (shape
    grid × grid; ``X``/``Y`` in plot coordinates, log10 on a log axis), and the trial points
    ``x_obs``, ``y_obs`` (same coordinates), ``values``; ``x_zero``/``y_zero`` = where 0 was put
    on a log axis (None if not needed)."""

    X: np.ndarray
    Y: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    x_obs: np.ndarray
    y_obs: np.ndarray
    values: np.ndarray
    x_zero: float | None
    y_zero: float | None


def _zero_position(key: str, positive: np.ndarray, space: Sequence[Param] | Mapping | None) -> float:
    """Where 0 goes on a log10 axis: one decade below the space's ``low`` if known, else one decade
    below the largest power of ten not above the smallest positive value."""
    if space is not None:
        for p in parse_space(space):
            if p.key == key and p.low is not None and p.low > 0:
                return math.log10(p.low) - 1.0
    if positive.size == 0:
        return 0.0
    return math.floor(math.log10(float(positive.min()))) - 1.0


def _axis(values: np.ndarray, key: str, log: bool, space) -> tuple[np.ndarray, float | None]:
    if not log:
        return values.astype(float), None
    if np.any(values < 0):
        raise ValueError(f"posterior_surface: {key} has negative values; a log axis needs values >= 0")
    zero = values == 0
    z = _zero_position(key, values[~zero], space) if zero.any() else None
    out = np.empty(values.shape, dtype=float)
    out[~zero] = np.log10(values[~zero])
    out[zero] = z if z is not None else 0.0
    return out, z


def posterior_surface(
    trials_frame,
    x_key: str,
    y_key: str,
    *,
    log_x: bool = False,
    log_y: bool = False,
    grid: int = 50,
    space: Sequence[Param] | Mapping | None = None,
    noise_level: float = 1e-2,
    noise_level_bounds: tuple[float, float] | str = (1e-8, 1.0),
    n_restarts: int = 5,
    random_state: int = 0,
) -> Surface:
    """Fit scikit-learn's GaussianProcessRegressor (Constant × Matern(ν = 5/2, one length scale per
    axis) + WhiteKernel, ``normalize_y``) to the completed trials' (x, y) -> value and evaluate it on
    a ``grid`` × ``grid`` grid spanning the trials (ASAP Fig. 2, "Gaussian Process Regression to
    Parameter Space": x = log10 λ, y = #proxy).

    Inputs are scaled to [0, 1] per axis for the fit. On a log axis (``log_x``/``log_y``) values are
    log10'd and 0 is put one decade below the space's ``low`` (``space`` given) or one decade below
    the power of ten under the smallest positive value; the position is returned as
    ``x_zero``/``y_zero``.
    """
    # deferred: scikit-learn (seconds), only the posterior surface needs it
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    if not isinstance(grid, int) or grid < 2:
        raise ValueError(f"posterior_surface: grid = {grid!r}: expected an integer >= 2")
    frame = _completed_trials(trials_frame, x_key, y_key)
    xs, x_zero = _axis(frame[x_key].to_numpy(dtype=float), x_key, log_x, space)
    ys, y_zero = _axis(frame[y_key].to_numpy(dtype=float), y_key, log_y, space)
    values = frame["value"].to_numpy(dtype=float)
    lo = np.array([xs.min(), ys.min()])
    span = np.array([xs.max(), ys.max()]) - lo
    span[span == 0] = 1.0
    points = (np.column_stack([xs, ys]) - lo) / span
    kernel = ConstantKernel(1.0, (1e-3, 1e3)) * Matern(
        length_scale=[0.3, 0.3], length_scale_bounds=(1e-2, 1e2), nu=2.5
    ) + WhiteKernel(noise_level=noise_level, noise_level_bounds=noise_level_bounds)
    gpr = GaussianProcessRegressor(
        kernel=kernel, normalize_y=True, n_restarts_optimizer=n_restarts, random_state=random_state
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn's ConvergenceWarning at a bound: expected with few trials
        gpr.fit(points, values)
    gx = np.linspace(xs.min(), xs.max(), grid)
    gy = np.linspace(ys.min(), ys.max(), grid)
    X, Y = np.meshgrid(gx, gy)
    query = (np.column_stack([X.ravel(), Y.ravel()]) - lo) / span
    mean, std = gpr.predict(query, return_std=True)
    return Surface(X, Y, mean.reshape(X.shape), std.reshape(X.shape), xs, ys, values, x_zero, y_zero)


def _completed_trials(frame, x_key: str, y_key: str):
    """The trials frame's completed trials with a finite value (at least 2), once both axes are columns."""
    for key in (x_key, y_key):
        if key not in frame.columns:
            raise ValueError(
                f"posterior_surface: no column {key!r} in the trials frame (columns: {list(frame.columns)})"
            )
    if "state" in frame.columns:
        frame = frame[frame["state"] == "COMPLETE"]
    frame = frame[np.isfinite(frame["value"].astype(float))]
    if len(frame) < 2:
        raise ValueError(f"posterior_surface: needs at least 2 completed trials, got {len(frame)}")
    return frame
