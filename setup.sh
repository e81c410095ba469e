#!/usr/bin/env bash
# Create .venv with dmlrepro and everything it needs (CPU faiss and the dev tools); safe to rerun.
# On a CUDA cluster use `.venv/bin/pip install -e ".[gpu]"` instead of the cpu extra (see README).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "setup.sh: Python >= 3.11 needed ($PYTHON is $("$PYTHON" --version))" >&2; exit 1; }
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[cpu,dev]"
.venv/bin/python -c "import dmlrepro, torch, torchvision, faiss, pytorch_metric_learning, snakemake; print('dmlrepro environment ready: torch', torch.__version__)"
