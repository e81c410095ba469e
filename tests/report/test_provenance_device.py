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
    digest = cpu["kernel_digest"]
    assert listed[1]["device"] == f"cpu ({cpu['device_name']}; {cpu['cpu_kernels']} kernels; digest {digest})"
    assert cpu["device_name"] and len(digest) == 12
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


def _listed(tmp_path: Path, precisions: list[dict | None]) -> list[dict]:
    """section_runs of one run per precision record (seeds 0, 1, ...)."""
    runs = [_run(f"pfml-cub200-resnet50-s{i}-{i}123456789") for i in range(len(precisions))]
    files = [_files(tmp_path, f"run{i}", p) for i, p in enumerate(precisions)]
    return section_runs(runs, [m for m, _ in files], [log for _, log in files])


def test_a_table_mixing_hosts_that_round_otherwise_is_flagged_on_the_first_screen(tmp_path):
    """docs/report.md: a table whose runs came from CPUs with other kernel digests, or from a CPU and a GPU,
    is named at the report's top and in the provenance with each kind's runs (the same run ids give other
    numbers on each host: docs/training.md#between-intel-and-amd); one host's runs, or runs that name no
    hardware, are not."""
    cpu = {"device": "cpu", "device_name": "AMD EPYC", "cpu_kernels": "AVX2", "kernel_digest": "23f64dd0d71b"}
    xeon = {**cpu, "device_name": "Intel(R) Xeon(R) Processor", "kernel_digest": "0123456789ab"}
    gpu = {"device": "cuda:0", "device_name": "NVIDIA H200"}
    old = {"device": "cpu", "device_name": "AMD EPYC", "cpu_kernels": "AVX2"}  # before the digest was recorded
    listed = _listed(tmp_path, [cpu, xeon, gpu, {**cpu}, None, old])
    ids = [r["run_id"] for r in listed]
    experiments = {"two_cpus": ids[:2], "cpu_and_gpu": [ids[0], ids[2]], "one_host": [ids[0], ids[3], ids[4]]}
    prov = provenance(REPO, listed, {**experiments, "old_and_new": [ids[0], ids[5]]})
    digest, other = "CPU kernels with digest 23f64dd0d71b", "CPU kernels with digest 0123456789ab"
    assert prov["mixed_hardware"] == {
        "two_cpus": {other: [ids[1]], digest: [ids[0]]},
        "cpu_and_gpu": {digest: [ids[0]], "NVIDIA H200": [ids[2]]},
        "old_and_new": {"AMD EPYC, AVX2 kernels (no digest recorded)": [ids[5]], digest: [ids[0]]},
    }
    out = tmp_path / "report" / "index.html"
    render_report([], [], prov, out, REPO / "reports/templates")
    html = out.read_text()
    top = html[: html.index('<section id="summary"')]
    assert "Mixed hardware:</span> 3 tables (two_cpus, cpu_and_gpu, old_and_new) mix runs" in top
    row = html[html.index('<td class="label">two_cpus</td>') :].split("</tr>")[0]
    assert f"{other}: 1 run ({ids[1]}); {digest}: 1 run ({ids[0]})" in row

    render_report(
        [], [], provenance(REPO, listed, {"one_host": experiments["one_host"]}), out, REPO / "reports/templates"
    )
    assert "Mixed hardware" not in out.read_text() and 'id="mixed-hardware"' not in out.read_text()
