"""Plumbing for rule prepare_dataset: snakemake.wildcards/params -> dmlrepro.data.prepare."""


from dmlrepro.steplog import log_to
from dmlrepro.data import prepare

with log_to(snakemake.log[0]):
    prepare(snakemake.wildcards.dataset, snakemake.params.root, progress=False, **snakemake.params.options)
