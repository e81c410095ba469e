"""The losses' shared guard (dmlrepro.losses.base): float32 at least under autocast, and named input checks."""

import pytest
import torch

from dmlrepro.losses import ASAPLoss, PairLoss, PFMLLoss, RSWLoss, XBMLoss, build_loss
from dmlrepro.losses.base import full_precision


@pytest.mark.parametrize(
    "dtype,expected",
    [
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_full_precision_turns_autocast_off(dtype, expected):
    x = torch.ones(2, 3, dtype=dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with full_precision(x) as chosen:
            assert chosen == expected and not torch.is_autocast_cpu_enabled()
            assert (x.to(chosen) @ x.to(chosen).T).dtype == expected
        assert torch.is_autocast_cpu_enabled()


@pytest.mark.parametrize(
    "loss",
    [
        PFMLLoss(3, 4, 2),
        RSWLoss(3, 4, alpha=1.0, k1=0.5, k2=1.5),
        ASAPLoss("c2", 3, 4, 2),
        XBMLoss("c1", 4),
        build_loss("pair_ms", 3, 4),
    ],
)
def test_wrong_embedding_shape_is_named(loss):
    with pytest.raises(ValueError, match=rf"{type(loss).__name__}: embeddings must be \(B, 4\), got \(5, 3\)"):
        loss(torch.randn(5, 3), torch.zeros(5, dtype=torch.long))


def test_pair_loss_without_a_width_takes_any_matrix():
    loss = PairLoss("c2")
    assert loss(torch.randn(5, 3), torch.zeros(5, dtype=torch.long)).ndim == 0
    with pytest.raises(ValueError, match=r"PairLoss: embeddings must be \(B, D\), got \(5,\)"):
        loss(torch.randn(5), torch.zeros(5, dtype=torch.long))


def test_rsw_logits_are_float32_under_autocast():
    loss = RSWLoss(3, 4, alpha=1.0, k1=0.5, k2=1.5)
    z, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    reference = loss(z.bfloat16().float(), y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss(z.bfloat16(), y)
    assert value.dtype == torch.float32 and float(value) == pytest.approx(float(reference), rel=1e-6)


@pytest.mark.parametrize("name", ["asap_c2", "asap_ms", "pair_triplet", "xbm_c1"])
def test_asap_losses_are_float32_under_autocast(name):
    """ASAP's pair losses (as the engine calls every loss) compute in float32 whatever the network's autocast."""
    torch.manual_seed(0)
    loss = build_loss(name, 3, 4, **({"proxies_per_class": 2} if name.startswith("asap") else {}))
    z, y = torch.randn(6, 4), torch.tensor([0, 0, 1, 1, 2, 2])
    reference = loss(z.bfloat16().float(), y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss(z.bfloat16(), y)
    assert value.dtype == torch.float32 and float(value) == float(reference)
