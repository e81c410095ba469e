"""GPU slots through Snakemake on a simulated node (CUDA_VISIBLE_DEVICES=0,1,2, config `gpus: [0, 1,
2]`, a lock folder of its own; the runs train on the CPU): two workflows at once on the same device
list, one with 6 runs asking `gpu: 1` each, the other with 3. Each workflow runs at most 3 of its
GPU jobs at once (onstart's --resources gpu default); every job's log names the GPU it saw, and no
GPU holds two jobs at once. A `gpus:` entry the node does not have fails before any job."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
CONFIG = yaml.safe_load("""
data_root: data
results: results
gpus: [0, 1, 2]
resources: {train: {default: {gpu: 1}}}
defaults:
  device: cpu  # the simulated GPUs do not exist (device auto would refuse a job that asked for one)
  model: {backbone: tiny_cnn, embedding_size: 8}
  dataset: {image_size: 16, resize: 16, train_crop: random, batch_size: 8, sampler: m_per_class, m: 4,
            params: {num_classes: 4, images_per_class: 4}}
  epochs: 1
  steps_per_epoch: 1
  eval: {every: 0, before_training: false, ks: [1]}
datasets: {synthetic: {dataset: {name: synthetic}}}
methods: {proxy_anchor: {loss: {name: proxy_anchor}}}
experiments:
  runs: {methods: [proxy_anchor], datasets: [synthetic], seeds: [0, 1, 2, 3, 4, 5], metrics: [recall@1]}
""")
GPU_LINE = re.compile(r"^dmlrepro: on GPU (\S+) \(CUDA_VISIBLE_DEVICES=(\S+)\) from ([\d.]+)$", re.MULTILINE)
DONE_LINE = re.compile(r"^dmlrepro: done with GPU (\S+) at ([\d.]+)$", re.MULTILINE)


def _workflow(folder: Path, config: dict) -> subprocess.Popen:
    """Snakemake on `config` in `folder`, on the simulated node (its lock folder beside the workflows)."""
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "0,1,2",
        "DMLREPRO_GPU_LOCKS": str(folder.parent / "locks"),
        "TMPDIR": str(folder),
        "OMP_NUM_THREADS": "1",
    }
    command = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(folder), "--configfile"]
    return subprocess.Popen(
        [*command, str(folder / "config.yaml"), "--cores", "6", "results/experiments/runs.csv"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _most_train_jobs_at_once(output: str) -> int:
    """The most training jobs Snakemake had started and not yet finished, from its log."""
    running = most = 0
    for line in output.splitlines():
        if re.match(r"Job \d+: Training run", line):
            running += 1
            most = max(most, running)
        elif re.match(r"Finished jobid: \d+ \(Rule: train\)", line):
            running -= 1
    return most


def _gpu_intervals(folder: Path) -> list[tuple[str, float, float]]:
    """(GPU, from, until) of each training job, from its log; each saw its GPU as CUDA_VISIBLE_DEVICES."""
    intervals = []
    for log in sorted((folder / "results/logs/train").glob("*.log")):
        text = log.read_text()
        (gpu, visible, start), (done, end) = GPU_LINE.search(text).groups(), DONE_LINE.search(text).groups()
        assert gpu == visible == done, text
        intervals.append((gpu, float(start), float(end)))
    return intervals


def test_two_workflows_on_one_device_list_give_each_job_a_gpu_of_its_own(tmp_path):
    small = {**CONFIG, "experiments": {"runs": {**CONFIG["experiments"]["runs"], "seeds": [0, 1, 2]}}}
    workflows = [_workflow(tmp_path / "six", CONFIG), _workflow(tmp_path / "three", small)]
    outputs = [workflow.communicate(timeout=1100)[0] for workflow in workflows]
    assert [workflow.returncode for workflow in workflows] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert "at most 3 GPU jobs at once" in outputs[0]
    assert _most_train_jobs_at_once(outputs[0]) == 3  # 6 ready runs, 6 cores: the slots set the pace
    intervals = _gpu_intervals(tmp_path / "six") + _gpu_intervals(tmp_path / "three")
    assert len(intervals) == 9 and {gpu for gpu, _, _ in intervals} == {"0", "1", "2"}
    for gpu in "012":
        spans = sorted((start, end) for g, start, end in intervals if g == gpu)
        assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:])), (gpu, spans)


def test_a_gpu_the_node_does_not_have_fails_before_any_job(tmp_path):
    workflow = _workflow(tmp_path / "wrong", {**CONFIG, "gpus": [0, 7]})
    output = workflow.communicate(timeout=600)[0]
    assert workflow.returncode != 0
    assert "config gpus: 7 not visible on this node (visible: 0, 1, 2," in output
    assert not (tmp_path / "wrong/results").exists() and not (tmp_path / "wrong/data").exists()
