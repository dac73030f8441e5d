#!/usr/bin/env bash
# bsexp's GPU check on a fresh GPU machine (no network), meant to take under 8 minutes in one call
# (its parts' limits: the tests 270 s, each first command 45 s, the benchmarks 120 s; 8.75 minutes
# at most, not yet timed on a GPU in this form), or in two where one call's time is short (PARTS
# below; on an H200 the whole once took longer than 10 minutes, before its tests were given 2
# threads a process and the fast path stopped compiling by default). Prepare the
# wheelhouse first where the registry is reachable (scripts/gpu_bundle.sh), then carry it
# (.gpu/wheels) with the checkout:
#
#   scripts/gpu_check.sh [OUT]         # OUT: where the summary and the logs go ($OUT, else .gpu/out)
#
# It installs hydra-core, omegaconf, mnist1d, wandb and the rest offline into a folder of their own
# (.gpu/site, on PYTHONPATH: the image's torch stays as it is), then runs, each under a time limit:
#   1. tests/gpu (BSEXP_TEST_GPU=1): every CUDA path as a user runs it; and, at the same time (the
#      GPU tests use few cores, the CPU tiers no GPU),
#   2. the default tiers with the GPU present (they hide it from themselves: tests/conftest.py);
#   3. the users' first command, `python -m bsexp.train`, on CUDA: its fast path (eager, then compiled)
#      and its reproducible one;
#   4. the GPU benchmarks.
# and writes OUT/gpu_check.md (the GPU, torch, each check's outcome and figures) and
# OUT/gpu_check.log (everything), flushed as it goes, so a time-out still returns them (while 1 and
# 2 run, their output goes to gpu_check.log.gpu and gpu_check.log.default, merged after).
# On a machine without CUDA it does the same: the CUDA tests skip, the benchmarks run on the CPU.
#   PYTHON=...      the interpreter with torch (default python3; on a CPU machine: .venv/bin/python)
#   TIERS=...       the default tiers to run (default: tests/unit tests/loop tests/dist tests/cli)
#   GPU_TESTS=...   what of tests/gpu to run (default: tests/gpu; test ids or paths, space-separated)
#   LIMIT=...       seconds for the tests (both kinds, at once; default 270: the heaviest tests/gpu
#                   start first, and what is left at the limit is named in the summary)
#   PARTS=...       which parts to run (default: gpu tiers first bench). On an H200 the whole took
#                   longer than one 10-minute call (docs/results/gpu.md): run `PARTS=gpu` in one
#                   call and `PARTS="tiers first bench"` in the next, while the machine is warm.
#   WORKERS=...     pytest-xdist workers for each of 1 and 2 (default: cores / 2, at most 8; at least 1)
#   THREADS=...     torch's threads in every process the tests start (default 2, OMP_NUM_THREADS). Left
#                   to torch, each process takes every core: the first check ran 14 workers' processes
#                   of 16 threads each on 16 cores, and its tiers took about 4 x longer a test than on
#                   2 cores. 2 is what CI's 2-core machine gives them, and what they are known to pass with
#   WHEELS=...      the wheelhouse (default .gpu/wheels; for another Python: PY_VERSION in gpu_bundle.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=${PYTHON:-python3}
out=$(mkdir -p "${1:-${OUT:-.gpu/out}}" && cd "${1:-${OUT:-.gpu/out}}" && pwd)
report=$out/gpu_check.md
log=$out/gpu_check.log
wheels=${WHEELS:-.gpu/wheels}
site=$root/.gpu/site
tiers=${TIERS:-tests/unit tests/loop tests/dist tests/cli}
gpu_tests=${GPU_TESTS:-tests/gpu}
limit=${LIMIT:-270}
parts=" ${PARTS:-gpu tiers first bench} "
cores=$(nproc)
workers=${WORKERS:-$(( cores / 2 > 8 ? 8 : (cores / 2 > 0 ? cores / 2 : 1) ))}
threads=${THREADS:-2}
started=$SECONDS
: >"$log"
rm -f "$out/gpu.xml" "$out/default.xml" "$log.gpu" "$log.default"  # nothing of an earlier check read as this one's

say() { echo "$*" | tee -a "$report"; }
step() {  # step NAME LIMIT_S COMMAND...: run, log, and record the outcome and the time
    local name=$1 limit=$2 begun=$SECONDS rc
    shift 2
    echo "=== $name: $*" >>"$log"
    timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
    rc=$?
    local how="passed"
    (( rc == 124 || rc == 137 )) && how="timed out after ${limit} s"
    (( rc != 0 && rc != 124 && rc != 137 )) && how="failed (exit $rc)"
    say "| $name | $how | $((SECONDS - begun)) s |"
    return $rc
}

: >"$report"
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
export WANDB_SILENT=true WANDB_DISABLE_GIT=true
export PYTHONUNBUFFERED=1  # a step stopped at its limit leaves what it printed in the log
export BSEXP_DATA=$root/.gpu/data  # MNIST-1D, generated once here for the benchmarks

"$py" - >>"$report" 2>>"$log" <<'PY'
import platform

import hydra, mnist1d, omegaconf, torch

try:
    import wandb
    logger = f"wandb {wandb.__version__}"
except Exception as exc:  # the default tiers' W&B tests then fail, and say why
    logger = f"wandb does not import ({type(exc).__name__}: {exc})"
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    gpu = f"{torch.cuda.device_count()} x {props.name} ({props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}"
else:
    gpu = "no CUDA device: the CUDA tests skip, the benchmarks run on the CPU"
print(f"- GPU: {gpu}")
print(f"- Python {platform.python_version()}, torch {torch.__version__}, hydra {hydra.__version__}, "
      f"omegaconf {omegaconf.__version__}, {logger}")
PY
say ""
say "| check | outcome | time |"
say "| --- | --- | --- |"

# 1 and 2 at once, each into a log of its own (merged below): every CUDA path as a user runs it (one
# GPU shared by a few workers), and the default tiers with the GPU present. -v puts each test's
# outcome in the log as it finishes, so a step stopped at its limit still says what passed.
# test_install builds a wheel, which needs the registry for its build backend: not here.
if [[ $parts == *" gpu "* ]]; then
    BSEXP_TEST_GPU=1 OMP_NUM_THREADS=$threads log=$log.gpu step "tests/gpu (BSEXP_TEST_GPU=1)" "$limit" "$py" -m pytest -m cuda $gpu_tests \
        -n "$workers" -v -p no:cacheprovider -o addopts="" -ra --junitxml="$out/gpu.xml" &
fi
if [[ $parts == *" tiers "* ]]; then
    OMP_NUM_THREADS=$threads log=$log.default step "default tiers, GPU present ($tiers)" "$limit" "$py" -m pytest $tiers -n "$workers" -v \
        --dist worksteal -m "not slow" -p no:cacheprovider -o addopts="" -ra --deselect tests/cli/test_install.py \
        --junitxml="$out/default.xml" &
fi
wait
cat "$log.gpu" "$log.default" >>"$log" 2>/dev/null
rm -f "$log.gpu" "$log.default"
device=$("$py" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
# 3. The users' first command, on the device at hand: samples/s from its summary.json.
runs=$root/.gpu/runs
rm -rf "$runs"
for speed in auto reproducible compiled; do  # compiled: the fast path with torch.compile
    [[ $parts == *" first "* ]] || break
    args=("trainer.speed=$speed")
    [[ $speed == compiled ]] && args=(trainer.speed=fast trainer.compile_mode=default)
    step "python -m bsexp.train device=$device ${args[*]}" 45 "$py" -m bsexp.train "device=$device" \
        logger=none trainer.progress=false "${args[@]}" "hydra.run.dir=$runs/$speed"
done
# 4. The benchmarks: bsexp's reproducible and fast paths against a best-practice hand loop, on
#    ResNet-18 (bf16, batch 512) and the default run; on a CPU the default run only (minutes else).
if [[ $parts != *" bench "* ]]; then
    :
elif [[ $device == cuda ]]; then
    step "bench_gpu: resnet18 bf16 512, default run (cuda)" 120 "$py" scripts/bench_gpu.py --steps 30 --warmup 10
else
    step "bench_gpu: default run (cpu)" 140 "$py" scripts/bench_gpu.py --steps 20 --warmup 5 --cases mnist1d
fi

# Each test's outcome, and the benchmarks' figures, from what the steps wrote.
"$py" - "$out" "$log" "$runs" >>"$report" 2>>"$log" <<'PY'
import re
import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

out, log = Path(sys.argv[1]), Path(sys.argv[2]).read_text(errors="replace")
for name, title, prefix in (("gpu.xml", "tests/gpu", "tests/gpu/"), ("default.xml", "default tiers", "tests/(?!gpu/)")):
    path = out / name
    if not path.exists():  # stopped at its limit: what -v wrote as each test finished
        done = re.findall(rf"(PASSED|FAILED|SKIPPED|ERROR) ({prefix}\S+)", log)
        if not done:
            print(f"\n## {title}: not run")
            continue
        print(f"\n## {title}: the step did not finish; finished before it stopped: "
              + ", ".join(f"{n} {o.lower()}" for o, n in Counter(o for o, _ in done).items()) + "\n")
        print("\n".join(f"- {o.lower()}: {t}" for o, t in done if o in ("FAILED", "ERROR") or title == "tests/gpu"))
        continue
    cases = ET.parse(path).getroot().iter("testcase")
    rows, counts, skipped = [], {"passed": 0, "failed": 0, "skipped": 0}, {}
    for case in cases:
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        outcome = "failed" if bad is not None else "skipped" if case.find("skipped") is not None else "passed"
        counts[outcome] += 1
        if outcome == "skipped":
            why = " ".join((case.find("skipped").get("message") or "").split())
            skipped[why] = skipped.get(why, 0) + 1
        elif title == "tests/gpu" or outcome == "failed":
            why = (bad.get("message") or "")[:300] if bad is not None else ""
            rows.append(f"| {case.get('name')} | {outcome} | {float(case.get('time', 0)):.1f} s | "
                        f"{' '.join(why.split()).replace('|', '/')} |")
    print(f"\n## {title}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped\n")
    if rows:
        print("| test | outcome | time | message |\n| --- | --- | --- | --- |")
        print("\n".join(rows))
    for why, n in skipped.items():
        print(f"\n{n} skipped: {why}")
print("\n## The users' first command (python -m bsexp.train, logger=none)\n")
print("| run | status | samples/s | train time | test acc | compiled graphs |\n| --- | --- | --- | --- | --- | --- |")
for speed in ("auto", "reproducible", "compiled"):
    path = Path(sys.argv[3]) / speed / "summary.json"
    if not path.exists():
        print(f"| {speed} | no summary.json | | | | |")
        continue
    s = json.loads(path.read_text())
    rate, acc = s.get("samples_per_s"), s.get("test_acc")
    print(f"| {speed} | {s['status']} | {'-' if rate is None else f'{rate:,.0f}'} | {s['train_time_s']:.1f} s | "
          f"{'-' if acc is None else f'{acc:.3f}'} | {s.get('compiled_graphs')} |")
print("\n## Benchmarks (scripts/bench_gpu.py, as it printed them)\n")
bench = log[log.rfind("=== bench_gpu") :] if "=== bench_gpu" in log else ""
lines = [line for line in bench.splitlines() if line.startswith("|") or re.search(r"^goal|torch .*timed steps", line)]
print("\n".join(lines[-20:]) or "(none printed)")
PY
say ""
say "total: $((SECONDS - started)) s"
