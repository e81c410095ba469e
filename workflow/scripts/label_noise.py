"""Plumbing for rule label_noise: wildcards -> dmlrepro.data.write_noisy_labels (PFML Table 2)."""

from dmlrepro.data import write_noisy_labels
from dmlrepro.steplog import log_to

w = snakemake.wildcards
with log_to(snakemake.log[0]):
    write_noisy_labels(
        snakemake.input.manifest, snakemake.output.labels, seed=int(w.seed), rate=float(w.rate), mode=w.mode
    )
