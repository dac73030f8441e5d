#!/usr/bin/env bash
# Every arm of every shipped experiment, run as shipped at one seed, and the accuracy each reaches:
# the check that each arm trains (chance on MNIST-1D and digits is 10 %), or fails where its config
# says it is there to show a failure. Slow (21 minutes on 2 cores, 2026-11-26): run it before a release, or
# after a change to an experiment or to training; its table goes in the README.
#
#   scripts/every_arm.sh                 # seed 0, MNIST-1D, into outputs/multirun/every_arm/<date>/<time>
#   scripts/every_arm.sh seed=1          # extra arguments go to every sweep
#   EXPERIMENTS="linear_scaling increase_batch" scripts/every_arm.sh
#
# The critical-batch experiment runs its trunk only (its branches need the trunk's directory).
set -uo pipefail
cd "$(dirname "$0")/.."
root="${EVERY_ARM_DIR:-outputs/multirun/every_arm/$(date +%Y-%m-%d)/$(date +%H-%M-%S)}"
default="linear_scaling scaling_rules accumulation_vs_large norm_small_batch generalization_gap increase_batch
adaptive_vs_fixed adaptive_vs_fixed/fixed critical_batch/trunk"
failed=0
for name in ${EXPERIMENTS:-$default}; do
    args=("experiment=${name%%/*}")                            # critical_batch/trunk:
    [[ "$name" == */* ]] && args+=("experiment/${name%%/*}=${name#*/}")  # + experiment/critical_batch=trunk
    echo "== $name"
    python -m bsexp.train -m "${args[@]}" seed=0 trainer.progress=false logger=none \
        "hydra.sweep.dir=$root/${name//\//-}" "$@" || failed=1
done
python scripts/arm_table.py "$root"
exit $failed
