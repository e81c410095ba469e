"""Preflight: every run shape of a workflow config built and stepped on this node, and the cost of
the reproduction before it is submitted (docs/preflight.md).

* :mod:`.shapes` — the config's runs grouped by what selects code or tensor shapes;
* :mod:`.sources` — the prepared data and cached weights, or stand-ins that keep the shapes;
* :mod:`.stepping` — one shape through the training engine: data pipeline, steps, evaluation, memory;
* :mod:`.worker` — shapes in a separate process, with a time limit;
* :mod:`.projection` — each run's hours against its SLURM budget; the training job's own check;
* :mod:`.node` — the device, torch / CUDA, bfloat16, faiss;
* :mod:`.cli` — ``dmlrepro preflight``; :mod:`.workflow` — rule ``preflight``.
"""
