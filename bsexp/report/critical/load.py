"""Reading a branch sweep from disk: its branches (each job's summary.json `branch` entry and its
metrics.jsonl) and the metrics of the trunks they branched from."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bsexp.report.critical.analysis import Branch
from bsexp.system.metrics import read_jsonl


def load_branches(sweep: Path) -> list[Branch]:
    found = []
    for job in sorted(p for p in sweep.iterdir() if (p / "summary.json").is_file()):
        summary = json.loads((job / "summary.json").read_text())
        node = summary.get("branch")
        if not node:
            continue
        found.append(
            Branch(
                seed=summary["seed"],
                at=node["at_samples"],
                batch=node["batch"],
                length=node["samples"],
                trunk=node["trunk"],
                status=summary["status"],
                records=read_jsonl(job / "metrics.jsonl"),
                context=summary.get("context"),
                lr=summary.get("lr"),
            )
        )
    return found


def latest_branches(sweeps: Sequence[Path], by_lr: bool = False) -> list[Branch]:
    """The branches of one or more sweeps: a point (seed, branch point, batch; and its LR, `by_lr`:
    an LR sweep's branches kept apart) run again in a later sweep replaces the earlier's where it
    completed (or where there was none)."""
    latest: dict[tuple, Branch] = {}
    for directory in sweeps:
        for b in load_branches(directory):
            key = (b.seed, b.at, b.batch, b.lr if by_lr else None)
            if b.status == "completed" or key not in latest:
                latest[key] = b
    return list(latest.values())


def trunk_records(branches: Sequence[Branch]) -> dict[int, list[dict[str, Any]]]:
    """Each seed's trunk metrics records, from the trunk its branches name."""
    trunks = {b.seed: Path(b.trunk) for b in branches}
    return {seed: read_jsonl(path / "metrics.jsonl") for seed, path in trunks.items()}
