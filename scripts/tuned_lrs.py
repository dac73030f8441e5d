"""The LR a comparison tuned for each fixed batch, as a best.json that `tune.best` reads, so that
other runs (the critical batch's branches) train each batch at its tuned LR:

    python scripts/tuned_lrs.py outputs/lm_warmup outputs/lm_warmup/lr_by_batch.json
    python -m bsexp.train -m experiment=lm_critical_batch branch.trunk=<trunks> batch.size=16,32,64 \\
        scaling.lr_rule=none 'optimizer.lr=${bsexp_tuned:lr}' tune.best=outputs/lm_warmup/lr_by_batch.json

Every other value the search chose for that batch is there too, under its key, so that reruns
take all of them (the MNIST-1D comparison searched the momentum and the warmup as well):

    python -m bsexp.train -m comparison=mnist1d batch=fixed batch.size=8,16 seed=1,2 \\
        'optimizer.lr=${bsexp_tuned:optimizer.lr}' 'optimizer.momentum=${bsexp_tuned:optimizer.momentum}' \\
        'schedule.warmup=${bsexp_tuned:schedule.warmup}' tune.best=outputs/compare/tuned.json

Reads the comparison's own files: comparison.json (each baseline arm's batch.size override) and
best.json (each arm's best values, optimizer.lr among them)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def lr_by_batch(tune_dir: Path) -> dict[str, dict[str, float]]:
    arms = json.loads((tune_dir / "comparison.json").read_text())["comparison"]["arms"]
    best = json.loads((tune_dir / "best.json").read_text())
    found = {}
    for name, arm in arms.items():
        sizes = [o.split("=", 1)[1] for o in arm["overrides"] if o.startswith("batch.size=")]
        values = (best.get(name) or {}).get("values", {})
        lr = values.get("optimizer.lr")
        if arm.get("baseline") and sizes and lr is not None:
            found[sizes[0]] = {"lr": lr, "arm": name, **values}  # every searched key too, by its name
    return dict(sorted(found.items(), key=lambda kv: int(kv[0])))


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: python scripts/tuned_lrs.py TUNE_DIR OUT.json")
    found = lr_by_batch(Path(sys.argv[1]))
    if not found:
        sys.exit(f"error: {sys.argv[1]}: no fixed batch with a tuned optimizer.lr in its best.json")
    Path(sys.argv[2]).write_text(json.dumps(found, indent=1) + "\n")
    print(", ".join(f"batch {b}: lr {v['lr']:.4g}" for b, v in found.items()))


if __name__ == "__main__":
    main()
