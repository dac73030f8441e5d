"""The finder's search: trials agreed over the ranks, a strategy choosing sizes (bsexp.batch.
finder.search), the margin, and the plan that follows (the found size x the ranks, or a kept
global batch in micro-batches of it)."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace

import torch
from omegaconf import DictConfig

from bsexp import memory
from bsexp.batch.plan import MIN_MICRO, BatchPlan, make_plan
from bsexp.data import Splits, train_batches
from bsexp.distributed import World
from bsexp.errors import ConfigError
from bsexp.finder.cache import cache_key, cache_load, cache_store
from bsexp.finder.probe import ChildProber, InProcessProber
from bsexp.finder.result import FinderResult, Trial, memory_breakdown, peak_line
from bsexp.finder.search import Attempt, Searcher, largest_divisor_at_most, throughput_choice
from bsexp.runtime import preserved_rng

log = logging.getLogger(__name__)


def memory_limit(cfg: DictConfig, device: torch.device) -> int:
    """Bytes the finder may plan for: `batch.finder.memory_limit_gb`, else the device's memory
    (CUDA) or what the machine has available (CPU)."""
    if cfg.batch.finder.memory_limit_gb is not None:
        return int(cfg.batch.finder.memory_limit_gb * memory.GIB)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return memory.held() + memory.available_memory()


def find_plan(
    cfg: DictConfig,
    world: World,
    splits: Splits,
    model: torch.nn.Module,
    limit_bytes: int | None = None,
    keep_size: int | None = None,
    largest: int | None = None,
) -> FinderResult:
    """Search, agree over the ranks, and turn the chosen micro-batch into a plan: for
    `keep_size` (a global batch kept through accumulation), else the found size x ranks.
    `largest` caps the micro-batches tried (besides batch.finder.max_size and the data)."""
    node = cfg.batch.finder
    limit = limit_bytes if limit_bytes is not None else memory_limit(cfg, world.device)
    per_rank = None if keep_size is None else keep_size // world.size
    n_train = len(splits.train)
    bounds = {"the training set per rank": n_train // world.size}
    if node.max_size:
        bounds["batch.finder.max_size"] = node.max_size
    if per_rank is not None:
        bounds["batch.size per rank (kept)"] = per_rank
    if largest is not None:
        bounds["the largest scheduled batch per rank"] = largest
    if keep_size is None and largest is None and node.data_fraction is not None:
        bounds[f"batch.finder.data_fraction={node.data_fraction:g} of {n_train:,} training samples"] = max(
            MIN_MICRO, math.floor(node.data_fraction * n_train / world.size)
        )
    bound_by, max_size = min(bounds.items(), key=lambda item: item[1])
    key = cache_key(cfg, world, splits, keep_size, largest)
    cached = cache_load(cfg, key)
    if cached is not None:
        trials = [Trial(**t) for t in cached["trials"]]
        result = _result(
            cfg, world, trials, cached["micro_size"], limit, cached["budget_mb"], keep_size, True, (max_size, bound_by)
        )
        result.memory = cached.get("memory", {})  # a JSON file's contents (entries cached before there was one)
        log.info("finder: micro-batch %d from the cache (%s)", result.micro_size, node.cache_dir)
        return result
    started = time.perf_counter()
    with preserved_rng():
        prober = (
            InProcessProber(cfg, splits, model, world, limit)
            if world.device.type == "cuda"
            else ChildProber(cfg, splits, limit, world.distributed)
        )
        try:
            # The smallest budget of any rank (a max of negatives).
            budget = -world.all_reduce(
                torch.tensor([-float(prober.budget_bytes)], device=world.device), op="max"
            ).item()
            trials: dict[int, Trial] = {}

            def attempt(size: int, probe: bool = False) -> Attempt:
                trial = _agree(world, prober.attempt(size, probe=probe))
                trials[size] = trial  # a size probed, then tried in full: the full trial
                log.info(
                    "finder: micro-batch %d %s%s",
                    size,
                    "fits" if trial.ok else f"does not fit ({trial.failed_in})",
                    " (probe: one step)" if probe else "",
                )
                return trial.attempt()

            searcher = Searcher(attempt, node.max_trials, int(max_size), probe=lambda size: attempt(size, probe=True))
            best = {
                "power": lambda: searcher.power(node.init),
                "binsearch": lambda: searcher.binsearch(node.init),
                "fit": lambda: searcher.fit(node.init, budget),
            }[str(node.mode)]()
            if best is None:
                seen = trials[min(trials)]
                raise ConfigError(
                    "batch.finder.init",
                    node.init,
                    f"even {min(trials)} samples do not fit in {limit / memory.GIB:.2f} GB "
                    f"({budget / memory.MIB:,.0f} MB above the model, data and optimizer state; out of "
                    f"memory in {seen.failed_in}); try precision=bf16, a smaller model or "
                    f"trainer.eval_batch_size, or batch=accumulation with a small batch.micro_size",
                )
            evaluation = prober.evaluation()  # checked now only where no trial as large passed
            if world.all_reduce(
                torch.tensor([float(not evaluation["eval_fits"])], device=world.device), op="max"
            ).item():
                raise ConfigError(
                    "trainer.eval_batch_size",
                    cfg.trainer.eval_batch_size,
                    f"the evaluation pass ({evaluation['eval_size']:,} samples a batch) does not fit in "
                    f"{limit / memory.GIB:.2f} GB beside the model and its optimizer state, though "
                    f"training steps of {best:,} samples do; lower trainer.eval_batch_size",
                )
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
            checkpointed = bool(cfg.model.get("activation_checkpointing", False))  # a user's node may lack it
            if checkpointed:
                plain_comparison = _compare_plain(world, prober, list(trials.values()), best, budget)
            # The answer lies at or below a size that passed, and memory grows with the size: it is
            # not tried again (a confirmation cost a large trial and could only pass).
        finally:
            prober.close()
        result = _result(
            cfg,
            world,
            list(trials.values()),
            chosen,
            limit,
            budget / memory.MIB,
            keep_size,
            False,
            (max_size, bound_by),
        )
        result.seconds = time.perf_counter() - started
        result.memory = memory_breakdown({**prober.model_memory, **evaluation}, result.trials)
        result.startup = prober.startup
        if checkpointed:
            result.checkpointing = plain_comparison
        result.loader_samples_per_s = _loader_rate(splits, cfg, result.plan, world)
    if (
        result.loader_samples_per_s
        and result.step_samples_per_s
        and result.loader_samples_per_s < result.step_samples_per_s
    ):
        result.note += (
            f" The input pipeline ({result.loader_samples_per_s:,.0f} samples/s) is slower than the "
            f"training step ({result.step_samples_per_s:,.0f} samples/s): data loading, not memory, "
            f"bounds this run."
        )
    if world.is_main:
        cache_store(cfg, key, result)
    return result


def _compare_plain(world: World, prober, trials: list[Trial], best: int, budget: float) -> dict:
    """Activation checkpointing's trade, measured: a trial without it at the largest size that
    passed at most half of `best` (the plain step likely fits there) and one with it right after:
    the seconds per sample, and the memory per sample, whence about how large a micro-batch
    would fit without it."""
    ok = sorted((t for t in trials if t.ok and t.size <= best / 2 and t.samples_per_s), key=lambda t: t.size)
    if not ok:
        return {}
    plain = _agree(world, prober.attempt(ok[-1].size, plain=True))
    same = _agree(world, prober.attempt(ok[-1].size))  # timed again beside it: the machine as busy
    out = {"checkpointing_compared_at": same.size, "checkpointing_found": best, "plain_fits_there": plain.ok}
    if not (plain.ok and plain.samples_per_s and same.samples_per_s and plain.growing_peak_mb is not None):
        return out
    line = peak_line(trials)
    at_zero = line[1] if line is not None else 0.0  # what the checkpointed step holds at no samples
    plain_per_sample = (plain.growing_peak_mb - at_zero) / same.size
    out.update(
        slowdown_per_sample=plain.samples_per_s / same.samples_per_s,
        plain_per_sample_mb=plain_per_sample,
        plain_size_estimate=int((budget / memory.MIB - at_zero) / plain_per_sample) if plain_per_sample > 0 else None,
    )
    return out


def _agree(world: World, trial: Trial) -> Trial:
    """A trial passes only if it passed on every rank; memory is the largest any rank needed,
    speed the slowest rank's (times the ranks: the global rate)."""
    if not world.distributed:
        return trial
    values = torch.tensor(
        [
            float(not trial.ok),
            trial.peak_mb or 0.0,
            trial.reserved_mb or 0.0,
            -(trial.samples_per_s or 0.0),
            trial.seconds,
        ],
        dtype=torch.float64,
        device=world.device,
    )
    failed, peak, reserved, neg_rate, seconds = world.all_reduce(values, op="max").tolist()
    phases = ["", "train", "killed"]
    code = world.all_reduce(torch.tensor([float(phases.index(trial.failed_in or ""))], device=world.device), op="max")
    rate = -neg_rate * world.size if not failed else None
    failed_in = (phases[int(code.item())] or None) if failed else None
    train_peak = world.all_reduce(
        torch.tensor([trial.train_peak_mb or 0.0], dtype=torch.float64, device=world.device), op="max"
    ).item()
    backward_peak = world.all_reduce(
        torch.tensor([trial.backward_peak_mb or 0.0], dtype=torch.float64, device=world.device), op="max"
    ).item()
    return replace(
        trial,
        ok=not failed,
        failed_in=failed_in,
        peak_mb=peak,
        reserved_mb=reserved,
        seconds=seconds,
        samples_per_s=rate,
        train_peak_mb=train_peak or None,
        mapped_peak_mb=None,
        room_mb=None,
        backward_peak_mb=backward_peak or None,
    )
    # (Each rank's address space is its own: the search, which must choose the same sizes on every
    # rank, then fits the agreed resident peaks.)


def _result(
    cfg: DictConfig,
    world: World,
    trials: list[Trial],
    micro: int,
    limit: int,
    budget_mb: float,
    keep_size: int | None,
    cached: bool,
    bound: tuple[int, str],
) -> FinderResult:
    node = cfg.batch.finder
    plan = (
        make_plan(micro * world.size, world.size)
        if keep_size is None
        else make_plan(keep_size, world.size, micro_size=micro)
    )
    # The speed of the nearest size that passed at or above the chosen one (it is rarely tried itself).
    chosen = min((t for t in trials if t.ok and t.size >= micro), key=lambda t: t.size, default=None)
    note = ""
    if str(node.objective) == "throughput":
        note = (
            f"Throughput objective: the smallest size within {100 * node.throughput_tolerance:.0f} % of the "
            f"best measured samples/s, not the largest that fits."
        )
    return FinderResult(
        mode=str(node.mode),
        objective=str(node.objective),
        limit_gb=limit / memory.GIB,
        margin=node.margin,
        budget_mb=budget_mb,
        trials=trials,
        micro_size=micro,
        plan=plan,
        note=note,
        step_samples_per_s=chosen.samples_per_s if chosen else None,
        cached=cached,
        world_size=world.size,
        max_size=bound[0],
        max_size_by=bound[1],
    )


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
