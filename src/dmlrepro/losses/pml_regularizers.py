"""A PML regularizer for SoftTriple's τ·R(w) (`soft_triple` with `tau` > 0, baselines.py).

Its own module because it subclasses a PML class: importing it imports pytorch-metric-learning,
which baselines.py defers until a baseline is built.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pytorch_metric_learning import regularizers


class BlockSparseCentersRegularizer(regularizers.SparseCentersRegularizer):
    """PML's SparseCentersRegularizer, SoftTriple's R(w) (Qian et al. 2019, eq. 10), computed class by class.

    R(w) = Σ_c Σ_{t<s} sqrt(2 + ε − 2·ŵ_t^c·ŵ_s^c) / (C·K·(K−1)) over the ℓ2-normalised centres of each
    class. Same value and gradient as PML's class (same clamp of 2·ŵ·ŵ at 2, same ε = finfo.tiny, same
    divisor), but PML builds the (C·K)² similarity matrix and two (C·K)² boolean masks (on the CPU,
    copied to the device at every step): 8 GiB + 2 × 2 GiB for SOP with K = 4. This needs C·K².
    ε: the SoftTriple code uses 1e-5, PML the dtype's smallest normal number; the paper has none.
    """

    def set_class_masks(self, num_classes, centers_per_class):
        self.num_classes, self.centers_per_class = int(num_classes), int(centers_per_class)
        self.pair_mask = torch.triu(torch.ones(centers_per_class, centers_per_class, dtype=torch.bool), diagonal=1)

    def compute_loss(self, weights):
        c, k = self.num_classes, self.centers_per_class
        if weights.shape[0] != c * k:
            raise ValueError(f"SparseCentersRegularizer: {weights.shape[0]} centres, expected {c} classes × {k}")
        unit = F.normalize(weights, p=2, dim=1)  # what PML's CosineSimilarity does
        blocks = unit.view(c, k, -1)
        sims = blocks @ blocks.transpose(1, 2)  # (C, K, K): centres of one class against each other
        pairs = torch.clamp(2.0 * sims[:, self.pair_mask.to(sims.device)], max=2)  # (C, K(K−1)/2), t < s
        reg = torch.sqrt(2.0 + torch.finfo(weights.dtype).tiny - pairs).reshape(-1)
        if self.collect_stats:
            with torch.no_grad():
                self.same_class_center_sim = sims[:, self.pair_mask.to(sims.device)].mean().item()
                n, within = c * k, sims.sum()
                total = unit.sum(0).square().sum()  # Σ_ij ŵ_i·ŵ_j
                self.diff_class_center_sim = ((total - within) / max(n * n - c * k * k, 1)).item()
        return {
            "loss": {
                "losses": reg,
                "indices": torch.arange(reg.numel(), device=reg.device),
                "reduction_type": "element",
                "divisor": c * k * (k - 1),
            }
        }
