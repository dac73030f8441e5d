"""Two bsexp runs on one machine at once, against one alone (issues 42 and 54).

    python scripts/bench_cores.py [--rounds N] [--pinned-pair] [OVERRIDE ...]   # default: epochs=5

Runs `python -m bsexp.train` (logger=none, no progress bar, the overrides; `epochs=5` unless
given, as issue 54 measured) in rounds, the kinds of run alternated within each round so that a
machine that gets busier or quieter moves them all:

- one run alone with torch's default threads, as a user starts it (it shares the cores: alone, it
  keeps torch's default);
- one run alone pinned at torch's default (`trainer.threads=N`): what a run alone was before runs
  shared the cores, and still is with trainer.speed=reproducible;
- one run alone at one thread (`trainer.threads=1`);
- two default runs started together (each finds the other and takes its share; the first to start
  comes down when the second does).

Each run's own training time is summary.json's train_time_s. Printed: the medians over rounds, and
two ratios measured in this one invocation: the pair (the slower of the two, each round) against
one run alone at one thread (goal <= 1.3; at main 3ea6d43, x34 on an idle 2-core machine) and the
run alone as a user starts it against the run alone pinned at the same count (goal: as fast as
before, ~1.0). `--pinned-pair` also starts two runs pinned at torch's default together, once: the
pair as it was before (slow: a minute or more on 2 cores). The runs register in a registry of the
benchmark's own (BSEXP_CORES_REGISTRY), so other bsexp runs on the machine do not move their
shares; they still take cores. A measurement, not a test: the exit code is 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def start(run_dir: Path, overrides: list[str], registry: Path) -> subprocess.Popen:
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
        env={**os.environ, "BSEXP_CORES_REGISTRY": str(registry), "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen, run_dir: Path) -> tuple[float, dict, str]:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"{run_dir.name} failed:\n{out[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary["train_time_s"], summary, out


def together(tmp: Path, name: str, overrides: list[str], registry: Path) -> list[tuple[float, dict, str]]:
    """Two runs started at once (the second right after the first, as from two terminals)."""
    procs = [start(tmp / f"{name}-{side}", overrides, registry) for side in "ab"]
    return [finish(proc, tmp / f"{name}-{side}") for proc, side in zip(procs, "ab")]


def threads_of(summary: dict) -> str:
    moves = "".join(f" -> {c['threads']} at step {c['step']}" for c in summary["threads_changes"])
    return f"{summary['threads']}{moves}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pinned-pair", action="store_true", help="also two runs pinned at torch's default, once")
    args, overrides = parser.parse_known_args()
    if not any(o.startswith("epochs=") for o in overrides):
        overrides.append("epochs=5")
    cores, default = len(os.sched_getaffinity(0)), torch.get_num_threads()
    kinds = {
        "alone, default threads (shares)": [],
        f"alone, pinned at torch's default (trainer.threads={default})": [f"trainer.threads={default}"],
        "alone, trainer.threads=1": ["trainer.threads=1"],
    }
    times: dict[str, list[float]] = {name: [] for name in [*kinds, "pair, default threads (the slower)"]}
    print(f"{cores} cores, torch's default {default} threads; overrides: {' '.join(overrides)}; {args.rounds} rounds")
    with tempfile.TemporaryDirectory() as tmp:
        tmp, registry = Path(tmp), Path(tmp) / "registry"
        for r in range(args.rounds):
            for n, (name, extra) in enumerate(kinds.items()):
                run_dir = tmp / f"r{r}-k{n}"
                times[name].append(finish(start(run_dir, [*overrides, *extra], registry), run_dir)[0])
            pair = together(tmp, f"r{r}-pair", overrides, registry)
            times["pair, default threads (the slower)"].append(max(t for t, _, _ in pair))
            print(
                f"round {r + 1}: "
                + ", ".join(f"{name.split(' (')[0]} {ts[-1]:.2f} s" for name, ts in times.items())
                + f"; the pair's threads: {threads_of(pair[0][1])} and {threads_of(pair[1][1])}"
            )
        medians = {name: statistics.median(ts) for name, ts in times.items()}
        print("\nmedian train time (summary.json's train_time_s):")
        for name, median in medians.items():
            print(f"  {name:<58} {median:7.2f} s")
        alone, pinned, one = (medians[name] for name in kinds)
        pair = medians["pair, default threads (the slower)"]
        print(f"\ntwo default runs together / one alone at 1 thread: {pair / one:.2f} (goal <= 1.3)")
        print(f"one alone, default (shares) / one alone pinned at {default}: {alone / pinned:.2f} (goal: ~1.0)")
        if args.pinned_pair:
            pinned_pair = together(tmp, "pinned-pair", [*overrides, "trainer.speed=reproducible"], registry)
            slower = max(t for t, _, _ in pinned_pair)
            print(
                f"two runs pinned at torch's default together (the pair before issue 54): "
                f"{pinned_pair[0][0]:.2f} s and {pinned_pair[1][0]:.2f} s; the slower / one alone at 1 thread: "
                f"{slower / one:.2f}"
            )
            for side, (_, _, out) in zip("ab", pinned_pair):
                warned = [line.strip() for line in out.splitlines() if "other bsexp run" in line]
                print(f"  run {side}'s warning: {warned[0] if warned else '(none)'}")


if __name__ == "__main__":
    main()
