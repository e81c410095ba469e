"""Plumbing for rule pretrain_standin: the recipe -> dmlrepro.models.standin.pretrain into the weights file."""

import torch

from dmlrepro.models.standin import pretrain
from dmlrepro.steplog import log_to

with log_to(snakemake.log[0]):
    torch.set_num_threads(snakemake.threads)
    pretrain(snakemake.params.recipe, snakemake.output.weights)
