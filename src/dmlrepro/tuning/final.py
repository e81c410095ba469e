"""The final stage after a search (RSW App. D, the metric-learning reality check): how long the
"Complete" runs train. The runs themselves are run-table entries: dmlrepro.runs.final_runs."""

from __future__ import annotations

import math
from typing import Any


def observed_epochs(train_logs: list[Any], multiple: int = 5) -> dict[str, Any]:
    """RSW App. D-B: a Complete run trains, per phase, "the mean of the total and followup epochs
    observed in the eval runs, rounded up to the nearest multiple of 5". Observed = the epochs each
    fold run's train_log.csv holds (epoch ≥ 1; followup = phase 2), so early stopping counts."""
    import pandas as pd

    totals, followups = [], []
    for path in train_logs:
        log = pd.read_csv(path)
        log = log[log["epoch"] >= 1]
        totals.append(len(log))
        followups.append(int((log["phase"] == 2).sum()) if "phase" in log else 0)
    if not totals:
        raise ValueError("observed_epochs: no train logs")

    def up(values):
        return max(multiple, multiple * math.ceil(sum(values) / len(values) / multiple))

    followup = up(followups) if any(followups) else 0
    return {"epochs": max(up(totals), followup + multiple), "followup_epochs": followup,
            "observed": {"epochs": totals, "followup_epochs": followups}}
