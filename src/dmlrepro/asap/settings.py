"""ASAP's per-dataset settings (paper §5.1, A.2), for config defaults and tests.

ASAP-R15: ASAP-S (P = 1) uses the same pool size b as ASAP-L. ASAP-R16: Loss-Proxy uses ASAP-L's P.
"""

from __future__ import annotations

DATASETS = ("cub", "cars", "inshop", "sop")

# eval interval E, P (L), b, λ; loss hyperparameters per base loss (paper A.2)
SETTINGS: dict[str, dict] = {
    "cub": {
        "eval_every": 25,
        "proxies_per_class": 8,
        "b": 12,
        "lam": 2e-4,
        "c1": {"margin": 0.5},
        "c2": {"pos_margin": 0.0, "neg_margin": 0.3841},
        "ms": {"alpha": 2.0, "beta": 40.0, "base": 0.5},
        "triplet": {"margin": 0.0961},
    },
    "cars": {
        "eval_every": 25,
        "proxies_per_class": 8,
        "b": 12,
        "lam": 2e-4,
        "c1": {"margin": 0.5},
        "c2": {"pos_margin": 0.2652, "neg_margin": 0.5409},
        "ms": {"alpha": 14.35, "beta": 75.83, "base": 0.66},
        "triplet": {"margin": 0.1190},
    },
    "inshop": {
        "eval_every": 250,
        "proxies_per_class": 4,
        "b": 7,
        "lam": 2e-4,
        "c1": {"margin": 0.5},
        "c2": {"pos_margin": 0.2858, "neg_margin": 0.5130},
        "ms": {"alpha": 8.49, "beta": 57.38, "base": 0.41},
        "triplet": {"margin": 0.0451},
    },
    "sop": {
        "eval_every": 250,
        "proxies_per_class": 4,
        "b": 7,
        "lam": 2e-4,
        "c1": {"margin": 0.5},
        "c2": {"pos_margin": 0.2858, "neg_margin": 0.5130},
        "ms": {"alpha": 2.0, "beta": 40.0, "base": 0.5},
        "triplet": {"margin": 0.0451},
    },
}

VARIANTS = ("L", "S", "proxy", "plain")


def asap_settings(dataset: str, loss: str, variant: str = "L") -> dict:
    """Settings of `loss` ("c1" | "c2" | "ms" | "triplet") in `variant` on `dataset`.

    ``"L"``: ASAP-L; ``"S"``: ASAP-S (P = 1, same b, ASAP-R15); ``"proxy"``: Loss-Proxy (ASAP-L's P, λ = 0,
    no alternation, ASAP-R16); ``"plain"``: the batch-pair baseline (no proxies). Returns a dict with
    ``loss_name``, ``loss_hparams`` (for :func:`dmlrepro.losses.build_loss`) and the schedule / k-Center values.
    """
    if dataset not in SETTINGS:
        raise ValueError(f"asap_settings: unknown dataset {dataset!r}; known: {DATASETS}")
    if variant not in VARIANTS:
        raise ValueError(f"asap_settings: variant must be one of {VARIANTS}, got {variant!r}")
    row = SETTINGS[dataset]
    if loss not in row:
        raise ValueError(f"asap_settings: unknown loss {loss!r}; known: c1, c2, ms, triplet")
    hp = dict(row[loss])
    out = {"eval_every": row["eval_every"], "projection_patience": 3, "global_patience": 60, "min_delta": 1e-5}
    if variant == "plain":
        return {**out, "loss_name": f"pair_{loss}", "loss_hparams": hp}
    P = 1 if variant == "S" else row["proxies_per_class"]
    return {
        **out,
        "loss_name": f"asap_{loss}",
        "loss_hparams": {**hp, "proxies_per_class": P},
        "b": row["b"],
        "lam": 0.0 if variant == "proxy" else row["lam"],
        "alternate": variant != "proxy",
    }
