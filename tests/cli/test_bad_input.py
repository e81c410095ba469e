"""Bad input (docs/bad-input.md): one table of bad inputs, each given where a researcher would
give it (a workflow config to `snakemake -n` or `dmlrepro runs`, a run config to `dmlrepro train`,
`dmlrepro prepare` against archives served from 127.0.0.1, `dmlrepro evaluate`,
`dmlrepro fetch-weights`). Every row must fail with a non-zero exit and a message naming the
offending key, file or value and what is expected, without a Python traceback, and before
anything expensive ran: no run folder with checkpoints or metrics, no download after a config
error, no job started. The table is docs/bad-input.md.

The `dmlrepro` rows call the console script's function (`dmlrepro.cli.main`) in the test process
(starting Python and torch per row would cost seconds); an exception escaping it is what the
terminal would show as a traceback, and fails the row. Only four rows pay for a real
`snakemake -n` (about 4 s each).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dmlrepro.cli import main as dmlrepro

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
TINY = REPO / "tests/workflow/tiny.yaml"


def _data_fixtures():
    """tests/data/conftest.py (tiny archives in the real layouts, the 127.0.0.1 file server),
    imported by path: tests/ is not a package."""
    spec = importlib.util.spec_from_file_location("_bad_input_data_fixtures", REPO / "tests/data/conftest.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


fx = _data_fixtures()


@pytest.fixture
def server():
    s = fx.FileServer()
    yield s
    s.close()


# ------------------------------------------------------------------------------------ the rows
@dataclass
class Ctx:
    tmp: Path
    server: Any
    before: Any = None  # what a row's `after` check compares with

    def workflow_config(self, mutate: Callable[[dict], Any]) -> Path:
        config = yaml.safe_load(TINY.read_text())
        mutate(config)
        path = self.tmp / "workflow.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def run_config(self, params: bool = True, **changes) -> str:
        """A tiny valid run config (synthetic, tiny_cnn; 2 train classes) with `changes` deep-merged in."""
        from dmlrepro.nested import deep_merge

        config = {
            "dataset": {
                "name": "synthetic",
                "root": str(self.tmp / "data"),
                "sampler": "m_per_class",
                "m": 2,
                "batch_size": 4,
                "params": {"num_classes": 4, "images_per_class": 6},
            },
            "model": {"backbone": "tiny_cnn", "embedding_size": 8},
            "epochs": 1,
            "steps_per_epoch": 1,
            "eval": {"every": 0, "before_training": False, "ks": [1]},
        }
        if not params:
            del config["dataset"]["params"]
        path = self.tmp / "run.yaml"
        path.write_text(yaml.safe_dump(deep_merge(config, changes)))
        return str(path)

    @property
    def out(self) -> str:
        return str(self.tmp / "run")

    def served_cub(self, damage: Callable[[fx.TinyDataset], Any] | None = None) -> list[str]:
        """Serve a tiny CUB archive; the argv that prepares it from there (md5 of what is served)."""
        tiny = fx.tiny_cub()
        if damage:
            damage(tiny)
        self.server.files.update(tiny.files)
        md5 = tiny.md5["CUB_200_2011.tgz"]
        return [
            "prepare",
            "cub200",
            "--root",
            str(self.tmp / "data"),
            "--url",
            self.server.url + "CUB_200_2011.tgz",
            "--md5",
            f"CUB_200_2011.tgz={md5}",
            "--no-strict-counts",
            "--quiet",
        ]


def _corrupt_image(tiny):
    """Rebuild the CUB archive with one image replaced by an HTML page (a mirror's error page)."""
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(tiny.files["CUB_200_2011.tgz"])) as tf:
        members = {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}
    members["CUB_200_2011/images/002.Bird_2/Bird_2_0001.jpg"] = b"<html>403 Forbidden</html>\n"
    tiny.files["CUB_200_2011.tgz"] = fx.make_tgz(members)


def _truncate(tiny):
    data = tiny.files["CUB_200_2011.tgz"]
    tiny.files["CUB_200_2011.tgz"] = data[: len(data) * 2 // 3]


def _prepared_with_garbage_images(ctx: Ctx) -> list[str]:
    """A prepared synthetic dataset whose image files were overwritten after preparation."""
    from dmlrepro.data import prepare

    prepare("synthetic", ctx.tmp / "data", progress=False, num_classes=4, images_per_class=6)
    for image in (ctx.tmp / "data/synthetic/images").rglob("*.*"):
        image.write_bytes(b"not an image")
    return ["train", ctx.run_config(), ctx.out]


def _file_as_outdir(ctx: Ctx) -> list[str]:
    (ctx.tmp / "notes.txt").write_text("a regular file\n")
    return ["train", ctx.run_config(), str(ctx.tmp / "notes.txt" / "run")]  # tests run as root: chmod blocks nothing


def _written(ctx: Ctx, name: str, data: str | bytes) -> str:
    path = ctx.tmp / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


BROKEN_YAML = "experiments:\n  table: {methods: [pfml\n  seeds: [0]\n"  # an unclosed flow sequence


def _image_deleted_after_prepare(ctx: Ctx) -> list[str]:
    """A prepared synthetic dataset one of whose manifest rows' images was deleted afterwards."""
    from dmlrepro.data import prepare

    manifest = prepare("synthetic", ctx.tmp / "data", progress=False, num_classes=4, images_per_class=6)
    first = manifest.read_text().splitlines()[1].split(",")[0]
    (manifest.parent / first).unlink()
    return ["train", ctx.run_config(), ctx.out]


def _damaged_run(ctx: Ctx) -> list[str]:
    """A completed run whose checkpoints were truncated and whose embeddings were deleted."""
    from dmlrepro.train import train_run

    config = yaml.safe_load(Path(ctx.run_config()).read_text())
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        train_run(config, ctx.out, progress=False)
    run = Path(ctx.out)
    for checkpoint in (run / "checkpoints").glob("*.pt"):
        checkpoint.write_bytes(checkpoint.read_bytes()[:100])
    for embeddings in run.glob("embeddings*.npz"):
        embeddings.unlink()
    ctx.before = sorted(p.name for p in (run / "checkpoints").iterdir())
    return ["evaluate", ctx.out]


def _damaged_run_left_as_it_was(ctx: Ctx) -> None:
    """No checkpoint renamed, and no metrics.json left saying the run completed."""
    run = Path(ctx.out)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ctx.before
    metrics = run / "metrics.json"
    assert not metrics.exists() or '"completed"' not in metrics.read_text()


def _another_runs_folder(ctx: Ctx) -> list[str]:
    """OUTDIR holds a run with another config (optimizer.lr): left untouched."""
    from dmlrepro.train.config import dump_yaml, resolve_run_config

    other = yaml.safe_load(Path(ctx.run_config(optimizer={"lr": 0.5})).read_text())
    Path(ctx.out).mkdir()
    (Path(ctx.out) / "config.yaml").write_text(dump_yaml(resolve_run_config(other)))
    ctx.before = (Path(ctx.out) / "config.yaml").read_text()
    return ["train", ctx.run_config(), ctx.out]


def _other_run_untouched(ctx: Ctx) -> None:
    assert {p.name for p in Path(ctx.out).iterdir()} <= {"config.yaml", ".lock"}  # .lock: the run lock's file
    assert (Path(ctx.out) / "config.yaml").read_text() == ctx.before


def _damaged_run_config(ctx: Ctx) -> list[str]:
    Path(ctx.out).mkdir()
    (Path(ctx.out) / "config.yaml").write_text(BROKEN_YAML)
    return ["evaluate", ctx.out]


def _set(path: str, value: Any) -> Callable[[dict], None]:
    """A workflow-config mutation: set the dotted key `path` (creating mappings on the way)."""

    def mutate(config: dict) -> None:
        *parents, last = path.split(".")
        node = config
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return mutate


def _pop(path: str) -> Callable[[dict], None]:
    def mutate(config: dict) -> None:
        *parents, last = path.split(".")
        node = config
        for key in parents:
            node = node[key]
        node.pop(last)

    return mutate


@dataclass
class Row:
    id: str
    entry: str  # runs | snakemake | train | prepare | evaluate | fetch-weights
    make: Callable[[Ctx], Any]  # -> argv of `dmlrepro` (entry != snakemake) or a config mutation
    message: str  # regex the error output must match
    where: str  # where the input is checked (docs/bad-input.md)
    xfail: str | None = None  # a known gap: the fix it needs (strict xfail)
    downloads: int = 0  # requests the file server may see
    after: Callable[[Ctx], None] | None = None  # a row that starts from a run: what must hold of it afterwards


def _runs(mutate):
    return lambda ctx: ["runs", "--config", str(ctx.workflow_config(mutate))]


ROWS = [
    # --- workflow config, resolved by `dmlrepro runs` (the same resolve_runs the Snakefile runs)
    Row(
        "unknown-method",
        "runs",
        _runs(lambda c: c["experiments"]["table"]["methods"].append("pfmll")),
        r"experiments\.table: unknown method 'pfmll'; config\.methods defines \[.*'proxy_anchor'",
        "dmlrepro.runs.resolve_runs",
    ),
    Row(
        "unknown-dataset",
        "runs",
        _runs(lambda c: c["experiments"]["table"]["datasets"].append("cub")),
        r"experiments\.table: unknown dataset 'cub'; config\.datasets defines \[.*'synthetic'",
        "dmlrepro.runs.resolve_runs",
    ),
    Row(
        "unknown-experiment",
        "runs",
        lambda ctx: ["runs", "--config", str(TINY), "--experiment", "tabel"],
        r"unknown experiment 'tabel'; config\.experiments defines \[.*'table'",
        "dmlrepro.runs.resolve_runs",
    ),
    Row(
        "epochs-string",
        "runs",
        _runs(_set("defaults.epochs", "ten")),
        r"run config: epochs = 'ten': expected an integer",
        "dmlrepro.train.config.resolve_run_config",
    ),
    Row(
        "negative-lr",
        "runs",
        _runs(_set("methods.pfml.optimizer", {"lr": -1e-4})),
        r"method pfml.*optimizer\.lr = -0\.0001: expected a number > 0",
        "dmlrepro.train.config.resolve_run_config",
    ),
    Row(
        "unknown-loss",
        "runs",
        _runs(_set("methods.pfml.loss.name", "proxyanchor")),
        r"loss\.name = 'proxyanchor': expected one of \[.*'proxy_anchor'",
        "dmlrepro.train.config.resolve_run_config",
    ),
    Row(
        "unknown-loss-hparam",
        "runs",
        _runs(_set("methods.pfml.loss.hparams.alfa", 1.0)),
        r"loss\.hparams = .* for loss 'pfml': .*unexpected keyword argument 'alfa'",
        "dmlrepro.train.config._check_loss (builds the loss once)",
    ),
    Row(
        "unknown-backbone",
        "runs",
        _runs(_set("defaults.model.backbone", "resnet5")),
        r"model\.backbone = 'resnet5': unknown backbone 'resnet5'; known: .*resnet50",
        "dmlrepro.train.config.resolve_run_config",
    ),
    Row(
        "negative-proxies-per-class",
        "runs",
        _runs(_set("methods.pfml.loss.hparams.proxies_per_class", -1)),
        r"for loss 'pfml': .*proxies_per_class >= 0, got 4, 16, -1",
        "the loss's constructor, via _check_loss",
    ),
    Row(
        "zero-centers-per-class",
        "runs",
        _runs(_set("methods.proxy_anchor.loss", {"name": "soft_triple", "hparams": {"centers_per_class": 0}})),
        r"loss\.hparams.*centers_per_class.*(>= 1|at least 1)",
        "the loss's constructor, via _check_loss",
    ),
    Row(
        "batch-not-multiple-of-m",
        "runs",
        _runs(_set("defaults.dataset.batch_size", 18)),
        r"dataset\.batch_size = 18: expected a multiple of dataset\.m = 4 \(sampler m_per_class\)",
        "dmlrepro.train.config.resolve_run_config",
    ),
    Row(
        "sweep-unknown-key",
        "runs",
        _runs(_set("experiments.alpha.sweep", {"optimizer.lrr": [1e-3]})),
        r"experiments\.alpha .*unknown key 'optimizer\.lrr'; expected one of \[.*'lr'",
        "dmlrepro.train.config.resolve_run_config (per sweep point)",
    ),
    Row(
        "label-noise-rate-above-1",
        "runs",
        _runs(_set("experiments.noise.overrides.dataset.label_noise.rate", 1.5)),
        r"experiments\.noise .*dataset\.label_noise\.rate = 1\.5: expected a fraction in \[0, 1\]",
        "dmlrepro.train.config.resolve_run_config",
    ),
    Row(
        "runs-yaml-syntax",
        "runs",
        lambda ctx: ["runs", "--config", _written(ctx, "workflow.yaml", BROKEN_YAML)],
        r"workflow\.yaml: line 3, column 8: not valid YAML \(expected ',' or '\]', but got ':'.*\); "
        r"expected a workflow config in YAML",
        "dmlrepro.runs.read_workflow_config",
    ),
    Row(
        "runs-config-missing",
        "runs",
        lambda ctx: ["runs", "--config", str(ctx.tmp / "nonexist.yaml")],
        r"nonexist\.yaml: file not found; expected a workflow config \(YAML\)",
        "dmlrepro.runs.read_workflow_config",
    ),
    Row(
        "runs-config-not-a-mapping",
        "runs",
        lambda ctx: ["runs", "--config", _written(ctx, "w.yaml", "- a\n- b\n")],
        r"w\.yaml: a workflow config is a YAML mapping \(datasets, methods, experiments, \.\.\.\), got list",
        "dmlrepro.runs.read_workflow_config",
    ),
    Row(
        "runs-schema-seed-negative",
        "runs",
        _runs(_set("experiments.table.seeds", [-1])),
        r"workflow\.yaml: experiments\.table\.seeds\.0: -1 is less than the minimum of 0; "
        r"expected what config\.schema\.yaml allows",
        "dmlrepro.runs.validate_workflow_config (the schema)",
    ),
    Row(
        "runs-schema-unknown-top-key",
        "runs",
        _runs(_set("experimens", {})),
        r"workflow\.yaml: the config: Additional properties are not allowed \('experimens' was unexpected\)",
        "dmlrepro.runs.validate_workflow_config (the schema)",
    ),
    Row(
        "rsw-hparam-not-a-number",
        "runs",
        _runs(_set("methods.rsw.loss.hparams.k1", "one")),
        r"loss\.hparams\.k1 = 'one': expected a number \(loss 'rsw'\)",
        "dmlrepro.train.config_checks.check_loss_hparam_types",
    ),
    Row(
        "eval-ks-zero",
        "runs",
        _runs(_set("defaults.eval.ks", [0, 1])),
        r"eval\.ks = \[0, 1\]: expected a non-empty list of integers >= 1",
        "dmlrepro.train.config.resolve_run_config",
    ),
    # --- workflow config through `snakemake -n` (schema, then the run table in common.smk)
    Row(
        "smk-unknown-method",
        "snakemake",
        lambda ctx: lambda c: c["experiments"]["table"]["methods"].append("pfmll"),
        r"ExperimentError.*\n.*experiments\.table: unknown method 'pfmll'; config\.methods defines",
        "workflow/rules/common.smk -> dmlrepro.runs.resolve_runs",
    ),
    Row(
        "smk-sweep-without-x",
        "snakemake",
        lambda ctx: _pop("experiments.alpha.report.x"),
        r"Error validating config file\.\nValidationError: 'x' is a required property(.|\n)*"
        r"On instance\['experiments'\]\['alpha'\]\['report'\]",
        "workflow/schemas/config.schema.yaml",
    ),
    Row(
        "smk-unknown-reported-table",
        "snakemake",
        lambda ctx: _set("experiments.table.report.reported", "pfml_table9"),
        r"experiments\.table\.report\.reported = 'pfml_table9': expected one of .*pfml_table1",
        "workflow/rules/common.smk reported_table",
    ),
    Row(
        "smk-resources-unknown-dataset",
        "snakemake",
        lambda ctx: _set("resources", {"train": {"cub200": {"runtime": 10}}}),
        r"config resources\.train\.cub200: expected 'default' or a key of datasets \(.*synthetic",
        "workflow/rules/common.smk train_resource",
    ),
    # --- one run: `dmlrepro train RUN_CONFIG OUTDIR`
    Row(
        "run-config-missing",
        "train",
        lambda ctx: ["train", str(ctx.tmp / "nope.yaml"), ctx.out],
        r"run config file not found: .*nope\.yaml",
        "dmlrepro.train.config.load_run_config",
    ),
    Row(
        "train-yaml-syntax",
        "train",
        lambda ctx: ["train", _written(ctx, "run.yaml", BROKEN_YAML), ctx.out],
        r"run\.yaml, line 3, column 8: not valid YAML \(expected ',' or '\]', but got ':'.*\); "
        r"expected a run config in YAML",
        "dmlrepro.train.config_checks.read_yaml",
    ),
    Row(
        "run-config-not-utf8",
        "train",
        lambda ctx: ["train", _written(ctx, "run.yaml", b"\xff\xfe\x00x"), ctx.out],
        r"run\.yaml: not UTF-8 text \(invalid start byte at byte 0\); expected a run config in YAML",
        "dmlrepro.train.config_checks.read_yaml",
    ),
    Row(
        "run-config-not-a-mapping",
        "train",
        lambda ctx: ["train", _written(ctx, "run.yaml", "- 1\n"), ctx.out],
        r"run\.yaml: a run config must be a YAML mapping, got list",
        "dmlrepro.train.config.load_run_config",
    ),
    Row(
        "loss-hparam-not-a-number",
        "train",
        lambda ctx: ["train", ctx.run_config(loss={"name": "pfml", "hparams": {"alpha": "four"}}), ctx.out],
        r"^dmlrepro train: error: run config: loss\.hparams\.alpha = 'four': expected a number \(loss 'pfml'\)$",
        "dmlrepro.train.config_checks.check_loss_hparam_types",
    ),
    Row(
        "set-without-value",
        "train",
        lambda ctx: ["train", ctx.run_config(), ctx.out, "--set", "optimizer.lr"],
        r"--set 'optimizer\.lr': expected KEY=VALUE, e\.g\. optimizer\.lr=1e-3",
        "dmlrepro.train.cli",
    ),
    Row(
        "run-config-unknown-key",
        "train",
        lambda ctx: ["train", ctx.run_config(optimizr={"lr": 1e-3}), ctx.out],
        r"run config: unknown key 'optimizr'; expected one of \[.*'optimizer'",
        "dmlrepro.train.config.resolve_run_config",
    ),
    Row(
        "outdir-holds-another-run",
        "train",
        _another_runs_folder,
        r"run holds a run with a different config \(optimizer\.lr: 0\.5 \(run directory\) vs 0\.0001 \(now\)\); "
        r"use another output directory",
        "dmlrepro.train.engine.train_run",
        after=_other_run_untouched,
    ),
    Row(
        "dataset-not-prepared",
        "train",
        lambda ctx: ["train", ctx.run_config(False, dataset={"name": "cub200", "prepare": False}), ctx.out],
        r"dataset 'cub200' is not prepared under '.*data'.*manifest\.csv: manifest not found.*"
        r"prepare cub200 --root",
        "dmlrepro.train.run_data.open_manifest",
    ),
    Row(
        "too-few-classes-for-batch",
        "train",
        lambda ctx: ["train", ctx.run_config(dataset={"batch_size": 12}), ctx.out],
        r"dataset\.batch_size/dataset\.m: .*batch_size 12 must be a multiple of m=2 and hold at most 2 classes",
        "dmlrepro.data.samplers.MPerClassBatchSampler via train.run_data.build_batch_sampler",
    ),
    Row(
        "empty-split",
        "train",
        lambda ctx: ["train", ctx.run_config(dataset={"train_split": "query"}), ctx.out],
        r"synthetic/manifest\.csv: no rows with split 'query'; "
        r"expected one of the manifest's splits \['test', 'train'\]",
        "dmlrepro.data.dataset.ManifestDataset",
    ),
    Row(
        "image-damaged-after-prepare",
        "train",
        _prepared_with_garbage_images,
        r"synthetic/images/\S+: cannot decode image",
        "dmlrepro.data.dataset.load_image (first batch)",
    ),
    Row(
        "image-deleted-after-prepare",
        "train",
        _image_deleted_after_prepare,
        r"synthetic/images/c0000/0000\.png: image missing \(a row of the dataset's manifest\.csv names it\); "
        r"expected the file `dmlrepro prepare` wrote",
        "dmlrepro.data.dataset.load_image (first batch)",
    ),
    Row(
        "outdir-under-a-file",
        "train",
        _file_as_outdir,
        r"notes\.txt/run.*(not a folder|is a file).*expected",
        "dmlrepro.train.engine.train_run (outdir.mkdir)",
    ),
    # --- datasets: `dmlrepro prepare NAME --root DIR` (archives served from 127.0.0.1)
    Row(
        "prepare-unknown-dataset",
        "prepare",
        lambda ctx: ["prepare", "cub", "--root", str(ctx.tmp / "data")],
        r"argument name: invalid choice: 'cub' \(choose from .*cub200",
        "argparse (dmlrepro.data.cli)",
    ),
    Row(
        "prepare-bad-md5-option",
        "prepare",
        lambda ctx: ctx.served_cub()[:-4] + ["--md5", "97eceeb196236b17998738112f37df78"],
        r"--md5 '97eceeb196236b17998738112f37df78': expected FILE=MD5",
        "dmlrepro.data.cli (before any download)",
    ),
    Row(
        "prepare-wrong-md5",
        "prepare",
        lambda ctx: [a for a in ctx.served_cub() if not a.startswith("CUB_200") and a != "--md5"],
        r"CUB_200_2011\.tgz \(downloaded from http://127\.0\.0\.1:\d+/CUB_200_2011\.tgz\): md5 is [0-9a-f]{32}, "
        r"expected 97eceeb196236b17998738112f37df78",
        "dmlrepro.data.download (after the download)",
        downloads=1,
    ),
    Row(
        "prepare-truncated-archive",
        "prepare",
        lambda ctx: ctx.served_cub(_truncate),
        r"CUB_200_2011\.tgz.*truncated or corrupt",
        "dmlrepro.data.archives.extract_to_temp",
        downloads=1,
    ),
    Row(
        "prepare-image-not-an-image",
        "prepare",
        lambda ctx: ctx.served_cub(_corrupt_image),
        r"cub200: image 'CUB_200_2011/images/002\.Bird_2/Bird_2_0001\.jpg' is not a readable image.*"
        r"expected an image file",
        "dmlrepro.data.prepared.finalize (image headers)",
        downloads=1,
    ),
    # --- `dmlrepro evaluate OUTDIR`, `dmlrepro fetch-weights NAME`
    Row(
        "evaluate-not-a-run",
        "evaluate",
        lambda ctx: ["evaluate", str(ctx.tmp)],
        r"run config file not found: .*/config\.yaml",
        "dmlrepro.train.run_evaluation.evaluate_run",
    ),
    Row(
        "evaluate-damaged-run",
        "evaluate",
        _damaged_run,
        r"^dmlrepro evaluate: error: .*/run: no embeddings_test\.npz and no final checkpoint \(unreadable: "
        r"ckpt-e0002-\S+\.pt: .*truncated.*\); its metrics\.json removed; run `dmlrepro train .*` first$",
        "dmlrepro.train.run_evaluation.evaluate_run",
        after=_damaged_run_left_as_it_was,
    ),
    Row(
        "evaluate-config-yaml-syntax",
        "evaluate",
        _damaged_run_config,
        r"run/config\.yaml, line 3, column 8: not valid YAML",
        "dmlrepro.train.config_checks.read_yaml",
    ),
    Row(
        "check-report-missing",
        "check-report",
        lambda ctx: ["check-report", str(ctx.tmp / "nope.html")],
        r"^dmlrepro check-report: .*nope\.html: file not found; expected a built report",
        "dmlrepro.report.browser.main",
    ),
    Row(
        "unknown-command",
        "dmlrepro",
        lambda ctx: ["trian", ctx.run_config(), ctx.out],
        r"^dmlrepro: unknown command 'trian'$",
        "dmlrepro.cli.main",
    ),
    Row(
        "fetch-unknown-weights",
        "fetch-weights",
        lambda ctx: ["fetch-weights", "resnet5", "--cache-dir", str(ctx.tmp / "weights")],
        r"unknown weights or backbone 'resnet5'; weights: .*resnet50\.tv_in1k",
        "dmlrepro.models.weights",
    ),
]


def _run_dmlrepro(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = dmlrepro(argv)
        except SystemExit as e:  # argparse: usage + message, exit 2
            code = e.code if isinstance(e.code, int) else 1
        except Exception as e:  # what a terminal would show as a traceback
            pytest.fail(f"dmlrepro {' '.join(argv[:2])} raised {type(e).__name__} (a traceback): {e}")
    return code, out.getvalue()


def _run_snakemake(ctx: Ctx, mutate) -> tuple[int, str]:
    config = ctx.workflow_config(mutate)
    command = [
        str(SNAKEMAKE),
        "-s",
        str(REPO / "Snakefile"),
        "--directory",
        str(ctx.tmp / "tmp"),
        "--configfile",
        str(config),
        "--cores",
        "1",
        "-n",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize(
    "row",
    [pytest.param(r, id=r.id, marks=[pytest.mark.xfail(strict=True, reason=r.xfail)] if r.xfail else []) for r in ROWS],
)
@pytest.mark.slow
def test_bad_input(row: Row, tmp_path, server):
    ctx = Ctx(tmp_path, server)
    made = row.make(ctx)
    outdir_before = Path(ctx.out).exists()
    code, output = _run_snakemake(ctx, made) if row.entry == "snakemake" else _run_dmlrepro(made)
    assert code not in (0, None), f"exit 0 for a bad input:\n{output[-2000:]}"
    if row.entry == "snakemake":
        assert re.search(row.message, output), f"message does not match {row.message!r}:\n{output[-2000:]}"
    else:  # one line says it all
        assert any(re.search(row.message, line) for line in output.splitlines()), (
            f"no line matches {row.message!r}:\n{output[-2000:]}"
        )
    assert "Traceback (most recent call last)" not in output, output[-3000:]
    if row.after:  # a row that starts from a run: it is left as the row says
        row.after(ctx)
    else:  # nothing expensive ran: no training step, no run table, no job, no download after a config error
        assert not list(tmp_path.rglob("checkpoints")) and not list(tmp_path.rglob("metrics.json"))
        assert Path(ctx.out).exists() == outdir_before, "a failed start left its run folder (config.yaml, .lock)"
    assert not (tmp_path / "tmp/results").exists()
    assert len(server.requests) <= row.downloads, server.requests


#: how docs/bad-input.md names each entry point
ENTRY_NAMES = {
    "runs": "`dmlrepro runs`",
    "snakemake": "`snakemake -n`",
    "train": "`dmlrepro train`",
    "prepare": "`dmlrepro prepare`",
    "evaluate": "`dmlrepro evaluate`",
    "fetch-weights": "`dmlrepro fetch-weights`",
    "check-report": "`dmlrepro check-report`",
    "dmlrepro": "`dmlrepro`",
}


def _documented_rows() -> dict[str, list[str]]:
    """docs/bad-input.md's table: id -> its cells (bad input, entry point, message, checked in)."""
    rows = {}
    for line in (REPO / "docs/bad-input.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if line.startswith("| `") and len(cells) == 5:
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_table_is_big_enough_and_documented():
    """docs/bad-input.md lists exactly these rows, in this order, each with its entry point; a row is
    *pending* there exactly when it is an xfail here (none is today)."""
    assert len(ROWS) >= 45 and len({r.id for r in ROWS}) == len(ROWS)
    documented = _documented_rows()
    assert list(documented) == [r.id for r in ROWS]
    for row in ROWS:
        _, entry, message, _ = documented[row.id]
        assert entry == ENTRY_NAMES[row.entry], row.id
        assert ("*pending*" in message) == bool(row.xfail), row.id
