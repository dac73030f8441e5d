"""The batch-size finder against the truth, under a real CPU memory cap.

Ground truth: the largest global batch that survives three training steps and an evaluation
pass in a fresh process capped at the memory limit (`trainer.memory_limit_gb`, with
`trainer.oom_recovery=false`, so that an out-of-memory error ends the process), found by
bisection over fresh processes (each size its own process, so nothing carries over). Then each
finder mode runs as users run it (`batch=finder`, then three training steps and evaluation
under the same cap) and this prints, per mode: the size found, found / ground truth, trials,
seconds spent probing, and whether training at the found size then succeeded.

Goals: the default mode (fit) finds >= 0.90 of the ground truth and never more, in fewer
seconds than a plain power-then-bisect search (binsearch). Doubling (power) can only land on a
power of two, so its ratio depends on where the truth falls between two of them.

    python scripts/bench_finder.py                      # a wide MLP on synthetic data, 1.0 GB
    python scripts/bench_finder.py --limit-gb 1.5 model=cnn data.shape=[3,32,32] model.width=16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

# OOM recovery off: with it on every size "fits" (it halves the micro-batch and accumulates), and
# the truth becomes the training set's size.
SETUP = ["data=synthetic", "data.shape=[1,40]", "data.num_samples=8000", "data.val_size=200", "model=mlp",
         "model.hidden=[8192]", "logger=none", "trainer.progress=false", "epochs=1", "trainer.max_steps=3",
         "trainer.oom_recovery=false"]
GOAL = 0.90


def train(args: list[str], workdir: Path, tag: str) -> tuple[int, str, Path]:
    run_dir = workdir / tag
    out = subprocess.run([sys.executable, "-m", "bsexp.train", *args, f"hydra.run.dir={run_dir}"],
                         cwd=workdir, capture_output=True, text=True)
    return out.returncode, out.stderr, run_dir


def fits(size: int, setup: list[str], limit: float, workdir: Path) -> bool:
    code, err, _ = train([*setup, f"batch.size={size}", f"trainer.memory_limit_gb={limit}"], workdir, f"gt-{size}")
    if code not in (0, 1) or (code == 1 and "out of memory" not in err):
        raise RuntimeError(f"batch {size} failed for another reason:\n{err[-2000:]}")
    return code == 0


def ground_truth(setup: list[str], limit: float, workdir: Path, largest: int) -> tuple[int, int]:
    """Bisection over fresh processes: the largest size that fits, and the processes run."""
    low, high, runs = 1, largest + 1, 0
    size = 64
    with tqdm(desc="ground truth", unit="process") as bar:
        while size < high and fits(size, setup, limit, workdir):  # double to bracket the boundary
            low, size, runs = size, size * 2, runs + 1
            bar.update()
        high, runs = min(size, high), runs + 1
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if fits(mid, setup, limit, workdir) else (low, mid)
            runs += 1
            bar.update()
    return low, runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit-gb", type=float, default=1.0, help="the memory cap (1.0)")
    parser.add_argument("--modes", default="fit,power,binsearch")
    parser.add_argument("--max-trials", type=int, default=25, help="per search (25, as Lightning's binsearch)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for the model and data")
    args = parser.parse_args()
    setup = [*SETUP, *args.overrides]
    os.environ.setdefault("BSEXP_DATA", str(Path("data").resolve()))
    with tempfile.TemporaryDirectory(prefix="bench_finder_") as tmp:
        workdir = Path(tmp)
        started = time.perf_counter()
        truth, runs = ground_truth(setup, args.limit_gb, workdir, largest=7800)
        print(f"ground truth: {truth} (bisection over {runs} fresh processes, {time.perf_counter() - started:.0f} s)")
        rows = []
        for mode in tqdm(args.modes.split(","), desc="finder modes", unit="mode"):
            code, err, run_dir = train([*setup, "batch=finder", f"batch.finder.mode={mode}", f"batch.finder.max_trials={args.max_trials}",
                                        f"batch.finder.memory_limit_gb={args.limit_gb}",
                                        f"trainer.memory_limit_gb={args.limit_gb}"], workdir, f"finder-{mode}")
            finder = json.loads((run_dir / "finder.json").read_text())
            largest = max(t["size"] for t in finder["trials"] if t["ok"])
            rows.append((mode, finder["micro_size"], finder["micro_size"] / truth, len(finder["trials"]),
                         finder["seconds"], code == 0, largest / truth))
    print(f"\n{'mode':<10} {'found':>6} {'found/truth':>11} {'largest fit/truth':>17} {'trials':>6} {'seconds':>8}"
          f"  trains at found size")
    for mode, found, ratio, trials, seconds, ok, largest in rows:
        print(f"{mode:<10} {found:>6} {ratio:>11.3f} {largest:>17.3f} {trials:>6} {seconds:>8.1f}  {'yes' if ok else 'NO'}")
    print("(found = the largest size that passed a trial, less the margin, batch.finder.margin = 5 %)")
    by_mode = {row[0]: row for row in rows}
    print(f"\nevery mode at or below the truth and trainable there: "
          f"{'yes' if all(row[2] <= 1.0 and row[5] for row in rows) else 'NO'}")
    if "fit" in by_mode:
        ratio = by_mode["fit"][2]
        print(f"fit: found/truth {ratio:.3f} (goal >= {GOAL}): {'met' if GOAL <= ratio <= 1.0 else 'NOT met'}")
    if "fit" in by_mode and "binsearch" in by_mode:
        fit_s, bis_s = by_mode["fit"][4], by_mode["binsearch"][4]
        print(f"fit / binsearch seconds: {fit_s / bis_s:.2f} ({'faster' if fit_s < bis_s else 'NOT faster'})")


if __name__ == "__main__":
    main()
