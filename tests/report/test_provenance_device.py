"""The provenance table names the hardware behind each run where metrics.json recorded it: the device's
name, a GPU's uuid and the workflow's GPU slot (dmlrepro.report.provenance.section_runs, device_text;
metrics.json's `precision` from dmlrepro.train.precision.precision_record)."""

import json
from pathlib import Path

import torch

from dmlrepro.report.html import render_report
from dmlrepro.report.provenance import provenance, section_runs
from dmlrepro.train.precision import precision_record

REPO = Path(__file__).resolve().parents[2]
UUID = "5c1f3e2a-9b7d-4e0f-8a61-2d4c9e7b1a03"


def _run(run_id: str, device: str = "auto") -> dict:
    method, dataset, _, seed, _ = run_id.split("-")
    return {
        "run_id": run_id,
        "method": method,
        "dataset": dataset,
        "seed": int(seed[1:]),
        "config": {"device": device, "epochs": 2},
    }


def _files(folder: Path, name: str, precision: dict | None, stopped: int | None = None) -> tuple[Path, Path]:
    metrics, log = folder / f"{name}.json", folder / f"{name}.csv"
    record = {"status": "completed", **({"precision": precision} if precision is not None else {})}
    if stopped is not None:
        record["stopped_epoch"] = stopped
    metrics.write_text(json.dumps(record))
    log.write_text("epoch,seconds\n0,\n1,1800\n2,1800\n")
    return metrics, log


def test_each_run_shows_its_device_name_gpu_uuid_and_slot(tmp_path):
    cpu = precision_record(None, torch.device("cpu"), False, None)  # what a CPU run writes here
    gpu = {
        **cpu,
        "device": "cuda:0",
        "device_name": "NVIDIA H200",
        "cuda_visible_devices": "2",
        "gpu_slot": "2",
        "gpu_uuid": UUID,
    }
    assert set(gpu) == set(cpu)  # the keys metrics.json has
    runs = [
        _run("pfml-cub200-resnet50-s0-0123456789"),
        _run("pfml-cub200-resnet50-s1-1123456789"),
        _run("pfml-cub200-resnet50-s2-2123456789", device="cuda"),
    ]
    files = [_files(tmp_path, "gpu", gpu), _files(tmp_path, "cpu", cpu), _files(tmp_path, "old", None)]
    listed = section_runs(runs, [m for m, _ in files], [log for _, log in files])
    assert listed[0]["device"] == f"cuda:0 (NVIDIA H200; {UUID}; slot 2)"
    assert listed[1]["device"] == f"cpu ({cpu['device_name']}; {cpu['cpu_kernels']} kernels)" and cpu["device_name"]
    assert listed[2]["device"] == "cuda"  # recorded before metrics.json had a precision: the config's device
    prov = provenance(REPO, listed, {"pfml_table1": [r["run_id"] for r in listed]})
    out = tmp_path / "report" / "index.html"
    render_report([], [], prov, out, REPO / "reports/templates")
    assert f'<td class="label wrap">cuda:0 (NVIDIA H200; {UUID}; slot 2)</td>' in out.read_text()


def test_the_provenance_table_fits_a_1400_px_window(chromium, tmp_path):
    """The embedded default's longest run ids with a CPU run's device and kernels
    (`cpu (Intel(R) Xeon(R) Processor; AVX2 kernels)`): the device column wraps, nothing is cut off."""
    from dmlrepro.report.browser import check_report

    cpu = {**precision_record(None, torch.device("cpu"), False, None), "device_name": "Intel(R) Xeon(R) Processor"}
    runs = [_run(f"proxy_anchor_mlrc-double_digits-tiny_cnn-s{seed}-52a5b149f{seed}") for seed in range(3)]
    files = [_files(tmp_path, f"cpu{seed}", {**cpu, "cpu_kernels": "AVX2"}) for seed in range(3)]
    listed = section_runs(runs, [m for m, _ in files], [log for _, log in files])
    out = tmp_path / "report" / "index.html"
    render_report(
        [],
        [],
        provenance(REPO, listed, {"pfml_table1": [r["run_id"] for r in listed]}),
        out,
        REPO / "reports/templates",
    )
    assert check_report(out, width=1400)["overflowing"] == []


def test_a_run_that_stopped_early_shows_where_beside_its_cap(tmp_path):
    """docs/report.md: the provenance table's epochs are where early stopping ended a run, of its cap; a run
    at its cap (metrics.json's stopped_epoch null) or recorded before the field existed shows the cap."""
    runs = [_run("pfml-cub200-resnet50-s0-0123456789"), _run("pfml-cub200-resnet50-s1-1123456789")]
    runs[0]["config"]["epochs"] = runs[1]["config"]["epochs"] = 80
    files = [_files(tmp_path, "early", None, stopped=29), _files(tmp_path, "cap", None)]
    listed = section_runs(runs, [m for m, _ in files], [log for _, log in files])
    assert [r["stopped_epoch"] for r in listed] == [29, None]
    out = tmp_path / "report" / "index.html"
    render_report(
        [],
        [],
        provenance(REPO, listed, {"pfml_table1": [r["run_id"] for r in listed]}),
        out,
        REPO / "reports/templates",
    )
    rows = [row for row in out.read_text().split("<tr>") if "pfml-cub200-resnet50-s" in row]
    assert "<td>29 of 80</td>" in rows[0] and "<td>80</td>" in rows[1] and " of " not in rows[1]
