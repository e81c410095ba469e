"""dmlrepro.tuning: search space, the optuna search (resume, folds, divergence), the GP posterior
surface, the CLI, and one real search over the training engine (slow)."""

from __future__ import annotations

import fcntl
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dmlrepro.tuning import bayes, cli as tune_cli
from dmlrepro.tuning.bayes import (
    SearchError,
    best_validation_value,
    load_trials,
    params_hash,
    parse_space,
    posterior_surface,
    run_search,
)

LAM, P = "asap.lam", "loss.hparams.proxies_per_class"
SPACE = {
    LAM: {"type": "float", "low": 1e-6, "high": 1.0, "log": True, "zero": True},
    P: {"type": "int", "low": 1, "high": 12},
}
# C2-ASAP as in config/config.yaml (never trained by the fake; checked by resolve_run_config)
BASE = {
    "dataset": {
        "name": "synthetic",
        "root": "/nonexistent-tuning-data",
        "batch_size": 32,
        "m": 4,
        "sampler": "m_per_class",
    },
    "model": {"backbone": "tiny_cnn", "embedding_size": 32, "l2_normalize": False},
    "loss": {"name": "asap_c2", "hparams": {"proxies_per_class": 8, "pos_margin": 0.0, "neg_margin": 0.3841}},
    "asap": {"enabled": True, "b": 12, "lam": 2.0e-4, "projection_patience": 2},
    "validation": {"split": "fold", "patience": 4},
    "eval": {"select": "best_val"},
    "epochs": 2,
    "steps_per_epoch": 2,
}
OPT = (-3.0, 8)  # the fake objective's peak: log10 λ = -3, P = 8


def objective(lam: float, p: int, fold: int) -> float:
    """The fake run's best validation MAP@R: a bump at λ = 1e-3, P = 8 (λ = 0 counts as 1e-7), plus
    a fold-dependent offset."""
    x = math.log10(lam) if lam > 0 else -7.0
    return 0.8 * math.exp(-(((x - OPT[0]) / 1.5) ** 2) - ((p - OPT[1]) / 4.0) ** 2) + 0.02 * fold


class FakeTrain:
    """Stands in for dmlrepro.train.train_run: writes a validation_log.json whose best map_r is
    objective(λ, P, fold) (other evaluations lower, one null as after non-finite embeddings)."""

    def __init__(self, diverge=lambda lam, p, fold: False, interrupt_at: int | None = None):
        self.calls: list[tuple[float, int, int, str]] = []
        self.diverge, self.interrupt_at = diverge, interrupt_at

    def __call__(self, config, outdir, progress=None):
        lam, p = config["asap"]["lam"], config["loss"]["hparams"]["proxies_per_class"]
        fold = config["validation"]["fold"]
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            self.interrupt_at = None
            raise KeyboardInterrupt
        self.calls.append((lam, p, fold, str(outdir)))
        outdir = Path(outdir)
        outdir.mkdir(parents=True, exist_ok=True)
        best = objective(lam, p, fold)
        diverged = self.diverge(lam, p, fold)
        evaluations = [
            {"evaluation": 1, "step": 2, "map_r": best / 2},
            {"evaluation": 2, "step": 4, "map_r": best if not diverged else best / 3},
            {"evaluation": 3, "step": 6, "map_r": None},
        ]
        (outdir / "validation_log.json").write_text(json.dumps({"metric": "map@r", "evaluations": evaluations}))
        record = {"status": "diverged" if diverged else "completed"}
        (outdir / "metrics.json").write_text(json.dumps(record))
        return record


@pytest.fixture
def fake(monkeypatch):
    def install(**kwargs) -> FakeTrain:
        f = FakeTrain(**kwargs)
        monkeypatch.setattr(bayes, "train_run", f)
        return f

    return install


def distance(lam: float, p: float) -> float:
    x = math.log10(lam) if lam > 0 else -7.0
    return math.hypot((x - OPT[0]) / 6.0, (p - OPT[1]) / 11.0)


def complete(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["state"] == "COMPLETE"].reset_index(drop=True)


# ----------------------------------------------------------------------------- space


def test_parse_space_kinds():
    params = {
        p.key: p
        for p in parse_space(
            {
                **SPACE,
                "optimizer.lr": {"type": "float", "low": 1e-5, "high": 1e-2, "log": True},
                "loss.hparams.delta": {"type": "float", "low": 0.1, "high": 0.3, "step": 0.05},
                "asap.b": {"type": "int", "low": 2, "high": 16, "log": True},
                "optimizer.name": {"type": "categorical", "choices": ["adam", "adamw", None]},
            }
        )
    }
    assert params[LAM].type == "float" and params[LAM].log and params[LAM].zero
    assert (params[LAM].low, params[LAM].high) == (1e-6, 1.0)
    assert (
        params[P].type == "int"
        and not params[P].log
        and not params[P].zero
        and (params[P].low, params[P].high) == (1, 12)
    )
    assert params["optimizer.lr"].log and not params["optimizer.lr"].zero
    assert params["loss.hparams.delta"].step == 0.05 and not params["loss.hparams.delta"].log
    assert params["asap.b"].type == "int" and params["asap.b"].log
    assert params["optimizer.name"].choices == ("adam", "adamw", None)


def test_zero_is_an_extra_boolean_the_sampler_sees():
    import optuna

    lam = parse_space(SPACE)[0]
    value, raw = lam.suggest(optuna.trial.FixedTrial({LAM + "@zero": True, LAM: 3e-3}))
    assert value == 0.0 and raw == {LAM + "@zero": True, LAM: 3e-3}
    value, raw = lam.suggest(optuna.trial.FixedTrial({LAM + "@zero": False, LAM: 3e-3}))
    assert value == 3e-3 and raw[LAM + "@zero"] is False
    # the sampler's space holds both parameters
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    t = study.ask()
    lam.suggest(t)
    assert set(t.distributions) == {LAM, LAM + "@zero"}
    assert isinstance(t.distributions[LAM + "@zero"], optuna.distributions.CategoricalDistribution)
    assert t.distributions[LAM].log


@pytest.mark.parametrize(
    "spec, expected",
    [
        ({"type": "float", "low": 0.0, "high": 1.0, "log": True}, "log: true needs low > 0"),
        ({"type": "float", "low": 0.0, "high": 1.0, "zero": True}, "zero: true needs low > 0"),
        ({"type": "float", "low": 2.0, "high": 1.0}, "low = 2.0 > high = 1.0"),
        ({"type": "int", "low": 1.5, "high": 4}, "low = 1.5: expected an integer"),
        ({"type": "float", "low": "a", "high": 1.0}, "low = 'a': expected a finite number"),
        ({"type": "float", "high": 1.0}, "low = None"),
        ({"type": "real", "low": 0.0, "high": 1.0}, "expected 'int', 'float' or 'categorical'"),
        ({"type": "float", "low": 0.1, "high": 1.0, "lo": 3}, "unknown field(s) ['lo']"),
        ({"type": "float", "low": 0.1, "high": 1.0, "log": "yes"}, "log = 'yes': expected true or false"),
        ({"type": "float", "low": 0.1, "high": 1.0, "log": True, "step": 0.1}, "step and log: true cannot be combined"),
        ({"type": "int", "low": 1, "high": 9, "step": 0}, "step = 0: expected a number > 0"),
        ({"type": "categorical", "choices": []}, "choices = []: expected a non-empty list"),
        ({"type": "categorical", "choices": [[1, 2]]}, "choice [1, 2]: expected None"),
        ({"type": "categorical", "choices": ["a", "a"]}, "repeat a value"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_bad_specs_name_the_key(spec, expected):
    with pytest.raises(ValueError) as info:
        parse_space({"some.key": spec})
    assert "'some.key'" in str(info.value) and expected in str(info.value)


def test_bad_spaces():
    with pytest.raises(ValueError, match="non-empty mapping"):
        parse_space({})
    with pytest.raises(ValueError, match="'a..b': expected a dotted run-config key"):
        parse_space({"a..b": {"type": "int", "low": 1, "high": 2}})
    with pytest.raises(ValueError, match="'asap.lam' lies inside 'asap'"):
        parse_space({"asap": {"type": "int", "low": 1, "high": 2}, "asap.lam": {"type": "int", "low": 1, "high": 2}})


# ----------------------------------------------------------------------------- search


def test_gp_search_finds_the_peak_and_writes_its_tables(fake, tmp_path):
    f = fake()
    best = run_search(BASE, SPACE, tmp_path, trials=18, folds=[0, 2], seed=0, sampler="gp", startup_trials=8)
    frame = load_trials(tmp_path)
    assert len(frame) == 18 and (frame["state"] == "COMPLETE").all()
    assert len(f.calls) == 36
    # each value is the mean over the folds of the runs' best validation map_r
    for _, row in frame.iterrows():
        lam, p = float(row[LAM]), int(row[P])
        assert row["value_fold0"] == pytest.approx(objective(lam, p, 0))
        assert row["value_fold2"] == pytest.approx(objective(lam, p, 2))
        assert row["value"] == pytest.approx((objective(lam, p, 0) + objective(lam, p, 2)) / 2)
        assert bool(row[LAM + "@zero"]) == (lam == 0.0)
        h = params_hash({LAM: lam, P: p})
        assert row["hash"] == h and row["runs"] == f"trials/{h}/fold-0;trials/{h}/fold-2"
        assert (tmp_path / "trials" / h / "fold-2" / "validation_log.json").is_file()
    # the GP's best is nearer the peak than the best of the random start-up trials
    startup = frame.iloc[:8]
    s_best = startup.loc[startup["value"].idxmax()]
    g_best = frame.loc[frame["value"].idxmax()]
    assert distance(g_best[LAM], g_best[P]) < distance(s_best[LAM], s_best[P])
    assert g_best["value"] > s_best["value"]
    assert distance(g_best[LAM], g_best[P]) < 0.1
    # best.json
    on_disk = json.loads((tmp_path / "best.json").read_text())
    assert on_disk == best
    assert best["value"] == pytest.approx(frame["value"].max())
    assert best["trial"] == int(g_best["number"])
    assert best["params"] == {LAM: pytest.approx(g_best[LAM]), P: int(g_best[P])}
    assert best["n_trials"] == 18 and best["folds"] == [0, 2]
    assert best["runs"] == g_best["runs"].split(";")


def test_random_sampler_is_not_the_gp(fake, tmp_path):
    """The samplers differ (the GP test above would pass with any sampler otherwise)."""
    fake()
    run_search(BASE, SPACE, tmp_path / "r", trials=10, folds=[0], seed=0, sampler="random")
    fake()
    run_search(BASE, SPACE, tmp_path / "g", trials=10, folds=[0], seed=0, sampler="gp", startup_trials=4)
    r, g = load_trials(tmp_path / "r"), load_trials(tmp_path / "g")
    assert r[[LAM, P]].iloc[:4].equals(g[[LAM, P]].iloc[:4])  # the same seeded random start-up
    assert r[LAM].iloc[4:].tolist() != g[LAM].iloc[4:].tolist()
    assert g["value"].iloc[4:].max() > r["value"].iloc[4:].max()


def test_diverged_runs_score_worst(fake, tmp_path):
    space = {
        LAM: {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
        P: {"type": "categorical", "choices": [4, 11]},
    }
    f = fake(diverge=lambda lam, p, fold: p == 11 and fold == 1)
    best = run_search(BASE, space, tmp_path, trials=8, folds=[0, 1], seed=1, sampler="random")
    frame = load_trials(tmp_path)
    assert set(frame[P]) == {4, 11}
    for _, row in frame.iterrows():
        lam, p = float(row[LAM]), int(row[P])
        if p == 11:
            assert row["value_fold1"] == 0.0 and row["diverged"] == "1"
            assert row["value"] == pytest.approx(objective(lam, p, 0) / 2)
        else:
            assert row["diverged"] == ""
            assert row["value"] == pytest.approx((objective(lam, p, 0) + objective(lam, p, 1)) / 2)
    assert len(f.calls) == 16 and best["params"][P] == 4


def test_minimize_scores_diverged_runs_at_the_top(fake, tmp_path):
    space = {P: {"type": "categorical", "choices": [11]}}
    fake(diverge=lambda lam, p, fold: True)
    best = run_search(BASE, space, tmp_path, trials=1, folds=[0], seed=0, sampler="random", direction="minimize")
    assert best["value"] == 1.0 and best["direction"] == "minimize"


@pytest.mark.parametrize("sampler", ["gp", "tpe", "random"])
def test_resume_adds_only_the_missing_trials(fake, tmp_path, sampler):
    f = fake()
    kw = {"folds": [0, 1], "seed": 3, "startup_trials": 3, "sampler": sampler}
    run_search(BASE, SPACE, tmp_path / "s", trials=4, **kw)
    first = load_trials(tmp_path / "s")
    assert len(f.calls) == 8
    best = run_search(BASE, SPACE, tmp_path / "s", trials=7, **kw)
    assert len(f.calls) == 14  # 3 new trials x 2 folds
    again = load_trials(tmp_path / "s")
    assert len(again) == 7 and best["n_trials"] == 7
    pd.testing.assert_frame_equal(again.iloc[:4], first)
    # a finished search called again trains nothing
    run_search(BASE, SPACE, tmp_path / "s", trials=7, **kw)
    assert len(f.calls) == 14
    # and the resumed search drew what an uninterrupted one draws
    fake()
    run_search(BASE, SPACE, tmp_path / "u", trials=7, **kw)
    whole = load_trials(tmp_path / "u")
    assert whole[[LAM, P, "value"]].equals(again[[LAM, P, "value"]])


def test_interrupted_trial_is_rerun_with_its_params(fake, tmp_path):
    f = fake(interrupt_at=5)  # trial 2, fold 1
    with pytest.raises(KeyboardInterrupt):
        run_search(BASE, SPACE, tmp_path, trials=5, folds=[0, 1], seed=0, startup_trials=3)
    frame = load_trials(tmp_path)
    assert frame["state"].tolist() == ["COMPLETE", "COMPLETE", "FAIL"]
    assert "KeyboardInterrupt" in frame["error"].iloc[2]
    interrupted = (frame[LAM].iloc[2], frame[P].iloc[2])
    run_search(BASE, SPACE, tmp_path, trials=5, folds=[0, 1], seed=0, startup_trials=3)
    frame = load_trials(tmp_path)
    assert frame["state"].tolist() == ["COMPLETE", "COMPLETE", "FAIL"] + ["COMPLETE"] * 3
    assert (frame[LAM].iloc[3], frame[P].iloc[3]) == interrupted  # re-run first, same folders
    assert f.calls[4][3].endswith("fold-0") and f.calls[5][3] == f.calls[4][3]
    assert f.calls[6][3] == f.calls[4][3].replace("fold-0", "fold-1")
    assert len(f.calls) == 5 + 2 * 3
    # the completed trials are those of an uninterrupted search
    fake()
    run_search(BASE, SPACE, tmp_path / "u", trials=5, folds=[0, 1], seed=0, startup_trials=3)
    assert complete(load_trials(tmp_path / "u"))[[LAM, P]].equals(complete(frame)[[LAM, P]])


def test_running_trial_of_a_dead_process_is_failed_and_rerun(fake, tmp_path):
    import optuna

    f = fake()
    run_search(BASE, SPACE, tmp_path, trials=2, folds=[0], seed=0, startup_trials=3)
    # a process that died inside a trial leaves it RUNNING
    study = optuna.load_study(study_name="search", storage=f"sqlite:///{tmp_path / 'study.db'}")
    dead = study.ask()
    for p in parse_space(SPACE):
        p.suggest(dead)
    params = dict(dead.params)
    run_search(BASE, SPACE, tmp_path, trials=4, folds=[0], seed=0, startup_trials=3)
    frame = load_trials(tmp_path)
    assert frame["state"].tolist() == ["COMPLETE", "COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]
    assert "interrupted" in frame["error"].iloc[2]
    assert frame[P].iloc[3] == params[P] and frame[LAM + "@zero"].iloc[3] == params[LAM + "@zero"]
    assert len(f.calls) == 4


def test_another_search_in_the_same_folder_is_refused(fake, tmp_path):
    fake()
    run_search(BASE, SPACE, tmp_path, trials=2, folds=[0], seed=0)
    other_space = {**SPACE, P: {"type": "int", "low": 1, "high": 10}}
    with pytest.raises(SearchError, match="another search.*space"):
        run_search(BASE, other_space, tmp_path, trials=3, folds=[0], seed=0)
    other_base = {**BASE, "epochs": 3}
    with pytest.raises(SearchError, match="another search.*base"):
        run_search(other_base, SPACE, tmp_path, trials=3, folds=[0], seed=0)
    with pytest.raises(SearchError, match="another search.*folds"):
        run_search(BASE, SPACE, tmp_path, trials=3, folds=[0, 1], seed=0)
    assert len(load_trials(tmp_path)) == 2
    # where the data lives, threads and image caching are not the search: it resumes
    moved = {**BASE, "dataset": {**BASE["dataset"], "root": "/elsewhere", "cache_images": True}, "threads": 2}
    run_search(moved, SPACE, tmp_path, trials=3, folds=[0], seed=0)
    assert len(load_trials(tmp_path)) == 3


def test_a_running_search_locks_its_folder(fake, tmp_path):
    fake()
    with open(tmp_path / ".search.lock", "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        with pytest.raises(SearchError, match="another process"):
            run_search(BASE, SPACE, tmp_path, trials=1, folds=[0], seed=0)


def test_bad_arguments(fake, tmp_path):
    fake()
    with pytest.raises(ValueError, match="validation.split = 'fold'"):
        run_search({**BASE, "validation": {"split": "holdout"}}, SPACE, tmp_path, trials=1, folds=[0])
    with pytest.raises(ValueError, match="folds = null needs a validation split"):
        run_search({**BASE, "validation": {}}, SPACE, tmp_path, trials=1, folds=None)
    with pytest.raises(ValueError, match="expected folds < validation.n_folds = 4"):
        run_search(BASE, SPACE, tmp_path, trials=1, folds=[4])
    with pytest.raises(ValueError, match="sampler = 'cma'"):
        run_search(BASE, SPACE, tmp_path, trials=1, folds=[0], sampler="cma")
    with pytest.raises(ValueError, match="trials = 0"):
        run_search(BASE, SPACE, tmp_path, trials=0, folds=[0])
    with pytest.raises(ValueError, match="optimizer.lrr"):  # not a run-config key: the schema names it
        run_search(BASE, {"optimizer.lrr": {"type": "float", "low": 1e-4, "high": 1e-3}}, tmp_path, trials=1, folds=[0])
    assert not (tmp_path / "study.db").exists()


def test_no_folds_uses_the_base_split(fake, tmp_path):
    f = fake()
    base = {**BASE, "validation": {"split": "fold", "fold": 3, "patience": 4}}
    best = run_search(base, SPACE, tmp_path, trials=2, folds=None, seed=0, sampler="random")
    assert [c[2] for c in f.calls] == [3, 3]
    assert all(c[3].endswith("/run") for c in f.calls)
    assert best["fold_values"] == [pytest.approx(best["value"])]


def test_best_validation_value(tmp_path):
    (tmp_path / "validation_log.json").write_text(
        json.dumps({"evaluations": [{"map_r": 0.2}, {"map_r": None}, {"map_r": 0.5}, {"map_r": 0.4}]})
    )
    assert best_validation_value(tmp_path) == 0.5
    (tmp_path / "validation_log.json").write_text(json.dumps({"evaluations": [{"map_r": None}]}))
    assert best_validation_value(tmp_path) is None
    assert best_validation_value(tmp_path / "missing") is None


# ----------------------------------------------------------------------------- posterior surface


def grid_frame(with_zero: bool = False) -> pd.DataFrame:
    rows = []
    for lam in [1e-6, 1e-4, 1e-2, 1.0] + ([0.0] if with_zero else []):
        for p in [1, 4, 8, 12]:
            rows.append({"state": "COMPLETE", LAM: lam, P: p, "value": objective(lam, p, 0)})
    rows.append({"state": "FAIL", LAM: 1e-3, P: 8, "value": float("nan")})
    return pd.DataFrame(rows)


def test_posterior_surface_interpolates_the_trials():
    frame = grid_frame()
    # grid 67: linspace(-6, 0) and linspace(1, 12) then hold every trial point
    s = posterior_surface(frame, LAM, P, log_x=True, grid=67, noise_level=1e-10, noise_level_bounds="fixed")
    assert s.X.shape == s.Y.shape == s.mean.shape == s.std.shape == (67, 67)
    assert s.X.min() == pytest.approx(-6) and s.X.max() == pytest.approx(0)
    assert s.Y.min() == pytest.approx(1) and s.Y.max() == pytest.approx(12)
    assert len(s.values) == 16 and s.x_zero is None  # the FAIL row is left out
    for x, y, v in zip(s.x_obs, s.y_obs, s.values):
        i, j = np.argmin(np.abs(s.Y[:, 0] - y)), np.argmin(np.abs(s.X[0] - x))
        assert abs(s.X[0, j] - x) < 1e-9 and abs(s.Y[i, 0] - y) < 1e-9
        assert s.mean[i, j] == pytest.approx(v, abs=0.02)
        assert s.std[i, j] < 0.02
    # away from the trials the posterior is uncertain
    assert s.std.max() > 0.05


def test_posterior_surface_zero_on_a_log_axis():
    frame = grid_frame(with_zero=True)
    s = posterior_surface(frame, LAM, P, log_x=True, grid=8, space=SPACE, noise_level=1e-10, noise_level_bounds="fixed")
    assert s.x_zero == pytest.approx(-7.0)  # one decade below the space's low (1e-6)
    assert np.allclose(s.x_obs[frame[LAM].iloc[: s.values.size].to_numpy() == 0], -7.0)
    assert s.X.min() == pytest.approx(-7.0) and np.all(np.isfinite(s.mean))
    s2 = posterior_surface(frame[frame[LAM] != 1e-6], LAM, P, log_x=True, grid=8)
    assert s2.x_zero == pytest.approx(-5.0)  # no space: one decade below 1e-4, the smallest positive value
    lin = posterior_surface(frame, LAM, P, grid=8)
    assert lin.x_zero is None and lin.X.min() == 0.0
    with pytest.raises(ValueError, match="no column 'x'"):
        posterior_surface(frame, "x", P)


# ----------------------------------------------------------------------------- CLI


def write_yaml(path: Path, data) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(data))
    return path


def test_cli_runs_a_search_and_prints_the_best(fake, tmp_path, capsys):
    f = fake()
    import yaml

    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    cfg = write_yaml(
        tmp_path / "search.yaml",
        {"base": "base.yaml", "space": SPACE, "trials": 3, "folds": [0, 1], "seed": 0, "sampler": "random"},
    )
    from dmlrepro.cli import main

    assert main(["tune", str(cfg), str(tmp_path / "out"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    best = json.loads((tmp_path / "out" / "best.json").read_text())
    assert f"best value {best['value']:.6g}" in out and f"{P}: {best['params'][P]}" in out
    assert len(f.calls) == 6
    assert tune_cli.main([str(cfg), str(tmp_path / "out"), "--trials", "4", "--no-progress"]) == 0
    assert len(f.calls) == 8


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"space": SPACE, "trials": 3}, "missing key(s) ['base']"),
        ({"base": BASE, "space": SPACE, "trials": 3, "fold": [0]}, "unknown key(s) ['fold']"),
        ({"base": BASE, "space": SPACE, "trials": 0}, "trials = 0: expected an integer >= 1"),
        ({"base": BASE, "space": SPACE, "trials": 3, "folds": 2}, "folds = 2: expected a non-empty list"),
        ({"base": BASE, "space": SPACE, "trials": 3, "sampler": "cma"}, "sampler = 'cma'"),
        (
            {"base": BASE, "space": {"asap.lam": {"type": "float", "low": 0.0, "high": 1.0, "log": True}}, "trials": 3},
            "'asap.lam': log: true needs low > 0",
        ),
        ({"base": "missing.yaml", "space": SPACE, "trials": 3}, "cannot read"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_cli_rejects_bad_search_configs(fake, tmp_path, capsys, data, expected):
    f = fake()
    cfg = write_yaml(tmp_path / "search.yaml", data)
    assert tune_cli.main([str(cfg), str(tmp_path / "out"), "--no-progress"]) == 2
    assert expected in capsys.readouterr().err
    assert f.calls == []


# ----------------------------------------------------------------------------- the real engine


@pytest.mark.slow
def test_real_search_two_trials_two_folds(tmp_path):
    base = {
        "dataset": {
            "name": "synthetic",
            "root": str(tmp_path / "data"),
            "prepare": True,
            "params": {"num_classes": 32, "images_per_class": 8, "size": 16},
            "image_size": 16,
            "resize": 16,
            "train_crop": "random",
            "sampler": "m_per_class",
            "m": 4,
            "batch_size": 16,
            "eval_batch_size": 256,
        },
        "model": {
            "backbone": "tiny_cnn",
            "backbone_kwargs": {"widths": [8, 16], "strides": [2, 2]},
            "embedding_size": 16,
            "l2_normalize": False,
        },
        "loss": {"name": "pair_c2", "hparams": {"pos_margin": 0.0, "neg_margin": 0.3841}},
        "optimizer": {"name": "adam", "lr": 1e-3},
        "validation": {"split": "fold", "patience": 4},
        "eval": {"every": 0, "before_training": False},
        "epochs": 2,
        "steps_per_epoch": 3,
        "seed": 0,
        "threads": 1,
    }
    space = {"optimizer.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}}
    best = run_search(base, space, tmp_path / "search", trials=2, folds=[0, 1], seed=0, sampler="gp")
    frame = load_trials(tmp_path / "search")
    assert frame["state"].tolist() == ["COMPLETE", "COMPLETE"]
    for _, row in frame.iterrows():
        runs = row["runs"].split(";")
        assert [Path(r).name for r in runs] == ["fold-0", "fold-1"]
        bests = []
        for fold, run in enumerate(runs):
            folder = tmp_path / "search" / run
            assert json.loads((folder / "metrics.json").read_text())["status"] == "completed"
            log = json.loads((folder / "validation_log.json").read_text())
            assert len(log["evaluations"]) == 2
            bests.append(max(e["map_r"] for e in log["evaluations"]))
            import yaml

            cfg = yaml.safe_load((folder / "config.yaml").read_text())
            assert cfg["validation"]["fold"] == fold and cfg["optimizer"]["lr"] == pytest.approx(row["optimizer.lr"])
        assert row["value"] == pytest.approx(np.mean(bests), abs=1e-12)
        assert [row["value_fold0"], row["value_fold1"]] == pytest.approx(bests, abs=1e-12)
    assert best["value"] == pytest.approx(frame["value"].max())
