# dmlrepro: regenerate the papers' tables and figures.
#   snakemake --cores all                 embedded default (generated data, CPU), config/config.yaml
#   snakemake --profile slurm all         the PFML paper's settings (config/paper.yaml) on a SLURM GPU cluster
from snakemake.utils import min_version

import os

from dmlrepro import jobserver
from dmlrepro.preflight.workflow import RETRIES_ENV, put_on_pythonpath

min_version("8.25")


# jobs in the conda envs of envs/ (`--sdm conda`) import dmlrepro from this checkout's src/ (the envs
# list its dependencies, not the package: Snakemake deploys copies of the env files, docs/preflight.md#conda)
put_on_pythonpath(f"{workflow.basedir}/src")


# the embedded default, unless `--configfile FILE` names another config: that one then stands alone
# (Snakemake would otherwise deep-merge it over this one, pulling the default's experiments in)
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/pretrain.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/preflight.smk"


# Before the first job: the profile's retries, for each job's time budget (known once execution starts;
# the jobs inherit the environment: workflow/scripts/train.py); with local execution in this
# environment (no --sdm conda/apptainer: the server is this interpreter), the job server that the
# Python jobs fork from (dmlrepro.jobserver, config key job_server; it exits with Snakemake).
JOB_SERVER = []


onstart:
    os.environ.setdefault(RETRIES_ENV, str(workflow.execution_settings.retries))
    own_env = not workflow.deployment_settings.deployment_method
    if workflow.local_exec and own_env and config["job_server"]:
        JOB_SERVER.append(jobserver.start())


onsuccess:
    end_of_workflow(JOB_SERVER)


onerror:
    end_of_workflow(JOB_SERVER)


localrules:
    prepare_dataset,
    label_noise,
    aggregate,
    final_epochs,
    report_section,
    report,


rule all:
    default_target: True
    input:
        rules.report.output.html,
