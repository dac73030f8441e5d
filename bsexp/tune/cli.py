"""`python -m bsexp.tune TUNE_DIR [key=value ...]`: steps to result, the learning rate tuned at every
batch size (Shallue et al. 2019), in three stages, each a Hydra multirun of `python -m bsexp.train`
(so its points run side by side with hydra/launcher=joblib, or as SLURM jobs with
hydra/launcher=slurm):

  1. TUNE_DIR/trials: experiment=steps_to_result over tune.trial=0..tune.trials-1 x the batch sizes
     (the search: bsexp.runs.quasi_random), each run ended once it reaches tune.target;
  2. TUNE_DIR/best.json: each batch size's best trial (the fewest steps to the target);
  3. TUNE_DIR/seeds: the best of each batch rerun with seeds 1..tune.seeds;

then the report (bsexp.report.steps). The same command again continues a tuning run that was
stopped: each stage's sweep continues in its own directory (python -m bsexp.train -m resume=auto),
so trials that finished are not run again; a command that would change what they compute is
refused. The batch sizes: tune_batches=[8,16,...] (default: powers of two from 8 up to 2048,
MNIST-1D's training set being 3,500).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bsexp.config.shadowed import check_not_shadowed
from bsexp.errors import exit_on_config_error
from bsexp.tune.stage import refuse, sweep

BATCHES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048)


def _value(args: list[str], key: str) -> str | None:
    found = [a.split("=", 1)[1] for a in args if a.split("=", 1)[0] == key]
    return found[-1] if found else None


def _count(args: list[str], key: str, default: int) -> int:
    """A whole number of the command line (tune.trials, tune.seeds), or one line and exit 2."""
    given = _value(args, key)
    try:
        return default if given is None else int(given)
    except ValueError:
        refuse(f"{key}={given}: must be a whole number (>= 1; tune.seeds: >= 0)")


def best_trials(tune_dir: Path) -> dict[str, dict]:
    """best.json: each batch size's fewest steps to the target, with its LR, momentum and warmup."""
    from bsexp.report.steps.analysis import analyse
    from bsexp.report.steps.load import load_tuning

    trials, _, target, metric = load_tuning(tune_dir)
    result = analyse(trials, [], target, metric=metric)
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


def _momentum(args: list[str]) -> list[str]:
    """The search's momentum for an optimizer that has one (SGD, LARS): the override that gives it;
    none for one without (AdamW, a GPT's recipe: the search sets its LR, and a warmup with
    tune.warmup_max), where tune.momentum=true is one line, before any run."""
    from omegaconf import OmegaConf

    from bsexp.tune.comparison import compose
    from bsexp.tune.stage import free

    searchpath = [a for a in args if a.startswith("hydra.searchpath=")]
    with exit_on_config_error():
        cfg = compose([*searchpath, *(a for a in args if not free(a))])
    if "momentum" in cfg.optimizer:
        return ["optimizer.momentum=${bsexp_tuned:momentum,0.9}"]
    if cfg.tune.momentum:
        target = OmegaConf.select(cfg, "optimizer._target_")
        refuse(
            f"tune.momentum=true: optimizer._target_={target} has no momentum for the search to set; leave "
            "tune.momentum out (the LR is searched, a warmup too with tune.warmup_max), or give optimizer=sgd"
        )
    return []


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--help"], ["-h"]):
        print(__doc__)
        return
    if not argv or argv[0].startswith("-") or "=" in argv[0]:
        refuse("TUNE_DIR: missing; usage: python -m bsexp.tune TUNE_DIR [key=value ...] (--help says more)")
    tune_dir, args = Path(argv[0]), argv[1:]
    with exit_on_config_error():
        check_not_shadowed(args)  # a comparison (or any group's file) of the user's that bsexp's own would hide
    if any(a.split("=", 1)[0] == "comparison" for a in args):  # arms tuned alike (bsexp.tune.comparison)
        from bsexp.tune.comparison import run

        run(tune_dir, args)
        return
    batches = _value(args, "tune_batches")
    args = [a for a in args if not a.startswith("tune_batches=")]
    grid = batches.strip("[]") if batches else ",".join(map(str, BATCHES))
    trials = _count(args, "tune.trials", 16)
    args = [*args, *_momentum(args)]
    sweep(tune_dir / "trials", [f"batch.size={grid}", f"tune.trial=range(0,{trials})", *args])
    best = best_trials(tune_dir)
    (tune_dir / "best.json").write_text(json.dumps(best, indent=1) + "\n")
    seeds = _count(args, "tune.seeds", 3)
    if best and seeds:
        rerun = [a for a in args if not a.startswith(("seed=", "tune.trial="))]
        sweep(
            tune_dir / "seeds",
            [
                f"batch.size={','.join(best)}",
                f"seed=range(1,{seeds + 1})",
                f"tune.best={(tune_dir / 'best.json').resolve()}",
                "tune.trial=null",
                *rerun,
            ],
        )
    from bsexp.report.steps.cli import main as report

    report([str(tune_dir)])


if __name__ == "__main__":
    main()
