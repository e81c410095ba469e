"""The engine side of evaluation: embeddings left on the device, the run's k-NN backend (a runtime
key, outside the run id), and metrics equal whichever way the embeddings arrive."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dmlrepro.runs import run_id_for
from dmlrepro.train.config import ConfigError, config_identity, resolve_run_config
from dmlrepro.train.run_evaluation import compute_embeddings, embedding_metrics, knn_backend
from dmlrepro.train.runtime import evaluation_device


def _cfg(tmp_path, **top):
    cfg = {
        "dataset": {
            "name": "digits",
            "root": str(tmp_path),
            "image_size": 32,
            "resize": 32,
            "batch_size": 32,
            "eval_batch_size": 512,
        },
        "model": {"backbone": "tiny_cnn", "embedding_size": 16},
        "loss": {"name": "proxy_anchor"},
        "epochs": 2,
        **top,
    }
    return resolve_run_config(cfg)


def test_knn_backend_is_a_runtime_key(tmp_path):
    base = _cfg(tmp_path)
    assert base["speed"]["knn_backend"] == "auto" and knn_backend(base) == "auto"
    torch_cfg = _cfg(tmp_path, speed={"knn_backend": "torch"})
    assert knn_backend(torch_cfg) == "torch"
    assert config_identity(base) == config_identity(torch_cfg)
    assert run_id_for("m", "d", base) == run_id_for("m", "d", torch_cfg)
    with pytest.raises(ConfigError, match="speed.knn_backend"):
        _cfg(tmp_path, speed={"knn_backend": "gpu"})
    assert knn_backend({"eval": {}}) == "auto"  # a config from before the key


def test_evaluation_device_takes_the_request_then_the_recorded_device_then_auto(monkeypatch):
    cpu = torch.device("cpu")
    assert evaluation_device("cpu", "cuda:0") == cpu
    assert evaluation_device(None, "cpu") == cpu
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert evaluation_device(None, "cuda:0") == cpu  # trained on a GPU node, evaluated on a laptop
    assert evaluation_device(None, "auto") == cpu  # a config.yaml written before the device was recorded
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert evaluation_device(None, "cuda:1") == torch.device("cuda:1")
    assert evaluation_device(None, "cpu") == cpu  # the recorded CPU stays, a visible GPU or not


class _Items(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y, self.rows = x, y, list(range(len(x)))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def test_embeddings_on_the_device_give_the_same_metrics(tmp_path):
    g = torch.Generator().manual_seed(0)
    y = torch.arange(60) % 12
    x = torch.randn(12, 8, generator=g)[y] + 0.7 * torch.randn(60, 8, generator=g)
    model = torch.nn.Linear(8, 6)
    ds = _Items(x, y)
    host, labels, rows = compute_embeddings(model, ds, batch_size=16, device=torch.device("cpu"))
    dev, labels2, _ = compute_embeddings(model, ds, batch_size=16, device=torch.device("cpu"), on_device=True)
    assert isinstance(host, np.ndarray) and isinstance(dev, torch.Tensor) and dev.device.type == "cpu"
    np.testing.assert_array_equal(dev.numpy(), host)
    np.testing.assert_array_equal(labels, labels2)
    cfg = _cfg(tmp_path, eval={"ks": [1, 2, 4]})
    ref = embedding_metrics(host, labels, cfg)
    for backend in ("faiss-cpu", "torch"):
        c = {**cfg, "speed": {**cfg["speed"], "knn_backend": backend}}
        assert embedding_metrics(dev, labels, c) == ref
        assert embedding_metrics(host, labels, c, gallery=(dev[:30], labels[:30])) == embedding_metrics(
            host, labels, cfg, gallery=(host[:30], labels[:30])
        )
    bad = dev.clone()
    bad[3, 0] = float("nan")
    assert embedding_metrics(bad, labels, cfg) is None
