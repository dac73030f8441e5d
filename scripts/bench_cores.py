"""Two bsexp runs on one machine at once, against one alone (issue 42, item 4).

    python scripts/bench_cores.py [OVERRIDE ...]       # default: the README's default run

Runs `python -m bsexp.train` (logger=none, no progress bar) with the overrides: once alone, then
two at once with torch's default threads (each takes every core), then two at once with the share
bsexp's warning names (trainer.threads = cores / 2). Each run's own training time (summary.json's
train_time_s) is compared with the run alone's; the goal is <= 1.3 for the shared pair. Last, the
run alone at the share: the shared pair against it is the contention left, and it against the run
alone is what the cores each run gave up were worth (a run that scales with its threads cannot
share cores and keep its speed). Prints each run's warning as it was logged. A
measurement, not a test: the exit code is 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def start(run_dir: Path, overrides: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bsexp.train",
            "logger=none",
            "trainer.progress=false",
            *overrides,
            f"hydra.run.dir={run_dir}",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen, run_dir: Path) -> tuple[float, str]:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"{run_dir.name} failed:\n{out[-2000:]}")
    return json.loads((run_dir / "summary.json").read_text())["train_time_s"], out


def main() -> None:
    overrides = sys.argv[1:]
    cores = len(os.sched_getaffinity(0))
    share = max(1, cores // 2)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        alone, _ = finish(start(tmp / "alone", overrides), tmp / "alone")
        print(f"{cores} cores; one run alone: {alone:.2f} s of training (torch's default threads)")
        for n, (name, extra) in enumerate(
            (
                ("two at once, default threads", []),
                (f"two at once, trainer.threads={share}", [f"trainer.threads={share}"]),
            )
        ):
            first = start(tmp / f"pair{n}-a", [*overrides, *extra])
            second = start(tmp / f"pair{n}-b", [*overrides, *extra])
            (a, told_a), (b, told_b) = finish(first, tmp / f"pair{n}-a"), finish(second, tmp / f"pair{n}-b")
            print(f"{name}: {a:.2f} s and {b:.2f} s of training: x{a / alone:.2f} and x{b / alone:.2f} of alone")
            # Started together, the run that enters the registry last is the one told of the other.
            for which, told in (("first", told_a), ("second", told_b)):
                warned = [line for line in told.splitlines() if "other bsexp run" in line]
                print(f"  the {which} run's warning: {warned[0].strip() if warned else '(none)'}")
        ratio = max(a, b) / alone
        print(f"shared pair / alone: {ratio:.2f} (goal <= 1.3) - {'goal met' if ratio <= 1.3 else 'goal missed'}")
        # What is left is the cores each run gave up, not contention: the same run alone at its share.
        at_share, _ = finish(start(tmp / "alone-share", [*overrides, f"trainer.threads={share}"]), tmp / "alone-share")
        print(
            f"one run alone at trainer.threads={share}: {at_share:.2f} s; shared pair / that: "
            f"{max(a, b) / at_share:.2f} (contention), alone at {share} / alone at the default: "
            f"{at_share / alone:.2f} (what the cores it gave up were worth)"
        )


if __name__ == "__main__":
    main()
