"""The finder's search: trials agreed over the ranks, a strategy choosing sizes
(bsexp.finder.search), the margin, and the plan that follows (the found size x the ranks, or a
kept global batch in micro-batches of it)."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace

import torch
from omegaconf import DictConfig

from bsexp.batch.plan import MIN_MICRO, BatchPlan, make_plan
from bsexp.engine.datasets import Splits
from bsexp.engine.distributed import World
from bsexp.engine.feed import train_feed
from bsexp.errors import ConfigError
from bsexp.finder.cache import cache_key, cache_load, cache_store
from bsexp.finder.probe import ChildProber, InProcessProber
from bsexp.finder.result import FinderResult, Trial, memory_breakdown, peak_line
from bsexp.finder.search import Attempt, Searcher, largest_divisor_at_most, measured_edge, throughput_choice
from bsexp.system import memory
from bsexp.system.runtime import preserved_rng

log = logging.getLogger(__name__)
# batch.finder.margin=null: below an edge the trials measured (its headroom holds the kernels the
# run adds: 1 % for a busier process and a long run), and below the largest pass where they
# measured none (5 %, the margin before issue 54, on CUDA and across ranks).
EDGE_MARGIN = 0.01
PASS_MARGIN = 0.05


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
    bound = _search_bound(cfg, world, len(splits.train), keep_size, largest)
    key = cache_key(cfg, world, splits, keep_size, largest)
    cached = cache_load(cfg, key)
    if cached is not None:
        result = _cached_result(cfg, world, cached, limit=limit, keep_size=keep_size, bound=bound)
        log.info("finder: micro-batch %d from the cache (%s)", result.micro_size, node.cache_dir)
        return result
    result = _searched_result(cfg, world, splits, model, limit=limit, keep_size=keep_size, bound=bound)
    _note_slow_loader(result)
    if world.is_main:
        cache_store(cfg, key, result)
    return result


def _search_bound(
    cfg: DictConfig, world: World, n_train: int, keep_size: int | None, largest: int | None
) -> tuple[int, str]:
    """The largest micro-batch per rank the search may try, memory aside, and what sets it: the
    smallest of the training set per rank, batch.finder.max_size, a kept global batch per rank,
    the largest scheduled batch per rank, and batch.finder.data_fraction of the training set
    (where the finder chooses the batch itself)."""
    node = cfg.batch.finder
    bounds = {"the training set per rank": n_train // world.size}
    if node.max_size:
        bounds["batch.finder.max_size"] = node.max_size
    if keep_size is not None:
        bounds["batch.size per rank (kept)"] = keep_size // world.size
    if largest is not None:
        bounds["the largest scheduled batch per rank"] = largest
    if keep_size is None and largest is None and node.data_fraction is not None:
        bounds[f"batch.finder.data_fraction={node.data_fraction:g} of {n_train:,} training samples"] = max(
            MIN_MICRO, math.floor(node.data_fraction * n_train / world.size)
        )
    bound_by, max_size = min(bounds.items(), key=lambda item: item[1])
    return max_size, bound_by


def _cached_result(
    cfg: DictConfig, world: World, cached: dict, *, limit: int, keep_size: int | None, bound: tuple[int, str]
) -> FinderResult:
    """The answer stored for the same question (bsexp.finder.cache), as a result: its trials and
    micro-batch, the plan made again for this run, and where the memory went."""
    result = _result(
        cfg,
        world,
        trials=[Trial(**t) for t in cached["trials"]],
        micro=cached["micro_size"],
        limit=limit,
        budget_mb=cached["budget_mb"],
        keep_size=keep_size,
        cached=True,
        bound=bound,
    )
    result.memory = cached.get("memory", {})  # a JSON file's contents (entries cached before there was one)
    result.edge, result.headroom_mb = cached.get("edge"), cached.get("headroom_mb", 0.0)
    result.margin = cached.get("margin", result.margin)
    return result


def _searched_result(
    cfg: DictConfig,
    world: World,
    splits: Splits,
    model: torch.nn.Module,
    *,
    limit: int,
    keep_size: int | None,
    bound: tuple[int, str],
) -> FinderResult:
    """A new answer, the run's random state left as it was: trials in a prober (a capped child
    process on CPU, this process on CUDA), the search agreed over the ranks, the evaluation
    checked, the size chosen, then what the trials measured besides (memory, start-up, the
    activation checkpointing trade) and the input pipeline's own rate."""
    node = cfg.batch.finder
    started = time.perf_counter()
    with preserved_rng():
        prober = (
            InProcessProber(cfg, splits, model, world, limit)
            if world.device.type == "cuda"
            else ChildProber(cfg, splits, limit, world.distributed)
        )
        try:
            budget = _agreed_budget(world, prober)  # bytes above the model, data and optimizer state
            trials: dict[int, Trial] = {}  # by size, in the order first tried
            searcher = _agreed_searcher(world, prober, trials, node.max_trials, int(bound[0]))
            best = _search(node, searcher, budget)
            if best is None:
                raise _nothing_fits(node, trials, limit, budget)
            evaluation = _evaluation(cfg, world, prober, limit, best)
            headroom = _headroom(cfg, splits, prober)
            edge = measured_edge(searcher.budget.attempts.values(), headroom)
            margin = _margin(node, edge is not None)
            per_rank = None if keep_size is None else keep_size // world.size
            chosen = _choice(node, searcher, best, edge or best, margin, per_rank)
            checkpointed = bool(cfg.model.get("activation_checkpointing", False))  # a user's node may lack it
            if checkpointed:
                plain_comparison = _compare_plain(world, prober, list(trials.values()), best, budget)
            # The answer is at or below a size that passed: not tried again (it could only pass).
        finally:
            prober.close()
        result = _result(
            cfg,
            world,
            trials=list(trials.values()),
            micro=chosen,
            limit=limit,
            budget_mb=budget / memory.MIB,
            keep_size=keep_size,
            cached=False,
            bound=bound,
        )
        result.seconds = time.perf_counter() - started
        result.edge, result.margin, result.headroom_mb = edge, margin, headroom / memory.MIB
        result.memory = memory_breakdown({**prober.model_memory, **evaluation}, result.trials)
        result.startup = prober.startup
        if checkpointed:
            result.checkpointing = plain_comparison
        result.loader_samples_per_s = _loader_rate(splits, cfg, result.plan, world)
    return result


def _agreed_budget(world: World, prober) -> float:
    """Bytes a trial may use above the model, data and optimizer state: the smallest budget of
    any rank (a max of negatives), so that a size that fits fits on every rank."""
    return -world.all_reduce(torch.tensor([-float(prober.budget_bytes)], device=world.device), op="max").item()


def _agreed_searcher(world: World, prober, trials: dict[int, Trial], max_trials: int, max_size: int) -> Searcher:
    """A search whose trials run in `prober` and are agreed over the ranks (_agree: every rank
    then sees the same results and chooses the same sizes), each logged and kept in `trials` by
    size (a size probed, then tried in full: the full trial)."""

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

    return Searcher(attempt, max_trials, max_size, probe=lambda size: attempt(size, probe=True))


def _search(node: DictConfig, searcher: Searcher, budget: float) -> int | None:
    """The largest micro-batch that fit, by batch.finder.mode's strategy (bsexp.finder.search),
    from batch.finder.init; None where even that did not."""
    strategies = {
        "power": lambda: searcher.power(node.init),
        "binsearch": lambda: searcher.binsearch(node.init),
        "fit": lambda: searcher.fit(node.init, budget),
    }
    return strategies[str(node.mode)]()


def _nothing_fits(node: DictConfig, trials: dict[int, Trial], limit: int, budget: float) -> ConfigError:
    """The error where not even the smallest size tried fits: the limit, the budget and where the
    step ran out of memory, and what would make room."""
    seen = trials[min(trials)]
    return ConfigError(
        "batch.finder.init",
        node.init,
        f"even {min(trials)} samples do not fit in {limit / memory.GIB:.2f} GB "
        f"({budget / memory.MIB:,.0f} MB above the model, data and optimizer state; out of "
        f"memory in {seen.failed_in}); try precision=bf16, a smaller model or "
        f"trainer.eval_batch_size, or batch=accumulation with a small batch.micro_size",
    )


def _evaluation(cfg: DictConfig, world: World, prober, limit: int, best: int) -> dict:
    """Whether the evaluation pass fits beside the model (checked now only where no trial as large
    passed), raising where it does not on any rank: a training step that fits is no use where the
    run's evaluation would then run out of memory."""
    evaluation = prober.evaluation()
    if world.all_reduce(torch.tensor([float(not evaluation["eval_fits"])], device=world.device), op="max").item():
        raise ConfigError(
            "trainer.eval_batch_size",
            cfg.trainer.eval_batch_size,
            f"the evaluation pass ({evaluation['eval_size']:,} samples a batch) does not fit in "
            f"{limit / memory.GIB:.2f} GB beside the model and its optimizer state, though "
            f"training steps of {best:,} samples do; lower trainer.eval_batch_size",
        )
    return evaluation


def _headroom(cfg: DictConfig, splits: Splits, prober) -> float:
    """Bytes the answer leaves below the room the trials measured, for the shapes the run meets and
    they do not run: the kernels oneDNN compiles for each, as large as the probe measured for the
    training shape and the evaluation shape it ran (CPU; none where it measured none: CUDA, matrix
    products). An epoch's short last batch (unless batch.drop_last) is one more training shape;
    every evaluation batch size of the splits besides the one measured (the test split, a short
    last batch) one more evaluation shape."""
    measured = prober.model_memory
    short_batch = 0 if cfg.batch.drop_last else 1
    size = cfg.trainer.eval_batch_size
    lengths = [len(s) for s in (splits.train_eval, splits.val, splits.test) if s is not None and len(s)]
    shapes = {b for n in lengths for b in (size if n >= size else 0, n % size) if b}
    ran = min(size, max(len(splits.val), len(splits.train_eval)))  # bsexp.finder.trial.TrialData.eval_size
    return float(
        short_batch * measured.get("kernel_cache_train_bytes", 0)
        + len(shapes - {ran}) * measured.get("kernel_cache_eval_bytes", 0)
    )


def _margin(node: DictConfig, edge_measured: bool) -> float:
    """batch.finder.margin, or where it is null, from what the trials measured: EDGE_MARGIN below
    a measured edge (the kernels are in its headroom already; this is for a busier process and a
    long run's fragmentation), PASS_MARGIN below the largest pass where no edge was measured."""
    if node.margin is not None:
        return float(node.margin)
    return EDGE_MARGIN if edge_measured else PASS_MARGIN


def _choice(node: DictConfig, searcher: Searcher, best: int, edge: int, margin: float, per_rank: int | None) -> int:
    """The micro-batch per rank the run trains at: `margin` below `edge`, where the memory runs
    out as the trials measured it (search.measured_edge; `best` where they measured none), never
    above `best`, the largest that fit (the margin is memory's: where the data or max_size bound
    the search far below the edge, `best` itself); with objective=throughput, no larger
    than the smallest size within batch.finder.throughput_tolerance of the fastest, timed on a
    ladder of sizes; where a global batch is kept (`per_rank` of it), the largest divisor of that
    below."""
    chosen = max(MIN_MICRO, min(best, math.floor(edge * (1 - margin))))
    if str(node.objective) == "throughput":
        size = min(node.init, best)
        while size < best:  # a ladder of sizes, each timed, up to the largest that fits
            searcher.attempt(size)
            size *= 2
        fastest = throughput_choice(list(searcher.budget.attempts.values()), node.throughput_tolerance)
        chosen = min(chosen, fastest or chosen)
    if per_rank is not None:  # keep the global batch: a micro-batch that divides it
        chosen = largest_divisor_at_most(per_rank, chosen)
    return chosen


def _note_slow_loader(result: FinderResult) -> None:
    """Where the input pipeline cannot feed the training step as fast as it runs, say so in the
    result's note: data loading, not memory, then bounds the run."""
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
    *,
    trials: list[Trial],
    micro: int,
    limit: int,
    budget_mb: float,
    keep_size: int | None,
    cached: bool,
    bound: tuple[int, str],
) -> FinderResult:
    """The result of a search or of the cache: the micro-batch `micro` (per rank) as a plan (a
    kept global batch in micro-batches of it, else `micro` x the ranks), with the speed measured
    near it and the note on the objective; `limit` in bytes, `bound` the search's largest size
    per rank and what set it."""
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
        margin=node.margin if node.margin is not None else PASS_MARGIN,
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
    batches = train_feed(splits, cfg.seed, world.device)
    count, started = 0, time.perf_counter()
    sizes = [plan.size] * -(-len(batches) // plan.size)
    for _, y, _ in batches.steps(0, sizes, world.rank, world.size, cfg.batch.drop_last):
        count += len(y)
        if time.perf_counter() - started > seconds:
            break
    elapsed = time.perf_counter() - started
    return count * world.size / elapsed if count and elapsed > 0 else None
