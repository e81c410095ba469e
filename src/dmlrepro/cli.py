"""`dmlrepro COMMAND ...`: one entry point over the subpackages' own command-line front ends."""

from __future__ import annotations

import importlib
import sys

# command -> (module, function, arguments put before the user's, one-line help)
COMMANDS = {
    "prepare": ("dmlrepro.data.cli", "main", ["prepare"], "download, verify and prepare a dataset (NAME --root DIR)"),
    "datasets": (
        "dmlrepro.data.cli",
        "main",
        ["datasets"],
        "list the datasets and whether they are prepared (--root DIR)",
    ),
    "fetch-weights": ("dmlrepro.models.cli", "main", [], "put pretrained backbone weights into the local cache"),
    "train": ("dmlrepro.train.cli", "train_main", [], "train one run: RUN_CONFIG OUTDIR (resumes if interrupted)"),
    "evaluate": ("dmlrepro.train.cli", "evaluate_main", [], "(re)compute a run's metrics: OUTDIR"),
    "launch": (
        "dmlrepro.train.cli",
        "launch_main",
        [],
        "submit one run to SLURM via submitit (single runs outside the DAG)",
    ),
    "runs": ("dmlrepro.runs", "main", [], "list the runs the workflow's experiments resolve to (--experiment NAME)"),
    "check-report": (
        "dmlrepro.report.browser",
        "main",
        [],
        "check a built HTML report in headless Chromium (images, console, screenshot)",
    ),
    "tune": (
        "dmlrepro.tuning.cli",
        "main",
        [],
        "Bayesian-optimisation search of run-config keys: SEARCH_CONFIG OUTDIR",
    ),
    "losses": ("dmlrepro.cli", "losses_main", [], "list the losses that config can name"),
    "doctor": ("dmlrepro.doctor", "main", [], "print this node's torch, CUDA, driver, GPUs, CPUs and faiss"),
    "preflight": (
        "dmlrepro.preflight.cli",
        "main",
        [],
        "build and step every run shape on this node; project the cost",
    ),
    "plan": (
        "dmlrepro.plan",
        "main",
        [],
        "a target's jobs, GPU-hours and datasets before submitting it: [TARGET ...] --configfile FILE [FILE ...]",
    ),
}


def losses_main(argv: list[str]) -> int:
    """`dmlrepro losses`: each loss config can name, its paper, where its code comes from and its defaults."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="dmlrepro losses",
        description="List the losses a run config can name (loss.name), each with its paper, where its code "
        "comes from (written from the paper, a port of the official code, a library) and the hyperparameters "
        "a run gets when loss.hparams leaves them out. A loss of your own: loss.name: package.module:ClassName "
        "(docs/tasks/own-loss.md).",
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="only these losses; an import path package.module:ClassName checks and shows a loss of yours",
    )
    args = parser.parse_args(argv)
    from dmlrepro.losses import BASELINES, loss_names, loss_spec  # deferred: imports torch
    from dmlrepro.losses.registry import ORIGINS

    for name in args.names or loss_names():
        try:
            spec = loss_spec(name)
        except ValueError as error:
            print(f"dmlrepro losses: {error}", file=sys.stderr)
            return 2
        baseline = BASELINES.get(name)
        origin = ORIGINS[spec.origin] + (f" (pytorch-metric-learning {baseline.pml_class})" if baseline else "")
        print(f"{name:20s} {spec.paper.citation}")
        print(f"{'':20s}   {origin}")
        defaults = ", ".join(f"{key}={value!r}" for key, value in spec.defaults().items()) or "none"
        print(f"{'':20s}   defaults: {defaults}")
        if baseline and baseline.note:
            print(f"{'':20s}   {baseline.note}")
    return 0


def version() -> str:
    """The installed package's version (pyproject.toml's [project] version)."""
    from importlib.metadata import PackageNotFoundError, version as installed

    try:
        return installed("dmlrepro")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed: pip install -e .)"


def usage() -> str:
    lines = [
        "usage: dmlrepro COMMAND [ARGS ...]",
        "",
        "dmlrepro reproduces PFML, RSW and ASAP DML with their baselines; snakemake runs the workflow (README.md).",
        "",
        "commands:",
    ]
    lines += [f"  {name:14s} {help_}" for name, (_, _, _, help_) in COMMANDS.items()]
    lines += ["", "`dmlrepro COMMAND --help` describes a command's arguments; `dmlrepro --version` the version."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] == "--version":
        print(f"dmlrepro {version()}")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"dmlrepro: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module_name, function, prefix, _ = COMMANDS[command]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        print(f"dmlrepro {command}: not available in this version ({error})", file=sys.stderr)
        return 2
    return int(getattr(module, function)(prefix + rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
