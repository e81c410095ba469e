"""The report reads what runs export into their folders (dmlrepro.train.state.RunDir), never a
checkpoint: no module of dmlrepro.report imports the engine's checkpoint module, at module level or
inside a function (the static import graph of tests/project/test_import_cycles.py)."""

from __future__ import annotations

from .test_import_cycles import import_graph

CHECKPOINTS = "dmlrepro.train.checkpoint"


def checkpoint_readers(graph: dict[str, set[str]]) -> list[str]:
    """The report's modules whose imports run the checkpoint module."""
    return sorted(
        name
        for name, imported in graph.items()
        if (name == "dmlrepro.report" or name.startswith("dmlrepro.report.")) and CHECKPOINTS in imported
    )


def test_no_report_module_imports_the_checkpoint_module():
    assert checkpoint_readers(import_graph()) == []


def test_a_function_level_checkpoint_import_in_the_report_is_found(tmp_path):
    package = tmp_path / "dmlrepro"
    for folder in ("report", "train"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "train" / "checkpoint.py").write_text("")
    late_import = "def panel():\n    from dmlrepro.train.checkpoint import load_latest\n"
    (package / "report" / "kinds.py").write_text(late_import)
    assert checkpoint_readers(import_graph(tmp_path)) == ["dmlrepro.report.kinds"]
