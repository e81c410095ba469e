"""𝒩(v) = v / max(1, ‖v‖) (paper §4.4) against a per-vector float64 reference."""

import pytest
import torch

import asap_reference as ref
from dmlrepro.asap import lipschitz_normalize, normalize


def test_lipschitz_normalize_matches_reference():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(50, 7, generator=g, dtype=torch.float64) * torch.linspace(0.05, 1.5, 50, dtype=torch.float64)[:, None]
    out = lipschitz_normalize(v)
    for i in range(50):
        torch.testing.assert_close(out[i], ref.lip(v[i]), rtol=1e-14, atol=0)
    norms = v.norm(dim=1)
    assert (norms < 1).any() and (norms > 1).any()
    assert torch.equal(out[norms <= 1], v[norms <= 1])                    # short vectors untouched
    torch.testing.assert_close(out[norms > 1].norm(dim=1), torch.ones(int((norms > 1).sum()), dtype=torch.float64))


def test_continuity_and_lipschitz_bound():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(500, 4, generator=g, dtype=torch.float64)
    b = a + 1e-3 * torch.randn(500, 4, generator=g, dtype=torch.float64)
    ratio = (lipschitz_normalize(a) - lipschitz_normalize(b)).norm(dim=1) / (a - b).norm(dim=1)
    assert float(ratio.max()) <= 2.0                                      # 2-Lipschitz (App. B.1)
    tiny = torch.tensor([[1e-9, 0.0]], dtype=torch.float64)
    assert torch.equal(lipschitz_normalize(tiny), tiny)                   # no blow-up at the origin


def test_modes():
    v = torch.tensor([[0.3, 0.4], [3.0, 4.0]], dtype=torch.float64)
    torch.testing.assert_close(normalize(v, "l2"), torch.tensor([[0.6, 0.8], [0.6, 0.8]], dtype=torch.float64))
    assert torch.equal(normalize(v, "none"), v)
    with pytest.raises(ValueError):
        normalize(v, "hard")
