"""The embedded default's opt-in reality-check miniature (config/config.yaml rsw_reality_mini) plans:
per loss one search with its own lr ranges whose runs switch phases on a validation plateau, and a
final stage whose Complete runs resolve (search_runs probes them at plan time)."""

import copy
from pathlib import Path

import yaml
from snakemake.utils import validate

from dmlrepro.runs import active_experiments, method_search_spec, search_runs

ROOT = Path(__file__).resolve().parents[1]


def test_reality_miniature_is_opt_in_and_plans_a_plateau_search_per_loss():
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    validate(copy.deepcopy(config), str(ROOT / "workflow" / "schemas" / "config.schema.yaml"))
    assert "rsw_reality_mini" not in active_experiments(config)
    searches = [s for s in search_runs({**config, "opt_in": ["rsw_reality_mini"]}).values()
                if "rsw_reality_mini" in s.experiments]
    assert sorted(s.method for s in searches) == ["hist", "proxy_anchor", "rsw"]
    spec = config["experiments"]["rsw_reality_mini"]["search"]
    for search in searches:
        cfg = search.config
        assert cfg["followup"]["trigger"] == "plateau" and cfg["validation"]["patience"] == 2
        assert set(method_search_spec(spec, search.method)["space"]) == {"optimizer.lr", "followup.lr"}
    rsw = next(s for s in searches if s.method == "rsw")
    assert rsw.config["followup"]["loss"]  # RSW's phase-2 warp values stay
