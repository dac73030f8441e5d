#!/usr/bin/env bash
# bsexp's GPU check on a fresh GPU machine (no network), in one call of at most 10 minutes with
# room to spare: every part runs under a time limit cut to what is left of DEADLINE (default 450 s
# of the call), the most wanted first, and the last line of the results says what it did not reach.
# Only what needs the GPU runs here: the CPU test tiers are CI's (on an H200 they took the cores
# the GPU tests needed, and two 10-minute calls did not finish them). Prepare the wheelhouse where
# the registry is reachable (scripts/gpu_bundle.sh), then carry it (.gpu/wheels; and .gpu/data,
# MNIST-1D made once, where it exists) with the checkout:
#
#   scripts/gpu_check.sh [OUT]         # OUT: where the results and the log go ($OUT, else .gpu/out)
#
# It installs hydra-core, omegaconf, mnist1d and the rest offline into a folder of their own
# (.gpu/site, on PYTHONPATH: the image's torch stays as it is), then, in this order:
#   bench-small  scripts/bench_gpu.py on the default run (cnn1d, MNIST-1D, fp32, batch 128): bsexp
#                eager / graphed / compiled inside its graph against a hand loop eager / graphed
#   graphed      tests/gpu's graphed-step tests (trainer.cuda_graphs): accumulation equals one batch
#                in fp32 and bf16, a batch that changes between keys, resume after kill -9, the finder
#   bench-large  scripts/bench_gpu.py on ResNet-18 (3 x 32 x 32, bf16, batch 512), not compiled
#   first        the users' first command, `python -m bsexp.train`, on CUDA: graphed (cuda_graphs=auto),
#                eager (trainer.cuda_graphs=off) and reproducible: samples/s end to end
#   bench-gpt    scripts/bench_gpu.py on the 124M GPT (context 1,024, bf16, 16 sequences), not
#                compiled: tokens/s and the model FLOPs utilisation
#   gpu-rest     the rest of tests/gpu (the eager CUDA paths), heaviest first, in what time is left
# and writes OUT/gpu_check.md (the GPU, torch, each part's outcome, time and figures) and
# OUT/gpu_check.log (everything), both flushed after every part, so a time-out still returns them.
# On a machine without CUDA it does the same: the CUDA tests skip, the benchmarks run on the CPU
# at tiny sizes (bench_gpu.py --cpu), the first commands on the CPU.
#   PYTHON=...     the interpreter with torch (default python3; on a CPU machine: .venv/bin/python)
#   PARTS=...      which parts (default: bench-small graphed bench-large first bench-gpt gpu-rest)
#   DEADLINE=...   seconds of the call the parts may use, from the start (default 450)
#   WORKERS=...    pytest-xdist workers for the GPU tests (default 4: each test is a few training
#                  processes sharing the one GPU)
#   THREADS=...    torch's threads in every process (default 2: OMP_NUM_THREADS and MKL_NUM_THREADS;
#                  left to torch, each process takes all 16 cores beside the others)
#   COMPILE_THREADS=...  inductor's compile workers (TORCHINDUCTOR_COMPILE_THREADS, default 4: it sizes
#                  its pool by the cores, not by OMP_NUM_THREADS)
#   WHEELS=...     the wheelhouse (default .gpu/wheels; for another Python: PY_VERSION in gpu_bundle.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=${PYTHON:-python3}
out=$(mkdir -p "${1:-${OUT:-.gpu/out}}" && cd "${1:-${OUT:-.gpu/out}}" && pwd)
report=$out/gpu_check.md
log=$out/gpu_check.log
wheels=${WHEELS:-.gpu/wheels}
site=$root/.gpu/site
parts=" ${PARTS:-bench-small graphed bench-large first bench-gpt gpu-rest} "
deadline=${DEADLINE:-450}
workers=${WORKERS:-4}
threads=${THREADS:-2}
export OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads TORCHINDUCTOR_COMPILE_THREADS=${COMPILE_THREADS:-4}
started=$SECONDS
missed=()  # parts not reached, or stopped at their limit
: >"$log"
: >"$report"
rm -f "$out"/gpu-*.xml  # nothing of an earlier check read as this one's

say() { echo "$*" | tee -a "$report"; }
left() { echo $((deadline - (SECONDS - started))); }
step() {  # step NAME LIMIT_S COMMAND...: run under min(LIMIT_S, time left), log, record outcome and time
    local name=$1 limit=$2 begun=$SECONDS rc
    shift 2
    local room
    room=$(left)
    (( room < limit )) && limit=$room
    if (( limit < 20 )); then
        missed+=("$name (no time left)")
        say "- **$name**: not run, no time left"
        return 124
    fi
    echo "=== $name: $*" >>"$log"
    timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
    rc=$?
    local how="passed"
    (( rc == 124 || rc == 137 )) && { how="stopped at its limit, ${limit} s"; missed+=("$name (cut at ${limit} s)"); }
    (( rc != 0 && rc != 124 && rc != 137 )) && how="failed (exit $rc)"
    say "- **$name**: $how, $((SECONDS - begun)) s"
    return $rc
}
tests_table() {  # tests_table XML TITLE: each test's outcome, from pytest's junit file or, cut short, the log
    "$py" - "$1" "$2" "$log" >>"$report" 2>>"$log" <<'PY'
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

path, title, log = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]).read_text(errors="replace")
rows = []
if path.exists():
    for case in ET.parse(path).getroot().iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        outcome = "failed" if bad is not None else "skipped" if skipped is not None else "passed"
        why = (bad if bad is not None else skipped).get("message", "") if outcome != "passed" else ""
        rows.append((case.get("name"), outcome, f"{float(case.get('time', 0)):.1f} s", " ".join(why.split())[:300]))
else:  # stopped at its limit: what -v wrote as each test finished
    rows = [(t.split("::")[-1], o.lower(), "", "") for o, t in re.findall(r"(PASSED|FAILED|SKIPPED|ERROR) (tests/gpu/\S+)", log)]
print(f"\n{title}{'' if path.exists() else ' (cut short: the tests that finished)'}:\n")
print("| test | outcome | time | message |\n| --- | --- | --- | --- |")
print("\n".join(f"| {' | '.join(c.replace('|', '/') for c in r)} |" for r in rows) or "| (none) | | | |")
print()
PY
}
bench_table() {  # the benchmark's table, as it printed it (the last run's)
    echo >>"$report"
    awk '/^=== bench/{buf=""} /^\||^goal|windows of|tokens\/s: /{buf=buf $0 "\n"} END{printf "%s", buf}' "$log" >>"$report"
    echo >>"$report"
}

say "# bsexp GPU check"
say ""
say "$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
say ""

# Install offline, beside the image's packages (never over them).
if [[ ! -d $wheels ]]; then
    say "no wheelhouse at $wheels: run scripts/gpu_bundle.sh where the registry is reachable, and carry .gpu/wheels"
    exit 2
fi
rm -rf "$site"
"$py" -m pip install --quiet --no-index --no-deps --no-compile --target "$site" "$wheels"/*.whl >>"$log" 2>&1 ||
    { say "installing from $wheels failed (see gpu_check.log)"; exit 2; }
export PYTHONPATH=$root:$site${PYTHONPATH:+:$PYTHONPATH}
export WANDB_SILENT=true WANDB_DISABLE_GIT=true WANDB_MODE=offline
export PYTHONUNBUFFERED=1  # a part stopped at its limit leaves what it printed in the log
export BSEXP_DATA=$root/.gpu/data  # MNIST-1D, made once (carried where it was made before)
"$py" - >>"$report" 2>>"$log" <<'PY'
import os
import platform

import hydra, omegaconf, torch

if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    gpu = f"{torch.cuda.device_count()} x {props.name} ({props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}"
else:
    gpu = "no CUDA device: the CUDA tests skip, the benchmarks run on the CPU at tiny sizes"
print(f"- GPU: {gpu}")
print(f"- Python {platform.python_version()}, torch {torch.__version__}, hydra {hydra.__version__}, "
      f"omegaconf {omegaconf.__version__}; {os.cpu_count()} cores, OMP/MKL threads {os.environ['OMP_NUM_THREADS']}, "
      f"inductor compile threads {os.environ['TORCHINDUCTOR_COMPILE_THREADS']}")
PY
device=$("$py" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
bench=(scripts/bench_gpu.py)
[[ $device == cpu ]] && bench+=(--cpu)
say ""

graphed_tests=(
    tests/gpu/test_gpu.py::test_the_finder_measures_the_graphed_step_and_its_size_trains_graphed_without_running_out
    tests/gpu/test_gpu.py::test_a_graphed_run_killed_mid_way_resumes_and_ends_as_the_uninterrupted_one
    tests/gpu/test_gpu.py::test_graphed_accumulation_equals_one_large_batch_and_the_eager_step
    tests/gpu/test_gpu.py::test_a_batch_that_changes_is_captured_once_a_key_and_trains_as_the_eager_step
)
pytest_gpu=("$py" -m pytest -m cuda -n "$workers" -v -p no:cacheprovider -o addopts="" -ra)
for part in bench-small graphed bench-large first bench-gpt gpu-rest; do
    [[ $parts == *" $part "* ]] || continue
    case $part in
    bench-small)
        step "bench_gpu: the default run ($device)" 110 "$py" "${bench[@]}" --cases mnist1d
        bench_table ;;
    graphed)
        BSEXP_TEST_GPU=1 step "tests/gpu: the graphed step" 170 "${pytest_gpu[@]}" "${graphed_tests[@]}" \
            --junitxml="$out/gpu-graphed.xml"
        tests_table "$out/gpu-graphed.xml" "tests/gpu: the graphed step" ;;
    bench-large)
        step "bench_gpu: ResNet-18 bf16 512 ($device)" 90 "$py" "${bench[@]}" --cases resnet18 --no-compile
        bench_table ;;
    bench-gpt)
        step "bench_gpu: the 124M GPT bf16 ($device)" 90 "$py" "${bench[@]}" --cases gpt --no-compile
        bench_table ;;
    first)
        runs=$root/.gpu/runs
        rm -rf "$runs"
        for name in graphed eager reproducible; do
            args=(); [[ $name == graphed ]] && args=(trainer.cuda_graphs=auto)
            [[ $name == eager ]] && args=(trainer.cuda_graphs=off)
            [[ $name == reproducible ]] && args=(trainer.speed=reproducible)
            step "python -m bsexp.train device=$device${args[*]:+ ${args[*]}}" 40 "$py" -m bsexp.train "device=$device" logger=none \
                trainer.progress=false "${args[@]}" "hydra.run.dir=$runs/$name"
        done
        "$py" - "$runs" >>"$report" 2>>"$log" <<'PY'
import json
import sys
from pathlib import Path

print("\nThe users' first command (python -m bsexp.train, logger=none):\n")
print("| run | status | samples/s | train time | test acc | peak memory | CUDA graphs |\n| --- | --- | --- | --- | --- | --- | --- |")
for name in ("graphed", "eager", "reproducible"):
    path = Path(sys.argv[1]) / name / "summary.json"
    if not path.exists():
        print(f"| {name} | no summary.json | | | | | |")
        continue
    s = json.loads(path.read_text())
    rate, acc = s.get("samples_per_s"), s.get("test_acc")
    print(f"| {name} | {s['status']} | {'-' if rate is None else f'{rate:,.0f}'} | {s['train_time_s']:.1f} s | "
          f"{'-' if acc is None else f'{acc:.3f}'} | {s['peak_memory_mb']:,.0f} MB | {s.get('cuda_graphs')} |")
print()
PY
        ;;
    gpu-rest)
        rest=(tests/gpu)
        for t in "${graphed_tests[@]}"; do rest+=(--deselect "$t"); done
        BSEXP_TEST_GPU=1 step "tests/gpu: the eager CUDA paths" 240 "${pytest_gpu[@]}" "${rest[@]}" \
            --junitxml="$out/gpu-rest.xml"
        tests_table "$out/gpu-rest.xml" "tests/gpu: the eager CUDA paths" ;;
    esac
done
for part in bench-small graphed bench-large first bench-gpt gpu-rest; do
    [[ $parts == *" $part "* ]] || missed+=("$part (not asked for)")
done
say ""
say "total: $((SECONDS - started)) s of $deadline"
if (( ${#missed[@]} )); then
    say "not reached: $(IFS=';'; echo "${missed[*]}" | sed 's/;/; /g')"
else
    say "not reached: nothing, every part ran to its end"
fi
