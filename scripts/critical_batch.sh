#!/usr/bin/env bash
# experiment=critical_batch end to end (docs: The noise scale and the critical batch, "The critical batch measured directly"):
# the trunks (3 seeds at batch 32, B_simple measured as they train), their branches (7 checkpoints x
# 6 batches x 3 seeds), a sweep of fixed batches on the same set-up for B_crit (each batch at its best
# of 3 LRs, 3 seeds, evaluated every step: early targets are reached in a handful of large-batch
# steps), and the report (critical.md, critical.csv, critical.png in the branch sweep's directory).
#
#   scripts/critical_batch.sh                       # set-up A: the experiment as shipped (BatchNorm, cosine)
#   scripts/critical_batch.sh model.norm=none schedule.main=constant schedule.warmup=0     # set-up B
#   scripts/critical_batch.sh hydra/launcher=joblib hydra.launcher.n_jobs=2    # two points side by side
#
# Extra arguments go to every stage (the same set-up throughout). CRITICAL_DIR=path puts the three
# sweeps there instead of outputs/multirun/<experiment>/<date>/<time>/{trunk,branches,fixed}.
# EXPERIMENT=lm_critical_batch runs the GPT's (docs: Language models): its trunks and branches, and
# no fixed-batch sweep (B_crit needs a tuning of its own there).
# About 22 minutes a set-up on 2 cores with the joblib launcher (45 for both, 2026-11-26).
set -uo pipefail
cd "$(dirname "$0")/.."
experiment="${EXPERIMENT:-critical_batch}"
root="${CRITICAL_DIR:-outputs/multirun/$experiment/$(date +%Y-%m-%d)/$(date +%H-%M-%S)}"
quiet=(trainer.progress=false logger=none)
python -m bsexp.train -m "experiment=$experiment" "experiment/$experiment=trunk" "${quiet[@]}" \
    "hydra.sweep.dir=$root/trunk" "$@" || exit $?
python -m bsexp.train -m "experiment=$experiment" "branch.trunk=$root/trunk" "${quiet[@]}" \
    "hydra.sweep.dir=$root/branches" "$@" || echo "some branches did not complete; reporting on all of them" >&2
if [[ $experiment == lm_critical_batch ]]; then  # the branches alone: no fixed-batch sweep of the GPT here
    python -m bsexp.report.critical "$root/branches" || exit $?
else
    python -m bsexp.train -m experiment=adaptive_vs_fixed experiment/adaptive_vs_fixed=fixed trainer.eval_every_steps=1 \
        "${quiet[@]}" "hydra.sweep.dir=$root/fixed" "$@" || echo "some fixed batches did not complete" >&2
    python -m bsexp.report.critical "$root/branches" --sweep "$root/fixed" || exit $?
fi
echo "report: $root/branches/critical.md (critical.csv and critical.png beside it)"
