#!/usr/bin/env bash
# Create .venv with dmlrepro and everything it needs (CPU faiss and the dev tools); safe to rerun.
# The same on a CUDA cluster: k-NN runs in torch on the GPU, faiss-cpu serves NMI's k-means (see README).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
# pyproject's requires-python: tarfile's filter="data" (archive extraction) is in Python >= 3.11.4
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11, 4))' || { echo "setup.sh: Python >= 3.11.4 needed ($PYTHON is $("$PYTHON" --version))" >&2; exit 1; }
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# the locked environment: requirements.lock pins every package of dmlrepro[cpu,dev] with its hashes
# (docs/environment.md; refresh it with .ci/refresh-lock); then dmlrepro itself, editable
.venv/bin/python -m pip install --quiet --require-hashes -r requirements.lock
.venv/bin/python -m pip install --quiet --no-deps -e .
.venv/bin/python -c "import dmlrepro, torch, torchvision, faiss, pytorch_metric_learning, snakemake; print('dmlrepro environment ready: torch', torch.__version__)"
