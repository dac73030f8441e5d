"""Reading a tuning run from disk (bsexp.tune): its search's points and the reruns of the best."""

from __future__ import annotations

from pathlib import Path

from bsexp.report.analysis.points import Point
from bsexp.report.load import load_points

TRIALS, RERUNS, BEST = "trials", "seeds", "best.json"


def load_tuning(tune_dir: Path) -> tuple[list[Point], list[Point], float, str]:
    """The search's points, the reruns' (none before they ran), the target they count to and its
    metric (val_acc, or a loss; tunings from before tune.metric: val_acc)."""
    trials = load_points(tune_dir / TRIALS) if (tune_dir / TRIALS).is_dir() else []
    reruns = load_points(tune_dir / RERUNS) if (tune_dir / RERUNS).is_dir() else []
    tune = next((p.config["tune"] for p in trials if (p.config or {}).get("tune")), None)
    if tune is None:
        raise ValueError(f"{tune_dir} holds no tuning run ({TRIALS}/ with the points of python -m bsexp.tune)")
    return trials, reruns, float(tune["target"]), str(tune.get("metric") or "val_acc")
