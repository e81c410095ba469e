"""SoftTriple's centre regulariser τ·R(w) (hparam `tau`): value and gradients against a float64
reference written from the SoftTriple paper (Qian et al. 2019, eq. 10-11), against PML's own
SparseCentersRegularizer, and unchanged behaviour at τ = 0."""

from __future__ import annotations

import math

import pytest
import torch
from pytorch_metric_learning import losses, regularizers

from dmlrepro.losses import build_loss
from dmlrepro.losses.baselines import BlockSparseCentersRegularizer

C, K, DIM = 5, 3, 8


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(20, DIM, generator=g), torch.arange(C).repeat(4)


def reference_r(fc: torch.Tensor, num_classes: int, k: int, eps: float = 0.0) -> torch.Tensor:
    """R(w) = Σ_c Σ_{t<s} sqrt(2 + ε − 2 ŵ_t^c·ŵ_s^c) / (C·K·(K−1)), float64, loops over classes and pairs.
    `fc` is PML's (D, C·K) layout: column c·K + t is centre t of class c."""
    w = fc.double().t()
    w = w / w.norm(dim=1, keepdim=True)
    total = w.new_zeros(())
    for c in range(num_classes):
        for t in range(k):
            for s in range(t + 1, k):
                total = total + torch.sqrt(2.0 + eps - 2.0 * (w[c * k + t] @ w[c * k + s]))
    return total / (num_classes * k * (k - 1))


def plain_soft_triple(fc: torch.Tensor, k: int) -> losses.SoftTripleLoss:
    loss = losses.SoftTripleLoss(C, DIM, centers_per_class=k, la=20, gamma=0.1, margin=0.01)
    with torch.no_grad():
        loss.fc.copy_(fc)
    return loss


@pytest.mark.parametrize("tau", [0.2, 0.0669])
def test_loss_is_pml_soft_triple_plus_tau_r(tau):
    z, y = batch()
    torch.manual_seed(3)
    ours = build_loss("soft_triple", C, DIM, centers_per_class=K, tau=tau)
    assert isinstance(ours.weight_regularizer, BlockSparseCentersRegularizer) and ours.weight_reg_weight == tau
    theirs = plain_soft_triple(ours.fc.detach(), K)
    assert theirs.weight_regularizer is None

    za, zb = z.clone().requires_grad_(), z.clone().requires_grad_()
    value = ours(za, y)
    base = theirs(zb, y)
    fc64 = ours.fc.detach().double().requires_grad_()
    r = reference_r(fc64, C, K)
    assert r.item() > 0
    torch.testing.assert_close(value.double(), base.double() + tau * r, rtol=1e-5, atol=1e-6)

    value.backward()
    base.backward()
    (tau * r).backward()
    torch.testing.assert_close(za.grad, zb.grad)  # R(w) does not depend on the embeddings
    torch.testing.assert_close(ours.fc.grad.double(), theirs.fc.grad.double() + fc64.grad, rtol=1e-4, atol=1e-6)


def test_reference_epsilon_is_negligible():
    """PML's ε (finfo.tiny) vs the SoftTriple code's 1e-5: a difference far below the tolerance used above."""
    torch.manual_seed(0)
    fc = torch.randn(DIM, C * K)
    assert abs(reference_r(fc, C, K) - reference_r(fc, C, K, eps=1e-5)).item() < 1e-5


@pytest.mark.parametrize("k", [2, 4])
def test_block_regulariser_equals_pml_sparse_centers(k):
    """Same value and gradient as PML's dense SparseCentersRegularizer."""
    torch.manual_seed(1)
    w = torch.randn(C * k, DIM)
    wa, wb = w.clone().requires_grad_(), w.clone().requires_grad_()
    ours = BlockSparseCentersRegularizer(C, k)(wa)
    theirs = regularizers.SparseCentersRegularizer(C, k)(wb)
    torch.testing.assert_close(ours, theirs)
    ours.backward()
    theirs.backward()
    torch.testing.assert_close(wa.grad, wb.grad)


def test_coincident_centres_stay_finite():
    """Two centres of a class in the same direction: sqrt(2 − 2ŵ·ŵ) has an unbounded slope there, so the
    value depends on the last bit of ŵ·ŵ (block vs dense matmul rounding); both stay close and finite."""
    torch.manual_seed(1)
    w = torch.randn(C * K, DIM)
    w[1] = w[0] * 2.0
    wa = w.clone().requires_grad_()
    ours = BlockSparseCentersRegularizer(C, K)(wa)
    theirs = regularizers.SparseCentersRegularizer(C, K)(w)
    assert abs(ours - theirs).item() < 1e-3
    ours.backward()
    assert torch.isfinite(wa.grad).all()


def test_block_regulariser_stats_match_pml():
    torch.manual_seed(2)
    w = torch.randn(C * K, DIM)
    ours, theirs = (
        BlockSparseCentersRegularizer(C, K, collect_stats=True),
        regularizers.SparseCentersRegularizer(C, K, collect_stats=True),
    )
    ours(w), theirs(w)
    assert math.isclose(ours.same_class_center_sim, theirs.same_class_center_sim, rel_tol=1e-5, abs_tol=1e-6)
    assert math.isclose(ours.diff_class_center_sim, theirs.diff_class_center_sim, rel_tol=1e-4, abs_tol=1e-6)


def test_tau_zero_and_single_centre_are_plain_pml():
    z, y = batch(1)
    for kwargs in (
        {"centers_per_class": K},
        {"centers_per_class": K, "tau": 0.0},
        {"centers_per_class": 1, "tau": 0.2},
    ):  # K = 1: R(w) ≡ 0, nothing attached
        torch.manual_seed(4)
        ours = build_loss("soft_triple", C, DIM, **kwargs)
        assert ours.weight_regularizer is None
        theirs = plain_soft_triple(ours.fc.detach(), kwargs["centers_per_class"])
        za, zb = z.clone().requires_grad_(), z.clone().requires_grad_()
        a, b = ours(za, y), theirs(zb, y)
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        a.backward()
        b.backward()
        torch.testing.assert_close(za.grad, zb.grad, rtol=0, atol=0)
        torch.testing.assert_close(ours.fc.grad, theirs.fc.grad, rtol=0, atol=0)


def test_tau_adds_no_state():
    """Checkpoints keep their keys: the regulariser holds no parameters or buffers."""
    torch.manual_seed(5)
    a = build_loss("soft_triple", C, DIM, centers_per_class=K)
    torch.manual_seed(5)
    b = build_loss("soft_triple", C, DIM, centers_per_class=K, tau=0.2)
    assert a.state_dict().keys() == b.state_dict().keys()
    assert [n for n, _ in a.named_parameters()] == [n for n, _ in b.named_parameters()]


@pytest.mark.parametrize("tau", [-0.1, "0.2", True])
def test_bad_tau(tau):
    with pytest.raises(ValueError, match="tau"):
        build_loss("soft_triple", C, DIM, centers_per_class=K, tau=tau)
