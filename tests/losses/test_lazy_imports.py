"""The papers' losses load without pytorch-metric-learning: its import (scipy.stats) waits for a baseline."""

import subprocess
import sys

CHECK = """
import sys
import dmlrepro.losses
from dmlrepro.losses import build_loss, proxy_points
loss = build_loss("pfml", 3, 4, proxies_per_class=2)
proxy_points(loss)
assert not any(name.startswith("pytorch_metric_learning") for name in sys.modules), "PML imported early"
assert "scipy.stats" not in sys.modules
build_loss("proxy_anchor", 3, 4)
assert "pytorch_metric_learning.losses" in sys.modules
points, labels = proxy_points(build_loss("soft_triple", 3, 4, centers_per_class=2, tau=0.2))
assert points.shape == (6, 4) and labels.tolist() == [0, 0, 1, 1, 2, 2]
"""


def test_pml_is_imported_only_when_a_baseline_is_built():
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
