"""Overhead of bsexp's training step against a plain hand-written PyTorch loop.

What is measured
    The same model (a deep copy of the initial weights for each side), the same optimizer
    settings, the same in-memory training tensors and the same per-epoch batch order are
    trained two ways, interleaved in one process:

    bsexp  `loop.feed.steps(epoch, sizes)` and `bsexp.engine.step.train_step(loop.step, x, y,
           samples, plan)` per optimizer step, with `loop` built by `bsexp.train.loop.build_loop` from the
           real Hydra config. Includes bsexp's batch_control (the epoch's seeded shuffle, the step
           spans, one index gather per step), its micro-batch split and loss normalisation, the detached
           loss and correct count it returns, the GradScaler calls (pass-through in fp32) and
           the LR written for the step (bsexp.engine.optim.Hyperparameters).
    plain  What a person writes by hand: a seeded `torch.randperm` per epoch, `x[idx], y[idx]`
           per batch, then `opt.zero_grad(); loss = F.cross_entropy(model(x), y);
           loss.backward(); opt.step(); sched.step()`, with an optimizer of the same class and
           param-group settings as bsexp's and a `LambdaLR` on the same schedule. Where the
           config asks for more (batch=accumulation, uint8 images, augmentation, clipping,
           bf16/fp16) it does the same arithmetic by hand, so both sides always do the same work
           (checked: after the first round the two models must agree).

    Neither side includes evaluation, logging or progress bars: this is the cost of the step.

How it is timed
    Each round is one epoch per side. Within a round the two sides take turns step by step
    (bsexp, plain, bsexp, plain, ...; the side that starts alternates between rounds), each
    step timed with `time.perf_counter` and summed per side. So a change in the machine's load
    (other processes on a shared CPU) hits both sides alike instead of whole epochs of one of
    them, and every step runs in the same surroundings: right after a step of the other side.
    Python's garbage collector is off during a round (as in `timeit`) and run between rounds.
    After untimed warm-up rounds, the headline is the median over rounds of the per-round ratio
    bsexp/plain; the goal is <= 1.05 on the CPU. bsexp's extra cost is a roughly fixed amount
    per step, so the ratio grows as the step shrinks (small models, small batches). The exit
    code is 0 whatever the ratio: this is a measurement, not a test.

How to run (from the repository root, so the MNIST-1D cache in ./data is reused, or with
$BSEXP_DATA set)::

    python scripts/bench_overhead.py                           # mnist1d, cnn1d, batch 128
    python scripts/bench_overhead.py model=mlp batch.size=256  # any Hydra overrides
    python scripts/bench_overhead.py --rounds 40 batch=accumulation batch.micro_size=32

The whole run (issue 54), `--whole`
    `python -m bsexp.train logger=none` (the default run: start-up, Hydra, set-up, 20 epochs with
    an evaluation and a checkpoint after each, the test split, the summary) against
    `scripts/plain_run.py`, the same work written by hand, as whole processes: `--pairs` pairs,
    the two taking turns (the one that starts alternating between pairs), each timed from its
    start to its end (wall) and by the CPU time it used (user + system, which a busy machine
    inflates less). Printed: each pair, the medians, and the median of the per-pair ratios with
    its 95 % interval (the pairs drawn with replacement); then where the difference lies: the
    median ratio of the training loops alone (summary.json's train_time_s), the median difference
    of the wall time outside them, and with `--together` the wall ratio for each core bsexp had.
    The goal is <= 1.05: met where that interval's upper end is at most 1.05, not met where its
    lower end is above (at main 3ea6d43: 1.12, 9.5 s against 8.0 s). bsexp registers in a registry
    of the benchmark's own (BSEXP_CORES_REGISTRY), so both take torch's default threads (or
    `--threads N`, both). Hydra overrides are refused with `--whole`: plain_run.py does the
    default run only::

    python scripts/bench_overhead.py --whole --pairs 5
    python scripts/bench_overhead.py --whole --pairs 5 --threads 1    # a busy machine: no spinning

    `--together` starts the two of a pair at the same moment, each pinned to a core of its own at
    one thread (the cores swapped from one pair to the next), so that a drift of the machine's speed
    from minute to minute hits both sides of a pair alike. On the development machine it did not
    narrow the pairs' spread, which is each process's own (docs/results/performance.md). It
    measures the default run at one thread, not at torch's default threads::

    python scripts/bench_overhead.py --whole --together --pairs 20
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import inspect
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from tqdm import tqdm

from bsexp.config.schema import register_configs
from bsexp.engine.feed import TensorBatches, augment_batch, augment_seed, epoch_order
from bsexp.engine.step import train_step
from bsexp.errors import exit_on_config_error
from bsexp.report.compare.intervals import over_seeds
from bsexp.runs.sweep import register_resolvers
from bsexp.system.runtime import DTYPES
from bsexp.train.loop import Loop, build_loop

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "bsexp" / "conf"
GOAL = 1.05
DEFAULTS = ["logger=none", "trainer.progress=false", "data=mnist1d", "model=cnn1d", "batch.size=128"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="Hydra overrides follow the options.")
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds, one epoch per side each (30)")
    parser.add_argument("--warmup-rounds", type=int, default=1, help="untimed rounds first (1)")
    parser.add_argument(
        "--whole", action="store_true", help="whole processes: bsexp's default run against plain_run.py"
    )
    parser.add_argument("--pairs", type=int, default=5, help="--whole: pairs of processes (5)")
    parser.add_argument("--threads", type=int, default=None, help="--whole: the threads of both (torch's default)")
    parser.add_argument(
        "--together", action="store_true", help="--whole: the two of a pair at once, a core and a thread each"
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=mlp batch.size=256")
    args = parser.parse_args()
    if args.rounds < 1 or args.warmup_rounds < 0:
        parser.error("--rounds must be >= 1 and --warmup-rounds >= 0")
    if args.whole and args.overrides:
        parser.error(
            f"--whole times the default run against scripts/plain_run.py, which takes no overrides; "
            f"got {' '.join(args.overrides)}"
        )
    if args.together:
        if len(os.sched_getaffinity(0)) < 2:
            parser.error(f"--together needs 2 cores; this process may use {len(os.sched_getaffinity(0))}")
        if args.threads not in (None, 1):
            parser.error(f"--together runs each side at one thread on its own core, not --threads {args.threads}")
        args.threads = 1
    return args


def build(overrides: list[str], epochs: int) -> tuple[Loop, str]:
    """bsexp's loop from the real config, and the config's precision. `epochs` makes the LR
    schedule span the benchmark (an `epochs=` override wins)."""
    register_configs()
    register_resolvers()
    with exit_on_config_error():
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("config", overrides=[*DEFAULTS, f"epochs={epochs}", *overrides])
        loop = build_loop(cfg)
    if not isinstance(loop.feed, TensorBatches):
        sys.exit("error: this benchmark needs in-memory data (the plain loop indexes tensors); set data.in_memory=true")
    return loop, str(cfg.precision)


def bsexp_steps(loop: Loop, epoch: int) -> Iterator[None]:
    """One epoch of bsexp's own steps, pausing after each (the same `yield` as `Plain.steps`)."""
    run = loop.batch_control.layout.run
    steps = loop.feed.steps(epoch, run.epoch(epoch % len(run.epoch_starts)), drop_last=loop.drop_last)
    first = epoch * len(run.epoch(0))  # the run's step count, as the loop's LR writer counts it
    for index, (x, y, samples) in enumerate(steps):
        loop.hyperparameters.apply(first + index, loop.batch_control.layout)  # as the loop writes each step's LR
        train_step(loop.step, x, y, samples, loop.batch_control.plan(index))
        yield


class Plain:
    """The hand-written baseline: its own model copy, optimizer, scheduler and batch_control."""

    def __init__(self, loop: Loop, precision: str) -> None:
        self.model = copy.deepcopy(loop.step.model)  # before any step: the same initial weights
        # The same optimizer class and param groups (lr, momentum, weight decay, ... per group).
        params = list(self.model.parameters())
        index = {id(p): i for i, p in enumerate(loop.step.model.parameters())}
        groups = [
            {
                **{k: v for k, v in group.items() if k != "params"},
                "params": [params[index[id(p)]] for p in group["params"]],
                "lr": lr,  # the scaled LR the schedule multiplies
            }
            for group, lr in zip(loop.step.optimizer.param_groups, loop.hyperparameters.lrs)
        ]
        cls = type(loop.step.optimizer)  # its defaults too: some (timm's Lamb) read them in `step`
        accepted = inspect.signature(cls).parameters
        self.opt = cls(groups, **{k: v for k, v in loop.step.optimizer.defaults.items() if k in accepted})
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, loop.hyperparameters.factors)
        split = loop.feed.split
        self.x, self.y, self.mean, self.std = split.x, split.y, split.mean, split.std
        self.seed, self.augment, self.fill = loop.feed.seed, loop.feed.augment, split.black
        self.size, self.micro, self.drop_last = (
            loop.batch_control.current.size,
            loop.batch_control.current.micro_size,
            loop.drop_last,
        )
        self.clip = loop.step.clip_grad_norm
        dtype, device_type = DTYPES.get(precision), self.x.device.type
        self.autocast = (lambda: torch.autocast(device_type, dtype=dtype)) if dtype else contextlib.nullcontext
        self.scaler = torch.amp.GradScaler(device_type) if precision == "fp16" else None
        self.simple = dtype is None and self.clip is None and loop.batch_control.current.accum_steps == 1

    def steps(self, epoch: int) -> Iterator[None]:
        model, opt, sched, x_all, y_all = self.model, self.opt, self.sched, self.x, self.y
        n = len(y_all)
        # bsexp's seeded shuffle, so that both sides see the same batches.
        perm = epoch_order(n, self.seed, epoch).to(x_all.device)
        generator = torch.Generator(device=x_all.device)
        for index, start in enumerate(range(0, n, self.size)):
            idx = perm[start : start + self.size]
            if self.drop_last and len(idx) < self.size:
                return
            x, y = x_all[idx], y_all[idx]
            if self.mean is not None:  # uint8 images
                x = (x.float() / 255.0 - self.mean) / self.std
            if self.augment is not None:  # crops and flips drawn like bsexp's, for the same batches
                generator.manual_seed(augment_seed(self.seed, epoch, 0) * 1_000_003 + index)
                x = augment_batch(x, self.augment, generator, self.fill)
            if self.simple:
                # The default case: fp32, one micro-batch per step, no clipping.
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
            else:  # accumulation, bf16/fp16 or clipping: the same arithmetic as bsexp's
                scaler = self.scaler
                opt.zero_grad()
                for xm, ym in zip(x.split(self.micro), y.split(self.micro)):
                    with self.autocast():
                        loss = F.cross_entropy(model(xm), ym, reduction="sum") / len(y)
                    (scaler.scale(loss) if scaler else loss).backward()
                if self.clip is not None:
                    if scaler:
                        scaler.unscale_(opt)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), self.clip)
                if scaler:
                    scaler.step(opt)
                    scaler.update()
                else:
                    opt.step()
            sched.step()
            yield


def max_param_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    pairs = zip(a.state_dict().values(), b.state_dict().values())
    return max(float((p - q).abs().max()) for p, q in pairs if p.is_floating_point())


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one whole process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{out.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def together(
    commands: dict[str, list[str]], env: dict[str, str], cores: dict[str, int]
) -> dict[str, tuple[float, float]]:
    """Wall and CPU seconds (user + system) of whole processes started at once, each pinned to its core."""
    with tempfile.TemporaryDirectory() as logs:
        started = time.perf_counter()
        running = {}
        for side, command in commands.items():
            with open(Path(logs) / side, "w") as log:
                process = subprocess.Popen(
                    command,
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    preexec_fn=lambda core=cores[side]: os.sched_setaffinity(0, {core}),
                )
            running[process.pid] = side
        times = {}
        while running:
            pid, status, usage = os.wait4(-1, 0)
            side = running.pop(pid)
            if os.waitstatus_to_exitcode(status) != 0:
                sys.exit(f"{' '.join(commands[side])} failed:\n{(Path(logs) / side).read_text()[-2000:]}")
            times[side] = (time.perf_counter() - started, usage.ru_utime + usage.ru_stime)
    return times


def whole(args: argparse.Namespace) -> None:
    """bsexp's default run against the same work written by hand, as whole processes in turns or together."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "BSEXP_CORES_REGISTRY": str(Path(tmp) / "registry")}
        threads = [] if args.threads is None else [f"trainer.threads={args.threads}"]
        sides = {
            "bsexp": lambda n: [
                sys.executable,
                "-m",
                "bsexp.train",
                "logger=none",
                *threads,
                f"hydra.run.dir={tmp}/bsexp-{n}",
            ],
            "plain": lambda n: [
                sys.executable,
                str(ROOT / "scripts" / "plain_run.py"),
                f"{tmp}/plain-{n}",
                *([] if args.threads is None else ["--threads", str(args.threads)]),
            ],
        }
        timed(sides["bsexp"](-1), env)  # untimed: the data cached, the page cache warm for both
        runs: dict[str, list[tuple[float, float]]] = {"bsexp": [], "plain": []}
        trained: list[tuple[float, float]] = []  # each pair's training seconds (summary.json): bsexp, plain
        bsexp_core: list[int] = []  # with --together, the core bsexp's run of each pair had
        if args.together:
            first, second = sorted(os.sched_getaffinity(0))[:2]
            print(f"{args.pairs} pairs of whole processes, the two of a pair at once on cores {first} and {second}")
        else:
            print(f"{args.pairs} pairs of whole processes, taking turns; threads: {args.threads or 'torch default'}")
        for n in range(args.pairs):
            if args.together:
                cores = {"bsexp": first, "plain": second} if n % 2 == 0 else {"bsexp": second, "plain": first}
                pair = together({side: sides[side](n) for side in sides}, env, cores)
                for side in sides:
                    runs[side].append(pair[side])
            else:
                for side in ("bsexp", "plain") if n % 2 == 0 else ("plain", "bsexp"):
                    runs[side].append(timed(sides[side](n), env))
            (bw, bc), (pw, pc) = runs["bsexp"][-1], runs["plain"][-1]
            train = tuple(
                json.loads((Path(tmp) / f"{side}-{n}" / "summary.json").read_text())["train_time_s"] for side in sides
            )
            trained.append(train)
            if args.together:
                bsexp_core.append(cores["bsexp"])
            print(
                f"pair {n + 1}: bsexp {bw:.2f} s ({bc:.2f} s CPU, {train[0]:.2f} s training), plain {pw:.2f} s "
                f"({pc:.2f} s CPU, {train[1]:.2f} s training): {bw / pw:.3f} wall, {bc / pc:.3f} CPU",
                flush=True,
            )
    wall = np.array([x[0] / y[0] for x, y in zip(runs["bsexp"], runs["plain"])])
    cpu = np.array([x[1] / y[1] for x, y in zip(runs["bsexp"], runs["plain"])])
    for what, i, ratios in (("wall", 0, wall), ("CPU", 1, cpu)):
        b, p = (statistics.median(r[i] for r in runs[side]) for side in ("bsexp", "plain"))
        found = median_interval(ratios)
        verdict = (
            "goal not shown either way"
            if found is None or found[0] <= GOAL < found[1]
            else ("goal met" if found[1] <= GOAL else "goal NOT met")
        )
        print(
            f"median {what}: bsexp {b:.2f} s, plain {p:.2f} s; median ratio {float(np.median(ratios)):.3f} "
            f"{shown(found)} (goal <= {GOAL}: met where the interval's upper end is) - {verdict}"
        )
    # where the difference lies: the training loop (summary.json's train_time_s) or the rest of the process
    training = np.array([b / p for b, p in trained])
    outside = np.array([(x[0] - b) - (y[0] - p) for x, y, (b, p) in zip(runs["bsexp"], runs["plain"], trained)])
    print(
        f"median training ratio (summary.json's train_time_s): {float(np.median(training)):.3f} "
        f"{shown(median_interval(training))}"
    )
    print(
        f"median wall outside training, bsexp minus plain: {float(np.median(outside)):+.2f} s "
        f"{shown(median_interval(outside), signed=True)}"
    )
    for core in sorted(set(bsexp_core)):
        on = wall[np.array(bsexp_core) == core]
        print(
            f"median wall ratio with bsexp on core {core} ({len(on)} pairs): {float(np.median(on)):.3f} "
            f"{shown(median_interval(on))}"
        )


def median_interval(values: np.ndarray) -> tuple[float, float] | None:
    """95 % interval of the median, the pairs drawn with replacement by the comparison report's bootstrap.

    None under 3 pairs, where that bootstrap gives none.
    """
    intervals, _ = over_seeds(len(values), lambda drawn: [np.median(values[drawn])], ["median"])
    found = intervals["median"]
    return None if found is None else (found.low, found.high)


def shown(found: tuple[float, float] | None, signed: bool = False) -> str:
    """An interval from median_interval as printed: seconds signed to 2 places, ratios to 3."""
    if found is None:
        return "(no interval under 3 pairs)"
    return f"[{found[0]:+.2f}, {found[1]:+.2f}]" if signed else f"[{found[0]:.3f}, {found[1]:.3f}]"


def main() -> None:
    args = parse_args()
    if args.whole:
        whole(args)
        return
    loop, precision = build(args.overrides, args.warmup_rounds + args.rounds)
    plain = Plain(loop, precision)
    loop.step.model.train()
    plain.model.train()
    sync = torch.cuda.synchronize if loop.world.device.type == "cuda" else (lambda: None)
    n, plan = len(loop.feed), loop.batch_control.current
    per_epoch = len(loop.batch_control.layout.run.epoch(0))

    def round_times(epoch: int) -> tuple[float, float]:
        """One epoch per side, step by step in strict turns (so every step of either side runs
        right after a step of the other), the side that starts alternating between rounds
        (the first step after a pause runs on cold caches); the summed step times per side."""
        sides = [bsexp_steps(loop, epoch), plain.steps(epoch)]
        spent = [0.0, 0.0]
        turns = (0, 1) if epoch % 2 == 0 else (1, 0)
        gc.collect()
        gc.disable()
        try:
            for _ in range(per_epoch):
                for side in turns:
                    started = time.perf_counter()
                    next(sides[side])
                    sync()
                    spent[side] += time.perf_counter() - started
        finally:
            gc.enable()
        if any(next(it, StopIteration) is not StopIteration for it in sides):
            raise RuntimeError(f"a side did not end after {per_epoch} steps")
        return spent[0], spent[1]

    print(
        f"data {loop.splits.name}: {n} train samples; model {type(loop.step.model).__name__} "
        f"({sum(p.numel() for p in loop.step.model.parameters()):,} parameters); batch {plan.size} = "
        f"micro {plan.micro_size} x accum {plan.accum_steps}; {per_epoch} steps per epoch; "
        f"{type(loop.step.optimizer).__name__}; {precision}; device {loop.world.device}; "
        f"{torch.get_num_threads()} threads"
    )
    print(
        f"{args.warmup_rounds} warm-up + {args.rounds} timed rounds of one epoch per side, "
        f"the sides taking turns step by step",
        flush=True,
    )

    times: list[tuple[float, float]] = []
    diff = None
    for r in tqdm(range(args.warmup_rounds + args.rounds), desc="rounds", unit="round", dynamic_ncols=True):
        measured = round_times(epoch=r)
        if diff is None:
            # Same weights, batches and settings: the models must agree up to float rounding
            # (checked early: over many epochs rounding differences grow chaotically).
            diff = max_param_diff(loop.step.model, plain.model)
        if r >= args.warmup_rounds:
            times.append(measured)

    print(f"\n{'round':>5}  {'bsexp s':>8}  {'plain s':>8}  {'ratio':>6}")
    for i, (b, p) in enumerate(times, start=1):
        print(f"{i:>5}  {b:8.3f}  {p:8.3f}  {b / p:6.3f}")
    bsexp_s, plain_s = [t[0] for t in times], [t[1] for t in times]
    for side, ts in (("bsexp", bsexp_s), ("plain", plain_s)):
        med = statistics.median(ts)
        print(f"median {side}: {med:.3f} s per epoch ({n / med:,.0f} samples/s)")
    ratios = sorted(b / p for b, p in times)
    ratio = statistics.median(ratios)
    quart = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratio, ratio, ratio]
    print(
        f"per-round ratios: quartiles {quart[0]:.3f} / {quart[1]:.3f} / {quart[2]:.3f}, "
        f"min {ratios[0]:.3f}, max {ratios[-1]:.3f}; "
        f"ratio of medians {statistics.median(bsexp_s) / statistics.median(plain_s):.3f}; "
        f"ratio of totals {sum(bsexp_s) / sum(plain_s):.3f}"
    )
    print(
        f"largest parameter difference after the first epoch: {diff:.2e}"
        + ("  WARNING: the two sides did not do the same work" if diff > 1e-3 else "")
    )
    if max(plain_s) > 1.5 * min(plain_s):
        print(
            f"note: epoch times varied {max(plain_s) / min(plain_s):.1f}x between rounds: the "
            f"machine was busy; the turn-taking keeps the ratio fair but noisier"
        )
    verdict = "goal met" if ratio <= GOAL else "goal NOT met"
    print(f"ratio bsexp/plain: {ratio:.3f} (goal <= {GOAL}) - {verdict}")


if __name__ == "__main__":
    main()
