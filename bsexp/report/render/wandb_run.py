"""The report as a `report` run of the sweep's W&B group: the table and the figures, where the sweep
logged to W&B."""

from __future__ import annotations

import os
from pathlib import Path

from bsexp.report.analysis import Analysis
from bsexp.report.render.table import columns, table


def _logs_to_wandb(logger: dict) -> bool:
    """logger.wandb.enabled (logger=wandb, or a list with it); logger.kind in sweeps made before #46."""
    return bool((logger.get("wandb") or {}).get("enabled")) or logger.get("kind") == "wandb"


def to_wandb(analysis: Analysis, out_dir: Path, names: list[str], group: str) -> str | None:
    """The table and figures as a `report` run in the sweep's W&B group, when the sweep logged to W&B."""
    configs = [p.config for p in analysis.points if p.config]
    node = next((c["logger"] for c in configs if _logs_to_wandb(c.get("logger") or {})), None)
    if node is None:
        return None
    import wandb

    wb = node.get("wandb") or {}
    mode = wb.get("mode") or os.environ.get("WANDB_MODE", "offline")
    run = wandb.init(
        project=wb.get("project", "bsexp"),
        entity=wb.get("entity"),
        group=wb.get("group") or group,
        name="report",
        job_type="report",
        mode=mode,
        dir=str(out_dir),
        settings=wandb.Settings(silent=True),
    )
    rows = table(analysis)
    header = columns(analysis)
    run.log(
        {
            "report/table": wandb.Table(columns=header, data=[[r[c] for c in header] for r in rows]),
            **{f"report/{Path(n).stem}": wandb.Image(str(out_dir / n)) for n in names},
        }
    )
    run.finish()
    return mode
