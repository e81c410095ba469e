# Validates the config (the schema fills its defaults), asks the run table and the results layout
# (dmlrepro.run_table) and wires them into input functions; no logic here.
import json
from pathlib import Path

from snakemake.utils import validate

from dmlrepro.nested import canonical, deep_merge
from dmlrepro.job_requests import (
    check_train_requests,
    slurm_signal,
    search_run_count,
    train_priority,
    train_request,
)
from dmlrepro.data.registry import expected_train_images
from dmlrepro.preflight.projection import planned_images
from dmlrepro.run_table import ResultsLayout, RunTable, reported_tables, run_record
from dmlrepro.selection import select
from dmlrepro.digit_trunk_recipe import DIGIT_TRUNK
from dmlrepro.run_failures import failed_experiments
from dmlrepro.tuning.bayes import BEST_JSON, TRIALS_CSV
from dmlrepro import jobserver
from dmlrepro.report.claims import check_claims, load_catalogue, read_catalogue
from dmlrepro.report.sections import check_report
from dmlrepro.data.label_noise import label_noise_file, prepared_noise_file
from dmlrepro.scheduler_timers import cancel_pending_timers
from dmlrepro.train.state import RunDir

validate(config, "../schemas/config.schema.yaml")
# a bad report fails before any job
for name, experiment in config["experiments"].items():
    check_report(name, experiment)
# the report's Claims section (config `claims`): the catalogue's cells at this config's scale
CLAIMS = None
if "claims" in config:
    CLAIMS = f"{CHECKOUT}/{config['claims']['catalogue']}"
    validate(read_catalogue(CLAIMS), "../schemas/claims.schema.yaml")
    check_claims(load_catalogue(CLAIMS), config, config["claims"]["scale"])

DATA = config["data_root"]
LAYOUT = ResultsLayout(config["results"], DATA)  # where every output lives
# the experiments built: the active ones (config opt_in) on the datasets selected (config only_datasets)
# that can be prepared here; the others are listed in the report as not run (dmlrepro.selection)
SELECTION = select(config)
# runs, searches (experiments with `search:` train inside their search: rule search) and the final
# stages' runs, which join once their searches are known
TABLE = RunTable(SELECTION.config, SELECTION.experiments)
# config skip_failed_runs: the experiments whose runs failed are left out, and listed (docs/workflow.md#when-runs-fail)
if config["skip_failed_runs"]:
    SELECTION = SELECTION.without(failed_experiments(TABLE, LAYOUT))
    TABLE = RunTable(SELECTION.config, SELECTION.experiments)
EXPERIMENTS = TABLE.experiments
check_train_requests(config)


def wildcard_run(wildcards):
    """The run of a train job (wildcard `run`)."""
    return TABLE.runs[wildcards.run]


def wildcard_search(wildcards):
    """The search of a search job (wildcard `search`)."""
    return TABLE.searches[wildcards.search]


def search_spec(wildcards):
    """The `search:` block a search job runs."""
    return TABLE.search_spec(wildcards.search)


def final_stage(experiment, wait=True):
    """The final runs of a search experiment with `final:` (none for the others), added to the
    table so that the train rule finds them.
    wait: through the checkpoints search and final_epochs (input functions: Snakemake schedules
    those first and asks again); else from what is on disk (at parse time, e.g. in a cluster
    job's own Snakemake, where the searches it depends on have finished)."""
    return TABLE.final_runs(
        experiment,
        best=lambda search: checkpoint_json(
            "search", "best", wait, search=search.run_id
        ),
        epochs=lambda search: checkpoint_json(
            "final_epochs", "epochs", wait, experiment=experiment, search=search.run_id
        ),
    )


def checkpoint_json(rule, output, wait, **wildcards):
    """The JSON content of a checkpoint job's output (wait: through Snakemake; else None while the
    file does not exist)."""
    if wait:
        path = getattr(getattr(checkpoints, rule).get(**wildcards).output, output)
    else:
        path = getattr(getattr(rules, rule).output, output).format(**wildcards)
        if not Path(path).is_file():
            return None
    return json.loads(Path(path).read_text())


def final_fold_logs(wildcards):
    """The train logs of a final stage's fold runs (rule final_epochs reads how long they trained)."""
    best = checkpoint_json("search", "best", True, search=wildcards.search)
    runs = TABLE.fold_runs(wildcards.experiment, wildcards.search, best)
    return [LAYOUT.run_file(run_id, RunDir.TRAIN_LOG) for run_id in runs]


def table_runs(experiment):
    """The runs of an experiment's table: its runs, or its final stage's (through the checkpoints)."""
    final_stage(experiment)
    return TABLE.experiment_runs(experiment)


def trained_run(wildcards):
    """The run a train job trains, or the base run of a search job."""
    return TABLE.trained(
        wildcards.search if hasattr(wildcards, "search") else wildcards.run
    )


def run_inputs(wildcards):
    """The prepared dataset, and the seeded noisy labels of the whole training split when the
    run asks for label noise (a run with a validation split corrupts its own training rows).
    """
    config = trained_run(wildcards).config
    dataset = {**config["dataset"], "root": DATA}
    inputs = {"manifest": LAYOUT.manifest(dataset["name"])}
    noise = prepared_noise_file(dataset, config.get("validation"))
    if noise is not None:
        inputs["label_noise"] = str(noise)
    return inputs


def dataset_params(wildcards):
    return TABLE.dataset_params.get(wildcards.dataset, {})


def run_files(experiment, name):
    """The file `name` in the folder of every run of `experiment`."""
    return [LAYOUT.run_file(run.run_id, name) for run in table_runs(experiment)]


def experiment_run_files(name):
    """Input function: the file `name` in the folder of every run of the experiment."""
    return lambda wildcards: run_files(wildcards.experiment, name)


experiment_metrics = experiment_run_files(RunDir.METRICS)
experiment_logs = experiment_run_files(RunDir.TRAIN_LOG)


def experiments_run_metrics(experiments):
    """Every run's metrics.json of `experiments`, each once: inputs of the targets themselves, since
    Snakemake rebuilds no missing file that only feeds an up-to-date one; so a deleted run folder is
    retrained and the tables showing it rebuilt (docs/workflow.md#runs-are-content-addressed).
    """
    return sorted(
        {path for name in experiments for path in run_files(name, RunDir.METRICS)}
    )


def experiment_search_trials(wildcards):
    """The trials.csv of every search of the experiment (none for an experiment without `search:`)."""
    return [
        LAYOUT.search_file(run.run_id, TRIALS_CSV)
        for run in TABLE.experiment_searches(wildcards.experiment)
    ]


def section_searches(wildcards):
    """The experiment's searches for the report: ids, method, dataset, seed, folder."""
    return [
        run_record(run, dir=LAYOUT.search_dir(run.run_id))
        for run in TABLE.experiment_searches(wildcards.experiment)
    ]


def experiment_manifests(wildcards):
    names = {
        run.config["dataset"]["name"]
        for run in table_runs(wildcards.experiment)
        + TABLE.experiment_searches(wildcards.experiment)
    }
    return [LAYOUT.manifest(name) for name in sorted(names)]


def section_runs(wildcards):
    """The experiment's runs for the report: ids, resolved configs (data under DATA), folders."""
    return [
        run_record(
            run,
            config=canonical(deep_merge(run.config, {"dataset": {"root": DATA}})),
            dir=LAYOUT.run_dir(run.run_id),
            sweep=canonical(run.experiments[wildcards.experiment]),
        )
        for run in table_runs(wildcards.experiment)
    ]


def report_flag(key):
    """Input function: the experiment's boolean `report.<key>` (false when unset)."""

    def flag(wildcards):
        return bool(TABLE.experiment(wildcards.experiment).get("report", {}).get(key))

    return flag


# the runs are MLRC fold runs (report.mlrc: swept over validation.fold)
experiment_mlrc = report_flag("mlrc")
# the table shows a diverged run's last finite evaluation (RSW Table III)
experiment_last_finite = report_flag("last_finite")


def experiment_records(wildcards):
    # MLRC experiments also need each run's folder: the fold embeddings are concatenated
    folder = experiment_mlrc(wildcards)
    return [
        run_record(
            run,
            sweep=run.experiments[wildcards.experiment],
            **({"dir": LAYOUT.run_dir(run.run_id)} if folder else {}),
        )
        for run in table_runs(wildcards.experiment)
    ]


REPORTED = f"{CHECKOUT}/config/reported"
TEMPLATES = f"{CHECKOUT}/reports/templates"


def reported_table(experiment):
    """The published table an experiment's report section compares with (none: no input)."""
    return reported_tables(TABLE.experiment(experiment), experiment, REPORTED)


def experiment_methods(wildcards):
    """The method configs of an experiment's methods only (a change elsewhere leaves it alone)."""
    names = config["experiments"][wildcards.experiment]["methods"]
    return canonical({name: config["methods"][name] for name in names})


def built_experiments(target):
    """The built experiments of a target (TARGETS: workflow/rules/targets.smk), in the config's order."""
    return [name for name in TARGETS[target] if name in EXPERIMENTS]


def target_experiments(wildcards):
    """Input function: :func:`built_experiments` of the job's target."""
    return built_experiments(wildcards.target)


def target_files(pattern):
    """Input function: `pattern` filled for each built experiment of the target."""
    return lambda wildcards: expand(pattern, experiment=target_experiments(wildcards))


def train_resource(name):
    """A training job's resource `name` for the scheduler (runtime, mem_mb, gpu, cpus: the job's
    threads, or slurm_extra: the warning signal), dmlrepro.job_requests.train_request and slurm_signal.
    """

    def resource(wildcards):
        run = trained_run(wildcards)
        search = TABLE.search_spec(run.run_id) if run.run_id in TABLE.searches else None
        request = train_request(config, run.dataset, search)
        return (
            slurm_signal(request, run.dataset)
            if name == "slurm_extra"
            else request[name]
        )

    return resource


def train_job_priority(wildcards):
    """A training or search job's priority (dmlrepro.job_requests.train_priority): the longest first."""
    run = trained_run(wildcards)
    search = TABLE.search_spec(run.run_id) if run.run_id in TABLE.searches else None
    data = run.config["dataset"]
    images = expected_train_images(data["name"], data.get("params"))
    return train_priority(planned_images(run.config, images, search_run_count(search)))


def end_of_workflow(servers):
    """onsuccess/onerror: stop the job servers; cancel Snakemake's pending scheduler timers
    (dmlrepro.scheduler_timers)."""
    for server in servers:
        jobserver.stop(server)
    cancel_pending_timers()


def trunk_weights(config):
    """The pretrained trunk's weights file a run config starts from ([] for the others): a job's input
    (rules/pretrain.smk builds it)."""
    return DIGIT_TRUNK.run_weights(config, LAYOUT.trunk_dir())


def with_trunk_folder(config):
    """The run config with the trunk's folder as model.weights_cache_dir (a location, not part of the run id)."""
    return DIGIT_TRUNK.with_folder(config, LAYOUT.trunk_dir())
