#!/usr/bin/env python
"""The mutation check: plausible one-line bugs put into a copy of the checkout, one at a time, each
against the tests that should catch it. Run by hand before a release (docs: Development), not in CI.

    python scripts/mutate.py                    # every mutant; exit 1 if any survived
    python scripts/mutate.py --list             # the mutants and their tests, nothing run
    python scripts/mutate.py --only sqrt-lr-rule --only bias-correction

For each mutant, in a copy of the working tree (git's tracked and untracked files, not the ignored
ones: the checkout itself is never written): its module, named by dotted name and found where the
copy's Python imports it from, must hold the original text exactly once, on one line; it is
replaced, the mutant's tests run (pytest, one process, the configured `-m 'not slow'` and `-n`
dropped, so a slow test listed runs), and the file is put back. A mutant is killed when a listed
test fails; it survives when they all pass. First every test selection runs once on the unchanged
copy and must pass (else a failure proves nothing), and must select at least one test.

A module moved to a folder keeps its text: update the dotted name here (an unknown one fails
before anything runs, naming modules of the same last name). Output: a table of the mutants, with
what happened to each and the seconds it took.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 900  # one pytest run; a mutant that hangs its tests past this is reported as killed (timeout)


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str  # dotted name, resolved to a file in the copy
    original: str  # text on one line of the module, found exactly once
    replacement: str
    tests: tuple[tuple[str, str], ...]  # (test file, pytest -k expression; "" for the whole file)
    why: str = ""


def tests(*pairs: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(pairs)


TRAINING = "tests/loop/test_training.py"
NOISE_UNIT = "tests/unit/test_noise_estimates.py"
NOISE_LOOP = "tests/loop/test_noise.py"
DIST = "tests/dist/test_distributed.py"
RESUME = "tests/cli/test_resume.py"

MUTANTS = [
    # The large-batch rules (bsexp.batch.scaling).
    Mutant(
        "sqrt-lr-rule",
        "bsexp.batch.scaling",
        "return math.sqrt(k)",
        "return k",
        tests(("tests/unit/test_scaling.py", "")),
        "the sqrt rule scales linearly",
    ),
    Mutant(
        "linear-lr-rule",
        "bsexp.batch.scaling",
        'if rule == "linear":',
        'if rule == "linear" and False:',
        tests(("tests/unit/test_scaling.py", "")),
        "the linear rule falls through to sqrt",
    ),
    Mutant(
        "sqrt-weight-decay",
        "bsexp.batch.scaling",
        "return base_wd * rule_multiplier(rule, k)",
        "return base_wd",
        tests(("tests/unit/test_scaling.py", "")),
        "weight decay not scaled with the batch",
    ),
    Mutant(
        "warmup-start",
        "bsexp.batch.scaling",
        "return min(1.0, 1.0 / rule_multiplier(rule, k))",
        "return 1.0",
        tests(("tests/unit/test_scaling.py", "")),
        "the warmup starts at the scaled LR, not the reference batch's",
    ),
    # The gradient noise estimator (bsexp.engine.gradient_noise).
    Mutant(
        "noise-trace-estimate",
        "bsexp.engine.gradient_noise",
        "trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)",
        "trace = (small_sq - big_sq) / (1.0 / b_small)",
        tests((NOISE_UNIT, "")),
        "tr(Σ) without the large batch's term",
    ),
    Mutant(
        "noise-finite-population",
        "bsexp.engine.gradient_noise",
        "grad_sq = grad_sq + trace / population",
        "grad_sq = grad_sq",
        # tests/loop/test_noise.py -k drawing_without_replacement catches it too, in minutes.
        tests((NOISE_UNIT, "drawn_without_replacement")),
        "no finite-population correction of |G|²",
    ),
    Mutant(
        "noise-bias-correction",
        "bsexp.engine.gradient_noise",
        "correction = 1 - self.decay**count",
        "correction = 1.0",
        tests((NOISE_UNIT, "bias_corrected")),
        "the moving averages without their bias correction",
    ),
    Mutant(
        "noise-raw-window",
        "bsexp.engine.gradient_noise",
        "self._recent = [0.0, 0.0, 0]",
        "pass",
        tests((NOISE_UNIT, "own_window")),
        "the raw window never reset after a record",
    ),
    Mutant(
        "noise-micro-rescale",
        "bsexp.engine.gradient_noise",
        "grad_sq(step.model, step.scaler) * (step_samples / micro_samples) ** 2",
        "grad_sq(step.model, step.scaler) * (step_samples / micro_samples)",
        tests((NOISE_LOOP, "accumulation_measures_the_exact")),
        "the first micro-batch's gradient not rescaled to its own mean",
    ),
    # Accumulation and clipping (bsexp.engine.step), evaluation (bsexp.engine.evaluate).
    Mutant(
        "accumulation-normalisation",
        "bsexp.engine.step",
        'loss = F.cross_entropy(logits, ym, reduction="sum") / step_samples',
        "loss = F.cross_entropy(logits, ym)",
        tests((TRAINING, "micro_8_times_4 or smaller_last_step")),
        "each micro-batch's mean loss, not its share of the step's",
    ),
    Mutant(
        "clip-before-unscale",
        "bsexp.engine.step",
        "step.scaler.unscale_(step.optimizer)",
        "pass",
        tests((TRAINING, "fp16_clips")),
        "the gradient clipped while still multiplied by the loss scale",
    ),
    Mutant(
        "best-val-acc",
        "bsexp.engine.evaluate",
        "state.best_val_acc = max(state.best_val_acc, val_acc)",
        "state.best_val_acc = val_acc",
        tests((TRAINING, "best_val_acc")),
        "best_val_acc is the last val_acc",
    ),
    # The DDP reduction (bsexp.engine.distributed, bsexp.engine.evaluate).
    Mutant(
        "ddp-hook-sum",
        "bsexp.engine.distributed",
        "return work.get_future().then(lambda fut: fut.value()[0])",
        "return work.get_future().then(lambda fut: fut.value()[0] / dist.get_world_size())",
        tests((DIST, "two_ranks_equal_one_process_and_evaluate_identically")),
        "the communication hook averages the gradients over ranks (each already divided by the global batch)",
    ),
    Mutant(
        "ddp-bucket-sum",
        "bsexp.engine.distributed",
        "            work.wait()",
        "            work.wait(); [b.div_(world.size) for b in self.buffers]",
        tests((DIST, "two_ranks_equal_one_process_and_evaluate_identically")),
        "bsexp's buckets average the gradients over ranks",
    ),
    Mutant(
        "ddp-bucket-overlap",
        "bsexp.engine.distributed",
        "while self._next < len(self.buffers) and self._pending[self._next] == 0:",
        "while False:",
        tests(("tests/dist/test_grad_buckets.py", "during_the_backward")),
        "bsexp's buckets are all-reduced only after the backward",
    ),
    Mutant(
        "eval-buffer-sync",
        "bsexp.engine.evaluate",
        "world.sync_buffers(net)",
        "pass",
        tests((DIST, "batchnorm_per_rank")),
        "each rank evaluates with its own BatchNorm statistics",
    ),
    # Resume (bsexp.runs.checkpoint).
    Mutant(
        "resume-rng",
        "bsexp.runs.checkpoint",
        'set_rng_state(mine["rng"])',
        "pass",
        tests((RESUME, "bit_identically and fixed")),
        "the random generators not restored",
    ),
    Mutant(
        "resume-optimizer",
        "bsexp.runs.checkpoint",
        'step.optimizer.load_state_dict(saved["optimizer"])',
        "pass",
        tests((RESUME, "bit_identically and fixed")),
        "the optimizer's state (momentum) not restored",
    ),
    Mutant(
        "resume-running-sums",
        "bsexp.runs.checkpoint",
        'state.loss_sum, state.correct, state.running_samples = mine["running"]',
        "pass",
        tests((RESUME, "bit_identically and fixed")),
        "the epoch's running training loss not restored",
    ),
    # The report's fit of the critical batch (bsexp.report.analysis.fit).
    Mutant(
        "fit-weights",
        "bsexp.report.analysis.fit",
        "w = [1 / s**2 for s, _ in points]",
        "w = [1.0 for s, _ in points]",
        tests(("tests/unit/test_report_analysis.py", "")),
        "least squares on the absolute residual of S, not the relative one",
    ),
    Mutant(
        "fit-b-crit",
        "bsexp.report.analysis.fit",
        "return None if self.refused else self.e_min / self.s_min",
        "return None if self.refused else self.e_min / self.s_min / 2",
        tests(("tests/unit/test_report_analysis.py", "")),
        "B_crit read off the fit wrongly",
    ),
]


# ---------------------------------------------------------------------------------------------- the copy


def copy_checkout(dest: Path) -> None:
    """The working tree as git sees it (tracked and untracked files, not ignored ones) into `dest`."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (entry.decode() for entry in listed)):
        source, target = ROOT / name, dest / name
        if not source.exists() and not source.is_symlink():  # deleted in the working tree
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            os.symlink(os.readlink(source), target)
        elif source.is_file():
            shutil.copy2(source, target)


def resolve(copy: Path, modules: list[str]) -> dict[str, Path]:
    """Each dotted name's file, where Python imports it from in the copy (importlib's find_spec)."""
    code = (
        "import importlib.util, sys\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        spec = importlib.util.find_spec(name)\n"
        "    except ImportError:\n"
        "        spec = None\n"
        "    print(spec.origin if spec is not None and spec.origin else '')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *modules], cwd=copy, env=run_env(copy), capture_output=True, text=True, check=True
    )
    found, missing = {}, []
    for name, origin in zip(modules, out.stdout.splitlines()):
        path = Path(origin) if origin else None
        if path is None or not path.resolve().is_relative_to(copy.resolve()):
            missing.append(name)
        else:
            found[name] = path
    if missing:
        lines = [f"{name}: no such module in the checkout{_same_leaf(copy, name)}" for name in missing]
        raise SystemExit("error: " + "\nerror: ".join(lines))
    return found


def _same_leaf(copy: Path, name: str) -> str:
    leaf = name.rsplit(".", 1)[-1]
    paths = [*copy.glob(f"bsexp/**/{leaf}.py"), *copy.glob(f"bsexp/**/{leaf}/__init__.py")]
    names = sorted(".".join(p.relative_to(copy).with_suffix("").parts).removesuffix(".__init__") for p in paths)
    return f" (moved? modules named {leaf}: {', '.join(names)})" if names else ""


def mutated(text: str, mutant: Mutant, path: Path) -> str:
    """`text` with the mutant's one line changed; an error unless the original is there exactly
    once and on one line."""
    if "\n" in mutant.original or "\n" in mutant.replacement:
        raise SystemExit(f"error: mutant {mutant.name}: its original and replacement must each be one line")
    count = text.count(mutant.original)
    if count != 1:
        raise SystemExit(
            f"error: mutant {mutant.name}: {mutant.original!r} is in {path} {count} times, not once: update the listing"
        )
    return text.replace(mutant.original, mutant.replacement)


# ---------------------------------------------------------------------------------------------- running


def run_env(copy: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(copy), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    # No bytecode caches: a mutant and the original written within one second, with one size,
    # would otherwise share a stale .pyc.
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@dataclass
class Outcome:
    code: int  # pytest's exit code; -1 for a timeout
    seconds: float
    tail: str


def run_tests(copy: Path, test_file: str, expression: str) -> Outcome:
    # addopts cleared: one process (no -n) and no `-m 'not slow'`, so a slow test listed runs.
    cmd = [sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", "-q", "-x", "-rf", test_file]
    if expression:
        cmd += ["-k", expression]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=copy,
        env=run_env(copy),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the tests' own workers too (their session)
        out, _ = proc.communicate()
        code = -1
    return Outcome(code, time.monotonic() - start, out[-3000:])


def selection(test_file: str, expression: str) -> str:
    return f"{test_file} -k '{expression}'" if expression else test_file


def baseline(copy: Path, mutants: list[Mutant]) -> None:
    """Every selection passes on the unchanged copy and selects something, or nothing is run."""
    for test_file, expression in dict.fromkeys(pair for m in mutants for pair in m.tests):
        outcome = run_tests(copy, test_file, expression)
        print(
            f"baseline  {selection(test_file, expression):<75} {outcome.seconds:7.1f} s  exit {outcome.code}",
            flush=True,
        )
        if outcome.code != 0:
            what = "selects no test" if outcome.code == 5 else "does not pass without a mutant"
            raise SystemExit(f"error: {selection(test_file, expression)} {what}:\n{outcome.tail}")


def _failure(outcome: Outcome) -> str:
    """What failed: pytest's first FAILED line (-rf), shortened, to show it was the assert meant."""
    if outcome.code == -1:
        return f"timed out after {TIMEOUT_S} s"
    return next((line[:300] for line in outcome.tail.splitlines() if line.startswith("FAILED ")), "")


def check_mutant(copy: Path, path: Path, mutant: Mutant) -> tuple[str, float, str, str]:
    """(killed | survived | error, seconds, the selection that killed it, what failed or went wrong)."""
    original = path.read_text()
    path.write_text(mutated(original, mutant, path))
    seconds = 0.0
    try:
        for test_file, expression in mutant.tests:
            outcome = run_tests(copy, test_file, expression)
            seconds += outcome.seconds
            if outcome.code in (1, -1):  # a test failed (or hung past the timeout)
                return "killed", seconds, selection(test_file, expression), _failure(outcome)
            if outcome.code != 0:  # collection or usage errors prove nothing about the mutant
                return (
                    "error",
                    seconds,
                    selection(test_file, expression),
                    f"pytest exit {outcome.code}:\n{outcome.tail}",
                )
        return "survived", seconds, "", ""
    finally:
        path.write_text(original)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print the mutants and their tests, run nothing")
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="this mutant only (repeatable)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run of the tests without a mutant")
    parser.add_argument("--keep", action="store_true", help="keep the copy of the checkout (its path is printed)")
    args = parser.parse_args(argv)

    names = [m.name for m in MUTANTS]
    assert len(set(names)) == len(names), "mutant names must be distinct"
    unknown = sorted(set(args.only) - set(names))
    if unknown:
        parser.error(f"--only {', '.join(unknown)}: no such mutant; valid: {', '.join(names)}")
    mutants = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.name:<28} {m.module:<28} {m.why}")
            print(f"{'':<28} - {m.original}\n{'':<28} + {m.replacement}")
            for pair in m.tests:
                print(f"{'':<28} tests: {selection(*pair)}")
        return 0

    copy, began = Path(tempfile.mkdtemp(prefix="bsexp-mutate-")), time.monotonic()
    try:
        copy_checkout(copy)
        files = resolve(copy, sorted({m.module for m in mutants}))
        for m in mutants:  # every listing checked before anything runs
            mutated(files[m.module].read_text(), m, files[m.module])
        print(f"{len(mutants)} mutants in a copy of {ROOT} at {copy}", flush=True)
        if not args.no_baseline:
            baseline(copy, mutants)
        results = []
        for m in mutants:
            status, seconds, where, detail = check_mutant(copy, files[m.module], m)
            results.append((m, status, seconds, where))
            print(f"{status:<9} {m.name:<28} {seconds:7.1f} s  {where}", flush=True)
            if detail:
                print(f"          {detail}", flush=True)
    finally:
        if args.keep:
            print(f"the copy: {copy}")
        else:
            shutil.rmtree(copy, ignore_errors=True)

    print()
    print(f"| {'mutant':<28} | {'module':<27} | {'result':<8} | {'seconds':>7} | killed by |")
    print(f"| {'-' * 28} | {'-' * 27} | {'-' * 8} | {'-' * 7} | --- |")
    for m, status, seconds, where in results:
        print(
            f"| {m.name:<28} | {m.module:<27} | {status:<8} | {seconds:7.1f} | {where if status == 'killed' else ''} |"
        )
    killed = sum(status == "killed" for _, status, _, _ in results)
    survived = [m.name for m, status, _, _ in results if status == "survived"]
    errors = [m.name for m, status, _, _ in results if status == "error"]
    minutes = (time.monotonic() - began) / 60
    print(f"\n{killed} of {len(results)} killed" + (f"; survived: {', '.join(survived)}" if survived else ""), end="")
    print(f" ({minutes:.1f} minutes in all)")
    if errors:
        print(f"errors (no verdict): {', '.join(errors)}")
    return 1 if survived or errors else 0


if __name__ == "__main__":
    sys.exit(main())
