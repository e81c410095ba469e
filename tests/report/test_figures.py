"""Figures and the toy's fields: the toy class field against a float64 double loop of eqs. (3)-(5), sweep
parsing, PNGs."""

import numpy as np
import pandas as pd
import pytest

from dmlrepro.losses import build_loss
from dmlrepro.report import figures, landscapes

PNG = b"\x89PNG\r\n\x1a\n"


def _psi_loop(r, sources, labels, cls, delta, alpha):
    """Eqs. (1)-(5) written out: ψ_att = −max(d, δ)^−α for class cls, ψ_rep = min(d, δ)^−α otherwise."""
    total = 0.0
    for s, label in zip(sources, labels):
        d = float(np.sqrt(((r - s) ** 2).sum()))
        total += -(max(d, delta) ** -alpha) if label == cls else min(max(d, 1e-4), delta) ** -alpha
    return total


def test_class_field_matches_the_equations_and_its_force_is_minus_the_gradient():
    loss = build_loss("pfml", num_classes=2, embedding_size=2, proxies_per_class=2, delta=0.2, alpha=4.0)
    points, labels, proxies, proxy_labels = landscapes.toy_configuration(0)
    sources, source_labels = np.concatenate([points, proxies]), np.concatenate([labels, proxy_labels])
    r = np.random.default_rng(1).uniform(-1, 1, (25, 2))
    for cls in (0, 1):
        psi, force = landscapes.class_field(loss, r, sources, source_labels, cls)
        expected = [_psi_loop(x, sources, source_labels, cls, 0.2, 4.0) for x in r]
        np.testing.assert_allclose(psi, expected, rtol=1e-12)
        h = 1e-6
        for i in range(2):
            step = np.zeros(2)
            step[i] = h
            numeric = [
                -(
                    _psi_loop(x + step, sources, source_labels, cls, 0.2, 4.0)
                    - _psi_loop(x - step, sources, source_labels, cls, 0.2, 4.0)
                )
                / (2 * h)
                for x in r
            ]
            np.testing.assert_allclose(force[:, i], numeric, rtol=1e-5, atol=1e-6)


def test_sweep_points_parse_the_aggregated_sweep_column():
    frame = pd.DataFrame({"sweep": ["loss.hparams.alpha=0.0", "loss.hparams.alpha=4.0, seed=1"]})
    assert figures.sweep_points(frame, "loss.hparams.alpha").tolist() == [0.0, 4.0]
    with pytest.raises(ValueError, match="no key"):
        figures.sweep_points(frame, "loss.hparams.delta")


def test_sweep_figure_and_toy_write_pngs(tmp_path):
    frame = pd.DataFrame(
        {
            "method": ["pfml"] * 4,
            "dataset": ["a", "a", "b", "b"],
            "sweep": ["x=1", "x=2", "x=1", "x=2"],
            "recall@1_mean": [0.1, 0.2, 0.3, 0.4],
            "recall@1_std": [0.01, np.nan, 0.02, 0.03],
        }
    )
    figures.sweep_figure(frame, "x", "recall@1", tmp_path / "s.png")
    loss = build_loss("pfml", num_classes=2, embedding_size=2, proxies_per_class=2)
    figures.toy_field_figure(landscapes.toy_fields(loss, *landscapes.toy_configuration(0), grid=31), tmp_path / "t.png")
    for name in ("s.png", "t.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG
