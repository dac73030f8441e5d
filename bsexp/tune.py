"""`python -m bsexp.tune TUNE_DIR [key=value ...]`: steps to result, the learning rate tuned at every
batch size (Shallue et al. 2019), in three stages, each a Hydra multirun of `python -m bsexp.train`
(so its points run side by side with hydra/launcher=joblib, or as SLURM jobs with
hydra/launcher=slurm):

  1. TUNE_DIR/trials: experiment=steps_to_result over tune.trial=0..tune.trials-1 x the batch sizes
     (the search: bsexp.tuning), each run ended once it reaches tune.target;
  2. TUNE_DIR/best.json: each batch size's best trial (the fewest steps to the target);
  3. TUNE_DIR/seeds: the best of each batch rerun with seeds 1..tune.seeds;

then the report (bsexp.report.steps). The same command again continues a tuning run that was
stopped: each stage's sweep continues in its own directory (python -m bsexp.train -m resume=auto),
so trials that finished are not run again. The batch sizes: tune_batches=[8,16,...] (default:
powers of two from 8 up to 2048, MNIST-1D's training set being 3,500).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BATCHES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048)


def _value(args: list[str], key: str) -> str | None:
    found = [a.split("=", 1)[1] for a in args if a.split("=", 1)[0] == key]
    return found[-1] if found else None


def sweep(out: Path, args: list[str]) -> int:
    """One stage: the sweep into `out`, or its continuation where it has started."""
    if (out / "multirun.yaml").is_file():  # stopped before: what is left, in its own directory
        command = ["-m", "resume=auto", f"hydra.sweep.dir={out}"]
    else:
        command = ["-m", "experiment=steps_to_result", *args, f"hydra.sweep.dir={out}"]
    return subprocess.run([sys.executable, "-m", "bsexp.train", *command]).returncode


def best_trials(tune_dir: Path) -> dict[str, dict]:
    """best.json: each batch size's fewest steps to the target, with its LR, momentum and warmup."""
    from bsexp.report.steps.analysis import analyse
    from bsexp.report.steps.load import load_tuning

    trials, _, target = load_tuning(tune_dir)
    result = analyse(trials, [], target)
    return {
        str(b.batch): {
            "lr": b.best.lr,
            "momentum": b.best.momentum,
            "warmup": b.best.warmup,
            "warmup_shape": b.best.warmup_shape,
            "steps": b.best.steps,
            "trial": b.best.name,
        }
        for b in result.batches
        if b.best is not None
    }


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") or "=" in argv[0]:
        sys.exit(
            "usage: python -m bsexp.tune TUNE_DIR [key=value ...]  (see python -m bsexp.tune --help)"
            if argv[:1] != ["--help"]
            else __doc__
        )
    tune_dir, args = Path(argv[0]), argv[1:]
    batches = _value(args, "tune_batches")
    args = [a for a in args if not a.startswith("tune_batches=")]
    grid = batches.strip("[]") if batches else ",".join(map(str, BATCHES))
    trials = int(_value(args, "tune.trials") or 16)
    if sweep(tune_dir / "trials", [f"batch.size={grid}", f"tune.trial=range(0,{trials})", *args]):
        sys.exit("error: the search did not finish (see above); run the same command again to continue it")
    best = best_trials(tune_dir)
    (tune_dir / "best.json").write_text(json.dumps(best, indent=1) + "\n")
    seeds = int(_value(args, "tune.seeds") or 3)
    if best and seeds:
        rerun = [a for a in args if not a.startswith(("seed=", "tune.trial="))]
        code = sweep(
            tune_dir / "seeds",
            [
                f"batch.size={','.join(best)}",
                f"seed=range(1,{seeds + 1})",
                f"tune.best={(tune_dir / 'best.json').resolve()}",
                "tune.trial=null",
                *rerun,
            ],
        )
        if code:
            sys.exit("error: the reruns did not finish (see above); run the same command again to continue them")
    from bsexp.report.steps.cli import main as report

    report([str(tune_dir)])


if __name__ == "__main__":
    main()
