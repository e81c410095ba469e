"""XBM (cross-batch memory) baseline, `dmlrepro.losses.xbm.XBMLoss`: C2 with memory against an
independent float64 double loop (values, autograd gradients, finite differences), pytorch-metric-learning's
`CrossBatchMemory` / `ContrastiveLoss` as library oracles, and the memory mechanics (ring wrap-around,
start_step, eval mode, state_dict resume, detached memory, size checks, registry)."""

import collections
import copy
import io
import math

import pytest
import torch

from dmlrepro.losses import LOSS_NAMES, build_loss
from dmlrepro.losses.asap import PairLoss
from dmlrepro.losses.xbm import XBMLoss

pytestmark = pytest.mark.usefixtures("float64_default")  # tests/conftest.py


D = 3
LABELS = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])  # batch of 8: 4 classes × 2
MARGINS = [(0.0, 0.3841), (0.2858, 0.5130)]  # (m⁺, m⁻): CUB and InShop/SOP of ASAP App. A.2


def _batches(seed, n, m=8, scale=0.7, unit=False):
    """n batches whose classes cluster a little (hard negatives exist) and whose norms straddle 1."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, D, generator=g) * scale
    out = []
    for _ in range(n):
        labels = LABELS[:m]
        z = centres[labels] + torch.randn(m, D, generator=g) * scale * 0.8
        if unit:
            z = z / z.norm(dim=1, keepdim=True)
        out.append((z, labels))
    return out


# -- independent float64 reference: python lists, double loops --------------------------------------


def _lip(row):
    """𝒩(v) = v / max(1, ‖v‖), one row."""
    norm = torch.sqrt(sum(x * x for x in row))
    return row / torch.clamp(norm, min=1.0)


def _nonzero_mean(terms):
    nz = [t for t in terms if float(t.detach()) > 0]
    return sum(nz) / len(nz) if nz else torch.zeros(())


def _c2_brute(anchors, a_lab, refs, r_lab, self_pairs, mp, mn):
    """C2 with non-zero averaging: mean of non-zero [d − m⁺]_+ over positive pairs + mean of non-zero
    [m⁻ − d]_+ over negative pairs; (i, j) in `self_pairs` is skipped."""
    pos, neg = [], []
    for i in range(len(anchors)):
        for j in range(len(refs)):
            if (i, j) in self_pairs:
                continue
            d = torch.sqrt(sum((anchors[i][k] - refs[j][k]) ** 2 for k in range(D)))
            if int(a_lab[i]) == int(r_lab[j]):
                pos.append(torch.relu(d - mp))
            else:
                neg.append(torch.relu(mn - d))
    return _nonzero_mean(pos) + _nonzero_mean(neg)


class BruteXBM:
    """C2-XBM written from the description: a deque of the last M (detached) normalised rows;
    batch anchors; enqueue after the loss; memory used from call `start` on."""

    def __init__(self, memory_size, start, mp, mn, combine):
        self.mem = collections.deque(maxlen=memory_size)
        self.start, self.mp, self.mn, self.combine, self.calls = start, mp, mn, combine, 0

    def __call__(self, z, labels, detach_batch_refs=False):
        e = [_lip(z[i]) for i in range(len(z))]
        lab = [int(x) for x in labels]
        diag = {(i, i) for i in range(len(e))}
        use_memory = self.calls >= self.start and len(self.mem) > 0
        m_e = [r for r, _ in self.mem] if use_memory else []
        m_lab = [y for _, y in self.mem] if use_memory else []
        if self.combine == "sum" and use_memory:
            loss = _c2_brute(e, lab, e, lab, diag, self.mp, self.mn) + _c2_brute(
                e, lab, m_e, m_lab, set(), self.mp, self.mn
            )
        else:  # union, or the plain in-batch loss when the memory is not used
            b_refs = [r.detach() for r in e] if detach_batch_refs else e
            loss = _c2_brute(e, lab, b_refs + m_e, lab + m_lab, diag, self.mp, self.mn)
        for r, y in zip(e, lab):
            self.mem.append((r.detach(), y))
        self.calls += 1
        return loss


def _xbm(memory_size, start_step=0, combine="sum", mp=0.0, mn=0.3841, **kw):
    return build_loss(
        "xbm_c2",
        4,
        D,
        memory_size=memory_size,
        start_step=start_step,
        combine=combine,
        pos_margin=mp,
        neg_margin=mn,
        **kw,
    )


def _value_and_grad(loss_fn, z, labels, **kw):
    zr = z.clone().requires_grad_()
    value = loss_fn(zr, labels, **kw)
    (grad,) = torch.autograd.grad(value, zr)
    return value.detach(), grad


# -- against the brute force ------------------------------------------------------------------------


@pytest.mark.parametrize("combine", ["sum", "union"])
@pytest.mark.parametrize("mp,mn", MARGINS)
def test_c2_xbm_matches_brute_force_values_and_gradients(combine, mp, mn):
    """7 steps, memory 20 (not a multiple of the batch of 8: the ring wraps inside a batch)."""
    xbm, ref = _xbm(20, 2, combine, mp, mn), BruteXBM(20, 2, mp, mn, combine)
    memory_used = 0
    for step, (z, labels) in enumerate(_batches(0, 7)):
        v, g = _value_and_grad(xbm, z, labels)
        rv, rg = _value_and_grad(ref, z, labels)
        assert torch.allclose(v, rv, rtol=1e-12, atol=1e-12), (step, v, rv)
        assert torch.allclose(g, rg, rtol=1e-10, atol=1e-12), step
        memory_used += step >= 2
    assert memory_used == 5
    assert int(xbm.steps) == 7 and int(xbm.memory_filled) == 20 and int(xbm.memory_ptr) == 56 % 20


@pytest.mark.parametrize("combine", ["sum", "union"])
def test_c2_xbm_gradient_matches_finite_differences(combine):
    xbm = _xbm(20, 0, combine, 0.2858, 0.5130)
    for z, labels in _batches(1, 3):
        xbm(z, labels)
    xbm.eval()  # eval: the memory is used but not changed, so the function is fixed for gradcheck
    z, labels = _batches(2, 1)[0]
    plain = PairLoss("c2", pos_margin=0.2858, neg_margin=0.5130)
    assert not torch.allclose(xbm(z, labels), plain(z, labels))  # the memory term is really there
    assert torch.autograd.gradcheck(lambda x: xbm(x, labels), (z.clone().requires_grad_(),), eps=1e-6, atol=1e-7)


# -- pytorch-metric-learning oracles -----------------------------------------------------------------


def test_union_matches_pml_cross_batch_memory():
    """PML's CrossBatchMemory enqueues the batch *before* the loss and then removes the self-comparisons
    (`remove_self_comparisons` with `curr_batch_idx`), so with memory_size M + B its references are the
    current batch (as detached memory copies) plus the M most recent older embeddings: the same
    reference set as combine="union" with memory_size M (enqueue after, batch live). The values are
    therefore equal (inputs of norm 1: 𝒩 and PML's L2 normalisation are both the identity).

    The gradients differ, for two documented reasons, each checked exactly here:
    1. PML's references are all detached memory entries, so a batch–batch pair sends gradient only to
       its anchor; here it reaches both ends. PML's gradient equals the brute force with detached batch
       references, ours the brute force with live ones, and the two differ.
    2. PML's LpDistance L2-normalises, whose Jacobian at norm 1 is the projection I − zzᵀ, while 𝒩 at
       norm 1 is at its kink (identity on the ‖z‖ ≤ 1 side, projection above; which side a row falls
       on depends on rounding). So gradients are compared after projecting onto the tangent space
       (PML's radial part is 0, checked)."""
    from pytorch_metric_learning.losses import ContrastiveLoss, CrossBatchMemory

    mp, mn, M, B = 0.2858, 0.5130, 20, 8
    pml = CrossBatchMemory(ContrastiveLoss(pos_margin=mp, neg_margin=mn), embedding_size=D, memory_size=M + B)
    ours = _xbm(M, 0, "union", mp, mn)
    ref_live, ref_det = BruteXBM(M, 0, mp, mn, "union"), BruteXBM(M, 0, mp, mn, "union")
    for step, (z, labels) in enumerate(_batches(3, 6, unit=True)):

        def tangent(g):
            return g - (g * z).sum(1, keepdim=True) * z  # noqa: B023 (called in this iteration)

        v, g = _value_and_grad(ours, z, labels)
        pv, pg = _value_and_grad(pml, z, labels)
        assert torch.allclose(v, pv, rtol=1e-10, atol=1e-12), (step, v, pv)
        # at norm 1, 𝒩's kink: only the tangential part is well defined (full gradients: first test)
        assert torch.allclose(tangent(g), tangent(_value_and_grad(ref_live, z, labels)[1]), rtol=1e-9, atol=1e-12)
        det_g = _value_and_grad(ref_det, z, labels, detach_batch_refs=True)[1]
        assert torch.allclose(pg, tangent(pg), atol=1e-12)  # PML: no radial component
        assert torch.allclose(pg, tangent(det_g), rtol=1e-9, atol=1e-12), step
        assert not torch.allclose(tangent(g), pg, atol=1e-6), step  # reason 1 is a real difference


def test_sum_matches_pml_contrastive_with_pml_memory():
    """combine="sum" = ContrastiveLoss(batch) + ContrastiveLoss(batch, ref=memory), the memory taken
    from a PML CrossBatchMemory of the same size run in lockstep (its buffer before it enqueues the
    current batch is exactly our memory: an oracle for the ring buffer too). Values are equal, and so
    are the gradients up to their radial part (in both the batch references are live and the memory
    detached; PML's L2 normalisation has no radial gradient, 𝒩 at norm 1 is at its kink, see above)."""
    from pytorch_metric_learning.losses import ContrastiveLoss, CrossBatchMemory

    mp, mn, M = 0.0, 0.3841, 20
    contrastive = ContrastiveLoss(pos_margin=mp, neg_margin=mn)
    pml_memory = CrossBatchMemory(ContrastiveLoss(pos_margin=mp, neg_margin=mn), embedding_size=D, memory_size=M)
    ours = _xbm(M, 0, "sum", mp, mn)

    def expected(z, labels):
        n = M if pml_memory.has_been_filled else pml_memory.queue_idx
        mem, mem_lab = pml_memory.embedding_memory[:n].clone(), pml_memory.label_memory[:n].clone()
        loss = contrastive(z, labels)
        return loss + contrastive(z, labels, ref_emb=mem, ref_labels=mem_lab) if n else loss

    for step, (z, labels) in enumerate(_batches(4, 6, unit=True)):
        v, g = _value_and_grad(ours, z, labels)
        ev, eg = _value_and_grad(expected, z, labels)
        assert torch.allclose(v, ev, rtol=1e-10, atol=1e-12), (step, v, ev)
        tangent_g = g - (g * z).sum(1, keepdim=True) * z
        assert torch.allclose(tangent_g, eg, rtol=1e-9, atol=1e-12), step
        pml_memory(z, labels)  # advance the oracle's memory with the batch


# -- memory mechanics --------------------------------------------------------------------------------


def test_ring_buffer_wraps_around_fifo():
    """memory 10, batches of 4 then 3: slots wrap mid-batch and the oldest entries are overwritten."""
    xbm = _xbm(10, 0, normalize="none")
    rows = torch.arange(1, 100, dtype=torch.float64).view(-1, 1).repeat(1, D)  # row k = (k, k, k)
    sizes, seen, k = [4, 4, 4, 3], [], 0
    for b in sizes:
        z, labels = rows[k : k + b], torch.arange(k, k + b)
        xbm(z, labels)
        seen += list(range(k, k + b))
        k += b
    assert int(xbm.memory_ptr) == (4 + 4 + 4 + 3) % 10 and int(xbm.memory_filled) == 10
    # slot s holds the last write to s: slots 0, 1 ← batch 3; 2, 3, 4 ← batch 4; 5..9 older
    expected = {s: None for s in range(10)}
    for pos, item in enumerate(seen):
        expected[pos % 10] = item
    assert [int(x) for x in xbm.memory_labels] == [expected[s] for s in range(10)]
    assert torch.equal(xbm.memory_embeddings[:, 0], rows[[expected[s] for s in range(10)], 0])
    assert sorted(int(x) for x in xbm.memory_labels) == seen[-10:]  # FIFO: the 10 most recent


def test_partially_filled_memory_uses_only_stored_entries():
    xbm = _xbm(20, 0, normalize="none")
    z, labels = _batches(5, 1)[0]
    xbm(z, labels)
    mem, mem_lab = xbm.memory()
    assert len(mem) == 8 and torch.equal(mem_lab, labels) and torch.equal(mem, z)
    assert (xbm.memory_labels[8:] == -1).all()


def test_before_start_step_the_loss_is_the_plain_pair_loss():
    """start_step=3: calls 0, 1, 2 equal PairLoss exactly (values and gradients); call 3 uses the
    memory filled during those calls (reading: enqueue also during pre-training)."""
    mp, mn = 0.2858, 0.5130
    xbm, plain, ref = (
        _xbm(40, 3, "sum", mp, mn),
        PairLoss("c2", pos_margin=mp, neg_margin=mn),
        BruteXBM(40, 3, mp, mn, "sum"),
    )
    batches = _batches(6, 5)
    for step, (z, labels) in enumerate(batches):
        v, g = _value_and_grad(xbm, z, labels)
        pv, pg = _value_and_grad(plain, z, labels)
        rv, _ = _value_and_grad(ref, z, labels)
        assert torch.allclose(v, rv, rtol=1e-12, atol=1e-12)
        if step < 3:
            assert torch.equal(v, pv) and torch.equal(g, pg), step
        else:
            assert not torch.allclose(v, pv), step
    assert int(xbm.steps) == 5 and int(xbm.memory_filled) == 40


def test_eval_mode_neither_enqueues_nor_counts():
    xbm = _xbm(20, 1, "sum")
    batches = _batches(7, 4)
    for z, labels in batches[:2]:
        xbm(z, labels)
    before = {k: v.clone() for k, v in xbm.state_dict().items()}
    twin = copy.deepcopy(xbm)  # stays in training mode
    xbm.eval()
    z, labels = batches[2]
    v_eval = xbm(z, labels)
    after = xbm.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(v_eval, twin(z, labels))  # eval still uses the memory: same loss as training
    assert int(twin.steps) == 3 and int(twin.memory_filled) == 20  # the training twin did change
    xbm.train()
    xbm(z, labels)
    assert int(xbm.steps) == 3


def test_state_dict_round_trip_reproduces_the_next_loss():
    mp, mn = 0.2858, 0.5130
    batches = _batches(8, 6)
    a = _xbm(20, 2, "union", mp, mn)
    for z, labels in batches[:4]:
        a(z, labels)
    assert {"memory_embeddings", "memory_labels", "memory_ptr", "memory_filled", "steps"} <= set(a.state_dict())
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = _xbm(20, 2, "union", mp, mn)
    b.load_state_dict(torch.load(buf))
    fresh = _xbm(20, 2, "union", mp, mn)
    for step, (z, labels) in enumerate(batches[4:]):
        va, ga = _value_and_grad(a, z, labels)
        vb, gb = _value_and_grad(b, z, labels)
        assert torch.equal(va, vb) and torch.equal(ga, gb)
        if step == 0:  # without the restored memory and step counter the next loss is another one
            assert not torch.allclose(va, fresh(z, labels))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_memory_is_detached():
    """Backward through step 2 must not reach step 1's graph (freed after its backward)."""
    xbm = _xbm(20, 0, "sum")
    for z, labels in _batches(9, 3):
        zr = z.clone().requires_grad_()
        xbm(zr, labels).backward()
        assert zr.grad is not None and torch.isfinite(zr.grad).all()
    assert not xbm.memory_embeddings.requires_grad and xbm.memory_embeddings.grad_fn is None


def test_non_finite_batch_is_not_enqueued():
    xbm = _xbm(20, 0, "sum")
    z, labels = _batches(10, 1)[0]
    xbm(z, labels)
    before = xbm.memory_embeddings.clone()
    bad = z.clone()
    bad[0, 0] = math.nan
    xbm(bad, labels)
    assert torch.equal(xbm.memory_embeddings, before) and int(xbm.memory_filled) == 8 and int(xbm.steps) == 2


def test_memory_smaller_than_batch_is_rejected():
    xbm = _xbm(6, 0)
    z, labels = _batches(11, 1)[0]
    with pytest.raises(ValueError, match="memory_size 6 is smaller than the batch of 8"):
        xbm(z, labels)
    assert int(xbm.steps) == 0
    xbm(z[:6], labels[:6])  # a batch of exactly memory_size is fine
    for bad in (0, -5, 2.5):
        with pytest.raises(ValueError, match="memory_size"):
            _xbm(bad)
    with pytest.raises(ValueError, match="combine"):
        _xbm(20, combine="concat")
    with pytest.raises(ValueError, match="start_step"):
        _xbm(20, start_step=-1)


# -- registry and the other base losses ------------------------------------------------------------


def test_registry_builds_every_xbm_loss():
    loss = build_loss("xbm_c2", 5, 16, memory_size=96, start_step=0, pos_margin=0.0, neg_margin=0.3841)
    assert isinstance(loss, XBMLoss) and loss.base_name == "c2"
    assert loss.memory_embeddings.shape == (96, 16) and loss.start_step == 0
    assert (loss.base.pos_margin, loss.base.neg_margin) == (0.0, 0.3841)
    assert {f"xbm_{b}" for b in ("c1", "c2", "ms", "triplet")} <= set(LOSS_NAMES)
    default = build_loss("xbm_c1", 5, 16)
    assert (default.memory_size, default.start_step, default.combine) == (800, 1000, "sum")
    with pytest.raises(TypeError, match="xbm_c2"):
        build_loss("xbm_c2", 5, 16, pos_margn=0.1)


def test_c1_sum_equals_union_and_other_bases_run():
    """C1's "anchor" reduction (sum / number of anchors) makes ℓ(b,b) + ℓ(b,mem) = ℓ(b, b ∪ mem); MS
    and Triplet do not have that property (log-sum-exp / non-zero averaging), so there they differ."""
    batches = _batches(12, 4)
    for base in ("c1", "ms", "triplet"):
        s = build_loss(f"xbm_{base}", 4, D, memory_size=20, start_step=0)
        u = build_loss(f"xbm_{base}", 4, D, memory_size=20, start_step=0, combine="union")
        for step, (z, labels) in enumerate(batches):
            vs, gs = _value_and_grad(s, z, labels)
            vu, gu = _value_and_grad(u, z, labels)
            assert torch.isfinite(gs).all() and torch.isfinite(gu).all()
            if base == "c1" or step == 0:  # step 0: empty memory, both are the plain pair loss
                assert torch.allclose(vs, vu, rtol=1e-12) and torch.allclose(gs, gu, rtol=1e-10, atol=1e-12)
            else:
                assert not torch.allclose(vs, vu), (base, step)
