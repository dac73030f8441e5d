"""The table scripts/every_arm.sh prints: one row per point of each sweep under a directory, with
the accuracy it reached (from the sweep's jobs.jsonl and each point's summary.json).

    python scripts/arm_table.py outputs/multirun/every_arm/<date>/<time>
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bsexp.runs.sweep import read_index

CHANCE = 0.1  # MNIST-1D and digits: 10 classes


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def rows(root: Path) -> list[str]:
    out = []
    for sweep in sorted(p for p in root.iterdir() if (p / "jobs.jsonl").exists()):
        for name, entry in sorted(read_index(sweep).items(), key=lambda item: item[1]["num"]):
            summary_path = sweep / name / "summary.json"
            summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
            point = ",".join(o for o in name.partition("_")[2].split(",") if o and not o.startswith("seed=")) or "-"
            best = summary.get("best_val_acc")
            trained = "no (chance)" if best is None or best < 2 * CHANCE else "yes"
            out.append(
                f"| {sweep.name} | {point} | {entry['status']} | {summary.get('batch_size', '-')} | "
                f"{summary.get('steps', '-')} | {percent(summary.get('val_acc'))} | {percent(best)} | "
                f"{percent(summary.get('test_acc'))} | {trained} |"
            )
    return out


def main() -> None:
    root = Path(sys.argv[1])
    print("| experiment | point | status | batch | steps | val acc % | best val % | test acc % | trained |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows(root)))


if __name__ == "__main__":
    main()
