#!/usr/bin/env bash
# The canonical batch-size sweep: experiment=linear_scaling (batch 32 -> 1024 x seeds 0-2 on
# MNIST-1D, linear LR rule, gradual warmup; Goyal et al. 2017), then its report.
#
#   scripts/sweep_batch_sizes.sh                                  # one point after another
#   scripts/sweep_batch_sizes.sh hydra/launcher=joblib hydra.launcher.n_jobs=2   # side by side
#   scripts/sweep_batch_sizes.sh data=cifar10 model=resnet18 epochs=90 device=cuda
#
# Extra arguments go to the sweep. Points that fail are recorded in jobs.jsonl and reported as such.
# SWEEP_DIR=path puts the sweep there instead of outputs/multirun/linear_scaling/<date>/<time>.
set -uo pipefail
cd "$(dirname "$0")/.."
dir="${SWEEP_DIR:-outputs/multirun/linear_scaling/$(date +%Y-%m-%d)/$(date +%H-%M-%S)}"
python -m bsexp.train -m experiment=linear_scaling "hydra.sweep.dir=$dir" "$@"
status=$?
if [ ! -d "$dir" ]; then
    exit "$status"  # nothing ran (a configuration error, already explained)
fi
[ "$status" -eq 0 ] || echo "some points did not complete; reporting on all of them" >&2
python -m bsexp.report "$dir" || exit $?
echo "report: $dir/report.md (figures and report.csv beside it)"
