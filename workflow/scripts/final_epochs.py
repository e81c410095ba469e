"""Plumbing for checkpoint final_epochs: the final stage's fold-run train logs -> epochs.json."""

from dmlrepro.atomic import write_json_atomic
from dmlrepro.steplog import log_to
from dmlrepro.tuning import observed_epochs

with log_to(snakemake.log[0]):
    write_json_atomic(snakemake.output.epochs, observed_epochs(snakemake.input.train_logs, snakemake.params.multiple))
