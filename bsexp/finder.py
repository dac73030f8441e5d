"""`batch=finder`: the largest micro-batch whose real training step and evaluation fit in memory.

A trial runs `steps_per_trial` real training steps (forward, backward, optimizer step, with the
configured precision, SyncBatchNorm and DDP wrapper) at one micro-batch size and an evaluation
forward at `trainer.eval_batch_size`, on a cached real batch tiled to the size (never the
training loader, so a slow loader cannot pass for a memory limit; its own throughput is
measured apart). Only out-of-memory errors count as failures; anything else propagates.

On CPU the trials run in a child process whose address space is capped at
`memory_limit_gb x (1 - margin)` (RLIMIT_AS), so the failures are real allocator failures and
the training process is never at risk; on CUDA they run in this process on copies of the model,
under a per-process memory fraction. Either way the run's model, optimizer, scheduler and every
random generator are as they were: a run that found size S trains exactly as `batch=fixed` at S.
Under DDP every rank probes and the ranks agree on each trial (a size passes only if it passed
on every rank), so the search, and its answer, are the same everywhere.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import math
import multiprocessing
import os
import random
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from bsexp import memory
from bsexp.batch_schedule import MIN_MICRO
from bsexp.data import Splits, TensorSplit, augment_batch, train_batches
from bsexp.distributed import World
from bsexp.errors import ConfigError
from bsexp.plan import BatchPlan, make_plan
from bsexp.search import Attempt, Searcher, largest_divisor_at_most, throughput_choice

log = logging.getLogger(__name__)

CACHED_BATCH = 256  # real samples kept for probing, tiled to each trial's size


@dataclass
class Trial:
    size: int
    ok: bool
    failed_in: str | None = None  # "train" or "eval" when out of memory
    peak_mb: float | None = None  # above the baseline (model, data, optimizer state), train or eval
    reserved_mb: float | None = None  # CUDA: the allocator's reserve; CPU: address space mapped
    alloc_retries: int | None = None  # CUDA: allocations retried after freeing the cache
    seconds: float = 0.0
    samples_per_s: float | None = None  # of the training steps, after the first
    train_peak_mb: float | None = None  # of the training steps alone: what grows with the size

    def attempt(self) -> Attempt:
        peak = None if self.train_peak_mb is None else self.train_peak_mb * memory.MIB
        return Attempt(self.size, self.ok, peak, self.samples_per_s)


@dataclass
class FinderResult:
    mode: str
    objective: str
    limit_gb: float
    margin: float
    budget_mb: float
    trials: list[Trial]
    micro_size: int  # chosen, per rank
    plan: BatchPlan
    note: str = ""
    loader_samples_per_s: float | None = None
    step_samples_per_s: float | None = None
    cached: bool = False
    world_size: int = 1
    seconds: float = 0.0  # spent probing, start of the probe process included
    noise_b_simple: float | None = None  # objective=noise_scale: the measured gradient noise scale

    def summary(self) -> dict[str, Any]:
        """The short form for summary.json (finder.json holds every trial)."""
        keys = ("mode", "objective", "limit_gb", "margin", "budget_mb", "micro_size", "note",
                "loader_samples_per_s", "step_samples_per_s", "cached", "seconds", "noise_b_simple")
        return {**{k: getattr(self, k) for k in keys}, "trials": len(self.trials),
                "batch_size": self.plan.size, "accum_steps": self.plan.accum_steps}

    def to_json(self) -> dict[str, Any]:
        return {**self.summary(), "plan": asdict(self.plan), "trials": [asdict(t) for t in self.trials]}

    def table(self) -> str:
        lines = [f"finder ({self.mode}, objective {self.objective}, limit {self.limit_gb:.2f} GB, margin "
                 f"{100 * self.margin:.0f} %, budget above baseline {self.budget_mb:,.0f} MB, "
                 f"{self.seconds:.1f} s{', from cache' if self.cached else ''}):",
                 f"  {'size':>6}  {'result':<10}  {'peak MB':>9}  {'reserved MB':>11}  {'retries':>7}  "
                 f"{'seconds':>7}  {'samples/s':>9}"]
        for t in sorted(self.trials, key=lambda t: t.size):
            result = "ok" if t.ok else f"OOM ({t.failed_in})"
            fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
            lines.append(f"  {t.size:>6}  {result:<10}  {fmt(t.peak_mb, '9,.1f')}  {fmt(t.reserved_mb, '11,.1f')}  "
                         f"{fmt(t.alloc_retries, '7d')}  {t.seconds:7.2f}  {fmt(t.samples_per_s, '9,.0f')}")
        lines.append(f"  chosen: micro-batch {self.micro_size} -> batch {self.plan.size} = {self.plan.micro_size} "
                     f"x {self.plan.accum_steps} x {self.plan.world_size}. {self.note}".rstrip())
        return "\n".join(lines)


# ---------------------------------------------------------------------------- trials


class TrialRunner:
    """The model, optimizer and one cached real batch of a run, and the trial at a given size."""

    def __init__(self, cfg: DictConfig, splits: Splits, device: torch.device, model: torch.nn.Module,
                 process_group=None) -> None:
        from bsexp.optim import ScaledHparams, build_optimizer
        from bsexp.runtime import autocast, grad_scaler
        from bsexp.syncbn import convert_sync_batchnorm

        self.cfg, self.device = cfg, device
        self.steps = cfg.batch.finder.steps_per_trial
        self.eval_size = min(cfg.trainer.eval_batch_size, max(len(splits.val), len(splits.train_eval)))
        self.process_group = process_group
        if process_group is not None:  # the same modules as training, in a world of one rank
            sync_bn = cfg.distributed.sync_batchnorm
            if sync_bn or sync_bn is None:
                model = (torch.nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group) if device.type == "cuda"
                         else convert_sync_batchnorm(model, device))
            model = self._wrap(model.to(device))
        self.model = model.to(device)
        hp = ScaledHparams(1.0, cfg.optimizer.lr, cfg.optimizer.lr, cfg.optimizer.weight_decay, 0, 1)
        self.optimizer = build_optimizer(cfg, self.model, hp)
        self.scaler = grad_scaler(device, str(cfg.precision))
        self.autocast = autocast(device, str(cfg.precision))
        self.x, self.y = _cached_batch(splits.train, CACHED_BATCH)
        self.x, self.y = self.x.to(device), self.y.to(device)
        self.augment = splits.augment if isinstance(splits.train, TensorSplit) else None
        self.fill = splits.train.black if self.augment is not None else 0.0
        self.generator = torch.Generator(device=device).manual_seed(0)
        before = memory.rss() if device.type == "cpu" else torch.cuda.memory_allocated(device)
        self._train_step(MIN_MICRO)  # creates the optimizer's state: part of every trial's baseline
        self.optimizer.zero_grad(set_to_none=True)
        after = memory.rss() if device.type == "cpu" else torch.cuda.memory_allocated(device)
        self.state_bytes = max(0, after - before)  # what the run will add before its first step

    def _wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        from bsexp.distributed import GradSync, sum_gradients_hook

        ddp = DistributedDataParallel(module, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                                      process_group=self.process_group)
        ddp.register_comm_hook(GradSync(), sum_gradients_hook)
        return ddp

    def _batch(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.arange(size, device=self.device) % len(self.y)
        x = self.x[idx]
        if self.augment is not None:
            x = augment_batch(x, self.augment, self.generator, self.fill)
        return x, self.y[idx]

    def _train_step(self, size: int) -> None:
        x, y = self._batch(size)
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            loss = F.cross_entropy(self.model(x), y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def run(self, size: int) -> Trial:
        device, phase = self.device, "train"
        memory.release(device)
        base, mapped = self._memory(reset=True), (memory.vm_size() if device.type == "cpu" else 0)
        started = time.perf_counter()
        step_times, train_peak = [], None
        ok = True
        try:
            for _ in range(self.steps):
                t = time.perf_counter()
                self._train_step(size)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                step_times.append(time.perf_counter() - t)
            train_peak = self._peak() - base
            phase = "eval"
            net = getattr(self.model, "module", self.model)
            net.eval()
            with torch.no_grad(), self.autocast():
                net(self._batch(self.eval_size)[0])
        except Exception as exc:
            if not memory.is_oom(exc):
                raise
            ok = False
            if self.process_group is not None:  # DDP's reducer expects the step it never saw end
                self.model = self._wrap(self.model.module)
        finally:
            getattr(self.model, "module", self.model).train()
            self.optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - started
        peak = max(self._peak() - base, train_peak or 0)
        timed = step_times[1:] or step_times
        rate = size / (sum(timed) / len(timed)) if ok and timed else None
        memory.release(device)
        if device.type == "cuda":
            reserved = torch.cuda.memory_reserved(device) / memory.MIB
            retries = torch.cuda.memory_stats(device).get("num_alloc_retries", 0)
        else:  # what stays mapped after the trial: fragmentation
            reserved, retries = (memory.vm_size() - mapped) / memory.MIB, None
        mib = lambda b: None if b is None else b / memory.MIB  # noqa: E731
        return Trial(size, ok, None if ok else phase, mib(peak), reserved, retries, seconds, rate, mib(train_peak))

    def _memory(self, reset: bool) -> int:
        """Bytes in use now (CUDA: allocated; CPU: resident), restarting the peak counter."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return torch.cuda.memory_allocated(self.device)
        memory.reset_peak_rss()
        return memory.rss()

    def _peak(self) -> int:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        return memory.peak_rss()


def _cached_batch(split, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to n real training samples, as the training step receives them (normalised floats)."""
    count = min(n, len(split))
    if isinstance(split, TensorSplit):
        return split.batch(torch.arange(count, device=split.x.device))
    xs, ys = zip(*(split[i] for i in range(count)))
    return torch.stack([torch.as_tensor(x) for x in xs]), torch.as_tensor(ys)


# ---------------------------------------------------------------------------- probers


class ChildProber:
    """Trials in a child process capped at the memory limit (CPU): real allocator failures, and
    the parent's memory, model and random state untouched."""

    def __init__(self, cfg: DictConfig, limit_bytes: int, distributed: bool) -> None:
        # The room the training process itself will have: the limit less what it holds now
        # (not counting memory freed while the data and model were built).
        memory.trim_freed_memory()
        self.args = (cfg, limit_bytes, memory.rss(), distributed, torch.get_num_threads())
        self.context = multiprocessing.get_context("spawn")
        self.budget_bytes = self._start()

    def _start(self) -> int:
        self.conn, child = self.context.Pipe()
        self.process = self.context.Process(target=_child_main, args=(child, *self.args), daemon=True)
        self.process.start()
        child.close()
        return self._receive("ready")

    def _receive(self, expected: str):
        try:
            kind, payload = self.conn.recv()
        except EOFError:
            raise ChildDied(self.process) from None
        if kind == "error":
            raise payload
        assert kind == expected, kind
        return payload

    def attempt(self, size: int) -> Trial:
        self.conn.send(("trial", size))
        try:
            return self._receive("trial")
        except ChildDied as died:  # killed outright: a failure at this size; start afresh
            log.warning("finder: the probe process died at micro-batch %d (%s); restarting it", size, died)
            self.close()
            self._start()
            return Trial(size, False, "killed")

    def close(self) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self.conn.send(("stop", None))
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()


class ChildDied(RuntimeError):
    def __init__(self, process) -> None:
        process.join(timeout=5)
        super().__init__(f"exit code {process.exitcode}")


def _child_main(conn, cfg: DictConfig, limit_bytes: int, parent_rss: int, distributed: bool, threads: int) -> None:
    try:
        import torch.distributed as dist

        from bsexp.run import build_data, build_model
        from bsexp.runtime import seed_everything

        torch.set_num_threads(threads)
        memory.return_freed_memory()
        seed_everything(cfg.seed, cfg.trainer.deterministic)
        splits = build_data(cfg)
        group = None
        if distributed:  # a world of one rank, so DDP and SyncBatchNorm are really there
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            group = dist.group.WORLD
        runner = TrialRunner(cfg, splits, torch.device("cpu"), build_model(cfg, splits), group)
        # Trials get the room the training process will have once it holds its optimizer state
        # too: what the limit leaves beside the parent's memory, not beside this process's.
        budget = limit_bytes - parent_rss - runner.state_bytes
        if budget <= 0:
            raise ConfigError("batch.finder.memory_limit_gb", round(limit_bytes / memory.GIB, 3),
                              str(memory.CapBelowUse(parent_rss + runner.state_bytes, limit_bytes)))
        memory.cap_room(budget)
        conn.send(("ready", budget))
        while True:
            kind, size = conn.recv()
            if kind == "stop":
                break
            conn.send(("trial", runner.run(size)))
    except Exception as exc:  # not an OOM: the parent re-raises it
        with contextlib.suppress(Exception):
            conn.send(("error", _picklable(exc)))
    finally:
        conn.close()


def _picklable(exc: Exception) -> Exception:
    try:
        import pickle

        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError("".join(traceback.format_exception(exc)).strip())


class InProcessProber:
    """Trials in this process (CUDA) on a copy of the model, under a per-process memory fraction."""

    def __init__(self, cfg: DictConfig, splits: Splits, model: torch.nn.Module, world: World, limit_bytes: int) -> None:
        device = world.device
        group = None
        if world.distributed:  # every rank in a group of its own: an OOM on one cannot hang the others
            import torch.distributed as dist

            group, _ = dist.new_subgroups(group_size=1)
        self.fraction_before = None
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit_bytes / total), device)
        self.runner = TrialRunner(cfg, splits, device, copy.deepcopy(model), group)
        self.budget_bytes = limit_bytes - torch.cuda.memory_allocated(device)
        self.device = device

    def attempt(self, size: int) -> Trial:
        return self.runner.run(size)

    def close(self) -> None:
        del self.runner
        memory.release(self.device)
        torch.cuda.set_per_process_memory_fraction(1.0, self.device)


# ---------------------------------------------------------------------------- the search


@contextlib.contextmanager
def preserved_rng():
    """Every random generator (python, numpy, torch, CUDA) as it was, whatever happens inside."""
    state = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
             torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
    try:
        yield
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])
        torch.set_rng_state(state[2])
        if state[3] is not None:
            torch.cuda.set_rng_state_all(state[3])


def memory_limit(cfg: DictConfig, device: torch.device) -> int:
    """Bytes the finder may plan for: `batch.finder.memory_limit_gb`, else the device's memory
    (CUDA) or what the machine has available (CPU)."""
    if cfg.batch.finder.memory_limit_gb is not None:
        return int(cfg.batch.finder.memory_limit_gb * memory.GIB)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return memory.rss() + memory.available_memory()


def find_plan(cfg: DictConfig, world: World, splits: Splits, model: torch.nn.Module,
              limit_bytes: int | None = None, keep_size: int | None = None, largest: int | None = None) -> FinderResult:
    """Search, agree over the ranks, and turn the chosen micro-batch into a plan: for
    `keep_size` (a global batch kept through accumulation), else the found size x ranks.
    `largest` caps the micro-batches tried (besides batch.finder.max_size and the data)."""
    node = cfg.batch.finder
    limit = limit_bytes if limit_bytes is not None else memory_limit(cfg, world.device)
    per_rank = None if keep_size is None else keep_size // world.size
    max_size = min(node.max_size or math.inf, len(splits.train) // world.size, per_rank or math.inf,
                   largest or math.inf)
    key = _cache_key(cfg, world, splits, keep_size, largest)
    cached = _cache_load(cfg, key)
    if cached is not None:
        trials = [Trial(**t) for t in cached["trials"]]
        result = _result(cfg, world, trials, cached["micro_size"], limit, cached["budget_mb"], keep_size, True)
        log.info("finder: micro-batch %d from the cache (%s)", result.micro_size, node.cache_dir)
        return result
    started = time.perf_counter()
    with preserved_rng():
        prober = (InProcessProber(cfg, splits, model, world, limit) if world.device.type == "cuda"
                  else ChildProber(cfg, limit, world.distributed))
        try:
            # The smallest budget of any rank (a max of negatives).
            budget = -world.all_reduce(torch.tensor([-float(prober.budget_bytes)], device=world.device), op="max").item()
            trials: dict[int, Trial] = {}

            def attempt(size: int) -> Attempt:
                trial = _agree(world, prober.attempt(size))
                trials[size] = trial
                log.info("finder: micro-batch %d %s", size, "fits" if trial.ok else f"does not fit ({trial.failed_in})")
                return trial.attempt()

            searcher = Searcher(attempt, node.max_trials, int(max_size))
            best = {"power": lambda: searcher.power(node.init), "binsearch": lambda: searcher.binsearch(node.init),
                    "fit": lambda: searcher.fit(node.init, budget)}[str(node.mode)]()
            if best is None:
                seen = trials[min(trials)]
                raise ConfigError("batch.finder.init", node.init,
                                  f"even {min(trials)} samples do not fit in {limit / memory.GIB:.2f} GB "
                                  f"({budget / memory.MIB:,.0f} MB above the model, data and optimizer state; out of "
                                  f"memory in {seen.failed_in}); try precision=bf16, a smaller model or "
                                  f"trainer.eval_batch_size, or batch=accumulation with a small batch.micro_size")
            # The margin: headroom below the largest size that fit, for what trials cannot show
            # (fragmentation over a long run, a busier process).
            chosen = max(MIN_MICRO, math.floor(best * (1 - node.margin)))
            if str(node.objective) == "throughput":
                size = min(node.init, best)
                while size < best:  # a ladder of sizes, each timed, up to the largest that fits
                    searcher.attempt(size)
                    size *= 2
                fastest = throughput_choice(list(searcher.budget.attempts.values()), node.throughput_tolerance)
                chosen = min(chosen, fastest or chosen)
            if per_rank is not None:  # keep the global batch: a micro-batch that divides it
                chosen = largest_divisor_at_most(per_rank, chosen)
            while not searcher.attempt(chosen, counted=False).ok:  # the answer has always passed a trial
                chosen = (largest_divisor_at_most(per_rank, chosen - 1) if per_rank is not None
                          else math.floor(chosen * (1 - node.margin)))
        finally:
            prober.close()
        result = _result(cfg, world, list(trials.values()), chosen, limit, budget / memory.MIB, keep_size, False)
        result.seconds = time.perf_counter() - started
        result.loader_samples_per_s = _loader_rate(splits, cfg, result.plan, world)
    if result.loader_samples_per_s and result.step_samples_per_s and result.loader_samples_per_s < result.step_samples_per_s:
        result.note += (f" The input pipeline ({result.loader_samples_per_s:,.0f} samples/s) is slower than the "
                        f"training step ({result.step_samples_per_s:,.0f} samples/s): data loading, not memory, "
                        f"bounds this run.")
    if world.is_main:
        _cache_store(cfg, key, result)
    return result


def _agree(world: World, trial: Trial) -> Trial:
    """A trial passes only if it passed on every rank; memory is the largest any rank needed,
    speed the slowest rank's (times the ranks: the global rate)."""
    if not world.distributed:
        return trial
    values = torch.tensor([float(not trial.ok), trial.peak_mb or 0.0, trial.reserved_mb or 0.0,
                           -(trial.samples_per_s or 0.0), trial.seconds], dtype=torch.float64, device=world.device)
    failed, peak, reserved, neg_rate, seconds = world.all_reduce(values, op="max").tolist()
    phases = ["", "train", "eval", "killed"]
    code = world.all_reduce(torch.tensor([float(phases.index(trial.failed_in or ""))], device=world.device), op="max")
    rate = -neg_rate * world.size if not failed else None
    failed_in = (phases[int(code.item())] or None) if failed else None
    train_peak = world.all_reduce(torch.tensor([trial.train_peak_mb or 0.0], dtype=torch.float64,
                                               device=world.device), op="max").item()
    return Trial(trial.size, not failed, failed_in, peak, reserved, trial.alloc_retries, seconds, rate,
                 train_peak or None)


def _result(cfg: DictConfig, world: World, trials: list[Trial], micro: int, limit: int, budget_mb: float,
            keep_size: int | None, cached: bool) -> FinderResult:
    node = cfg.batch.finder
    plan = (make_plan(micro * world.size, world.size) if keep_size is None
            else make_plan(keep_size, world.size, micro_size=micro))
    chosen = next((t for t in trials if t.size == micro), None)
    note = ""
    if str(node.objective) == "throughput":
        note = (f"Throughput objective: the smallest size within {100 * node.throughput_tolerance:.0f} % of the "
                f"best measured samples/s, not the largest that fits.")
    return FinderResult(str(node.mode), str(node.objective), limit / memory.GIB, node.margin, budget_mb,
                        trials, micro, plan, note, step_samples_per_s=chosen.samples_per_s if chosen else None,
                        cached=cached, world_size=world.size)


def _loader_rate(splits: Splits, cfg: DictConfig, plan: BatchPlan, world: World, seconds: float = 1.0) -> float | None:
    """Samples/s the training batches arrive at, with no training: the input pipeline's own rate."""
    batches = train_batches(splits, cfg.seed, world.device)
    count, started = 0, time.perf_counter()
    sizes = [plan.size] * -(-len(batches) // plan.size)
    for _, y, _ in batches.steps(0, sizes, world.rank, world.size, cfg.batch.drop_last):
        count += len(y)
        if time.perf_counter() - started > seconds:
            break
    elapsed = time.perf_counter() - started
    return count * world.size / elapsed if count and elapsed > 0 else None


# ---------------------------------------------------------------------------- cache


def _cache_key(cfg: DictConfig, world: World, splits: Splits, keep_size: int | None, largest: int | None) -> str:
    parts = {
        # The answer depends on the global batch kept (its micro-batch must divide it) and on the
        # largest size asked for, besides what decides the memory.
        "keep_size": keep_size, "largest": largest,
        "model": OmegaConf.to_container(cfg.model, resolve=True, enum_to_str=True),
        "optimizer": OmegaConf.to_container(cfg.optimizer, resolve=True, enum_to_str=True),
        "finder": OmegaConf.to_container(cfg.batch.finder, resolve=True, enum_to_str=True),
        "input_shape": list(splits.input_shape), "classes": splits.num_classes,
        "train": len(splits.train), "precision": str(cfg.precision), "world": world.size,
        # A limit of the machine's own varies with what else runs; the machine identifies it.
        "limit": cfg.batch.finder.memory_limit_gb or f"auto:{memory.total_memory()}",
        "device": torch.cuda.get_device_name(world.device) if world.device.type == "cuda" else "cpu",
        "eval_batch_size": cfg.trainer.eval_batch_size, "sync_batchnorm": cfg.distributed.sync_batchnorm,
    }
    parts["finder"].pop("cache", None)
    parts["finder"].pop("cache_dir", None)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _cache_load(cfg: DictConfig, key: str) -> dict | None:
    path = Path(cfg.batch.finder.cache_dir).expanduser() / f"{key}.json"
    if not cfg.batch.finder.cache or not path.exists():
        return None
    return json.loads(path.read_text())


def _cache_store(cfg: DictConfig, key: str, result: FinderResult) -> None:
    if not cfg.batch.finder.cache:
        return
    path = Path(cfg.batch.finder.cache_dir).expanduser() / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result.to_json(), indent=2))
    os.replace(tmp, path)
