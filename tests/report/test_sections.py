"""Which run a per-dataset figure (retrieval grid, t-SNE) or a per-method panel draws."""

from dmlrepro.report.sections import _first_runs_per_dataset, _first_runs_per_method


def _run(method, dataset, seed, sweep=0):
    return {"run_id": f"{method}-{dataset}-s{seed}-{sweep}", "method": method, "dataset": dataset, "seed": seed}


def test_first_method_lowest_seed_per_dataset():
    # declared order: methods x datasets x sweep x seeds, seeds listed high to low
    runs = [_run(m, d, s, p) for m in ("pfml", "pa") for d in ("cub", "cars") for p in (0, 1) for s in (3, 0)]
    picked = _first_runs_per_dataset(runs)
    assert [r["run_id"] for r in picked] == ["pfml-cub-s0-0", "pfml-cars-s0-0"]
    assert _first_runs_per_dataset([]) == []


def test_lowest_seed_per_method_and_dataset():
    runs = [_run(m, "cub", s) for m in ("pfml", "pa") for s in (2, 1)]
    assert [r["run_id"] for r in _first_runs_per_method(runs)] == ["pfml-cub-s1-0", "pa-cub-s1-0"]
