"""Where the finder's trials run. On CPU, in a child process whose address space is capped at
the memory limit (RLIMIT_AS), so failures are real allocator failures and the training process
is never at risk; on CUDA, in this process on a copy of the model under a per-process memory
fraction. Either way the run's model, optimizer and random generators are left as they were."""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
import multiprocessing
import os
import pickle
import sys
import time
import traceback

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from bsexp.engine.build import build_model
from bsexp.engine.datasets import Splits
from bsexp.engine.distributed import World
from bsexp.errors import ConfigError
from bsexp.finder import server
from bsexp.finder.result import Trial
from bsexp.finder.server import CACHE_CAPACITY
from bsexp.finder.trial import TrialData, TrialRunner
from bsexp.system import memory
from bsexp.system.runtime import cap_device_memory, run_speed, seed_everything

log = logging.getLogger(__name__)

# The first training step of the process that measures the kernel cache: the kernels a first
# shape compiles take a little more room at larger sizes (the bench's conv net: 14.6 MB at 2
# samples, 15.4 MB at 32, 16.3 MB at 64 and 16.1 MB at 600; ResNet-18: 0.6 MB more at 32 than
# at 16, none more at 64), and the step grows with it: 32 is that step 0.4 s sooner than 64 on
# ResNet-18 (start-up, which every trial waits for).
KERNEL_SIZE = 32
STRANDED = 0.05  # of the budget, still mapped after a failed trial: restart the probe process


class ChildProber:
    """Trials in a child process capped at the memory limit (CPU): real allocator failures, and
    the parent's memory, model and random state untouched."""

    def __init__(self, cfg: DictConfig, splits: Splits, limit_bytes: int, distributed: bool) -> None:
        # The room the training process itself will have: the limit less what it holds now
        # (not counting memory freed while the data and model were built).
        memory.trim_freed_memory()
        parent_held = memory.held()
        data = TrialData.of(splits, cfg.trainer.eval_batch_size)  # not the whole dataset again
        # The config as this process reads it: its interpolations resolved here, since a child
        # starts without the resolvers this process registered (a comparison's ${bsexp_tuned:...})
        cfg = copy.deepcopy(cfg)
        OmegaConf.resolve(cfg)
        self.args = (cfg, data, limit_bytes, parent_held, distributed, torch.get_num_threads())
        self.context = multiprocessing.get_context("forkserver")
        self.startup: dict[str, float] | None = None  # the first start's, by part
        server.start()  # already running where bsexp.train.preflight or bsexp.train.loop saw a search coming
        # Before the first probe process's first step, one with oneDNN's kernel cache as
        # training has it, to measure what the cache will hold there (the probe's own cache is
        # off). Not beside it: two processes each running torch on every core slow each other
        # down more than running one after the other costs (ResNet-18 on 2 cores: the probe's
        # first step of 2 samples took 0.9 s beside the kernels' step of 64, which took 3.1 s;
        # alone, 0.3 s and 1.3 s).
        self.kernels: dict | None = None
        self._kernels_conn, child = self.context.Pipe()
        self._kernels_process = self.context.Process(
            target=_serve,
            daemon=True,
            args=(
                child,
                _kernel_cache,
                cfg,
                data,
                distributed,
                torch.get_num_threads(),
                os.environ.get(CACHE_CAPACITY),
                limit_bytes - parent_held,
            ),
        )
        with server.own_start_method():
            self._kernels_process.start()
        child.close()
        self._start()

    def _start(self) -> None:
        started = time.perf_counter()
        self.failures: list[Trial] = []  # this probe process's, so far
        server.start()
        self.conn, child = self.context.Pipe()
        self.process = self.context.Process(target=_serve, args=(child, _trials, *self.args), daemon=True)
        with server.own_start_method():
            self.process.start()
        child.close()
        try:
            if self.kernels is None:  # measured while this process starts and builds the model
                try:
                    self.kernels = _received(self._kernels_conn, self._kernels_process, "kernels")
                except ChildDied:  # out of memory before it could say so (a limit with no room)
                    self.kernels = {"state_bytes": None, "eval_bytes": 0}
                self._kernels_process.join(timeout=30)
                self._kernels_conn.close()
                if self.kernels["state_bytes"] is None:
                    log.warning(
                        "finder: the step that measures oneDNN's kernel cache did not fit under the "
                        "limit; the trials' room leaves nothing for the kernels training will keep"
                    )
            with contextlib.suppress(BrokenPipeError, OSError):  # died building the model: said next
                self.conn.send(("go", None))
            startup, self.model_memory = self._receive("ready")
            # Trials get the room training will have beside the kernels its cache keeps: its
            # training shape's (what the first step left mapped there beyond what it left here:
            # a trial's second step runs without them) and the evaluation's.
            train_kernels = max(0, (self.kernels["state_bytes"] or 0) - self.model_memory["first_step_bytes"])
            self.conn.send(("cap", train_kernels + self.kernels["eval_bytes"]))
            self.budget_bytes = self._receive("capped")
        except BaseException:
            self.close()
            raise
        self.model_memory = {
            **self.model_memory,
            "kernel_cache_train_bytes": train_kernels,
            "kernel_cache_eval_bytes": self.kernels["eval_bytes"],
        }
        # What the child did not time itself: forking from the server (or waiting for it to finish
        # importing torch and bsexp) and building the optimizer.
        if self.startup is None:  # the first start is the one reported
            self.startup = {"process_s": time.perf_counter() - started - sum(startup.values()), **startup}

    def _receive(self, expected: str):
        return _received(self.conn, self.process, expected)

    def attempt(self, size: int, plain: bool = False, probe: bool = False) -> Trial:
        """A trial at `size`; `plain`: with activation checkpointing off, to compare; `probe`:
        one step (TrialRunner.run)."""
        self.conn.send(("plain" if plain else "probe" if probe else "trial", size))
        try:
            trial = self._receive("trial")
        except ChildDied as died:  # killed outright: a failure at this size; start afresh
            log.warning("finder: the probe process died at micro-batch %d (%s); restarting it", size, died)
            self._restart()
            return Trial(size, False, failed_in="killed", error=f"the probe process died ({died})")
        if trial.ok:
            return trial
        sooner = _failed_sooner(trial, self.failures)
        if sooner is not None:
            # A step's memory grows as it runs, and a smaller batch needs less at every point of
            # it: failing far sooner than a larger one did means this process, not the size, is
            # at fault (once, a ResNet-18 search saw every trial below a failure fail in 2 ms,
            # and then the evaluation check). A fresh process tries the size again.
            log.warning(
                "finder: micro-batch %d failed after %.3f CPU s, far sooner than %d did in the same "
                "probe process (%.2f CPU s): trying it again in a fresh one (%s)",
                size,
                trial.cpu_seconds,
                sooner.size,
                sooner.cpu_seconds,
                trial.error,
            )
            self._restart()
            return self.attempt(size, plain, probe)  # a fresh process has no failures to be sooner than
        self.failures.append(trial)
        if (trial.reserved_mb or 0) * memory.MIB > STRANDED * self.budget_bytes:
            # When the cap refuses a large mapping, glibc falls back to its heap, which a small
            # block left on top can keep from shrinking: memory stranded that no later trial would
            # have. A fresh probe process starts clean.
            log.info(
                "finder: %.0f MB stranded after the failure at %d; restarting the probe process",
                trial.reserved_mb,
                size,
            )
            self._restart()
            trial.room_mb = None  # the room it left is not the fresh process's
        return trial

    def _restart(self) -> None:
        self.close()
        self._start()

    def evaluation(self) -> dict:
        """Whether the evaluation pass fits (TrialRunner.evaluation), after the trials."""
        self.conn.send(("eval", None))
        return self._receive("eval")

    def close(self) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self.conn.send(("stop", None))
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
        if self._kernels_process.is_alive():  # closed before it reported (this start failed)
            self._kernels_process.kill()
            self._kernels_process.join(timeout=5)
            self._kernels_conn.close()


def _failed_sooner(failed: Trial, failures: list[Trial]) -> Trial | None:
    """An earlier failure, at a larger size, that did more than twice the work before it failed as
    this one did (and 0.1 s more): a contradiction, where the same process ran both. Work is the
    process's CPU time: on a machine that other runs share, a trial's wall-clock time is as much
    their load as its own (a trial at 384 once took 1.77 s to fail beside a test run, 0.3 s alone)."""
    return next((f for f in failures if f.size > failed.size and f.cpu_seconds > 2 * failed.cpu_seconds + 0.1), None)


def _received(conn, process, expected: str):
    """The next message from a child process: its payload, its error raised, or ChildDied."""
    try:
        kind, payload = conn.recv()
    except EOFError:
        raise ChildDied(process) from None
    if kind == "error":
        raise payload
    assert kind == expected, kind
    return payload


class ChildDied(RuntimeError):
    def __init__(self, process) -> None:
        process.join(timeout=5)
        super().__init__(f"exit code {process.exitcode}")


def _serve(conn, work, *args) -> None:
    """A probe process: `work(conn, *args)`, an error from it (not an OOM, which the trials catch)
    sent to the parent, which re-raises it; then leave without the interpreter's teardown of torch
    (~1 s that the parent would wait for): a probe process holds nothing to save, and its output
    streams are flushed first.

    Every collection of garbage here (a trial collects twice: an OOM's traceback holds tensors in
    a cycle) would pass over every module, function and tensor of torch, ~0.1-0.2 s each: what
    the server imported is frozen out of the collector first, so a collection takes milliseconds
    (the kernel measurement's two, for the bench's MLP: 0.35 s, then 0.03 s)."""
    gc.freeze()
    try:
        work(conn, *args)
    except Exception as exc:
        with contextlib.suppress(Exception):
            conn.send(("error", _picklable(exc)))
    finally:
        conn.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _trials(
    conn, cfg: DictConfig, data: TrialData, limit_bytes: int, parent_held: int, distributed: bool, threads: int
) -> None:
    """The probe process: the run's model and first step, then trials as the parent asks."""
    started = time.perf_counter()
    model, group = _model(cfg, data, distributed, threads)
    built = time.perf_counter()
    if conn.recv()[0] != "go":  # the kernel measurement first (ChildProber); stopped before it ended
        return
    waited = time.perf_counter() - built
    runner = TrialRunner(cfg, data, torch.device("cpu"), model, distributed=distributed, process_group=group)
    startup = {"model_s": built - started, "kernel_cache_wait_s": waited, "first_step_s": runner.first_step_s}
    conn.send(("ready", (startup, runner.model_memory())))
    kind, kernel_bytes = conn.recv()  # ("cap", what training's kernel cache will hold)
    if kind != "cap":  # stopped before the trials (the kernel measurement failed)
        return
    # Trials get the room the training process will have once it holds its optimizer state
    # and cached kernels too: what the limit leaves beside the parent's memory, not beside
    # this process's.
    budget = limit_bytes - parent_held - runner.state_bytes - kernel_bytes
    if budget <= 0:
        raise ConfigError(
            "batch.finder.memory_limit_gb",
            round(limit_bytes / memory.GIB, 3),
            str(memory.CapBelowUse(parent_held + runner.state_bytes + kernel_bytes, limit_bytes)),
        )
    memory.cap_room(budget)
    gc.freeze()  # the model and optimizer too (_serve froze what was imported)
    conn.send(("capped", budget))
    while True:
        kind, size = conn.recv()
        if kind == "stop":
            break
        if kind == "eval":
            conn.send(("eval", runner.evaluation()))
            continue
        conn.send(("trial", runner.run(size, plain=kind == "plain", probe=kind == "probe")))


def _kernel_cache(
    conn, cfg: DictConfig, data: TrialData, distributed: bool, threads: int, capacity: str | None, room_bytes: int
) -> None:
    """What the first training step leaves mapped and what an evaluation forward adds
    (TrialRunner.eval_kernel_bytes), with oneDNN's kernel cache as the training process has it:
    on unless the user's environment set its capacity. Capped like the probe process (the room
    the limit leaves beside the training process): a step or evaluation that does not fit
    reports None (the eval check after the search then names the evaluation batch)."""
    # oneDNN reads its capacity when it first runs, which is after this: the server, whose
    # environment turns the cache off, never runs a torch operation.
    if capacity is None:
        os.environ.pop(CACHE_CAPACITY, None)
    else:
        os.environ[CACHE_CAPACITY] = capacity
    kernels = {"state_bytes": None, "eval_bytes": 0}
    if room_bytes <= 0:  # the probe process reports the limit below what training holds
        conn.send(("kernels", kernels))
        return
    torch.set_num_threads(threads)  # before the cap, which starts them (memory.cap_room)
    memory.cap_room(room_bytes)  # never more than training will have: the host stays safe
    try:
        model, group = _model(cfg, data, distributed, threads)
        runner = TrialRunner(
            cfg, data, torch.device("cpu"), model, distributed=distributed, process_group=group, first_size=KERNEL_SIZE
        )
        kernels["state_bytes"] = runner.state_bytes
        kernels["eval_bytes"] = runner.eval_kernel_bytes()
    except Exception as exc:
        if not memory.is_oom(exc):
            raise
    conn.send(("kernels", kernels))


def _model(cfg: DictConfig, data: TrialData, distributed: bool, threads: int) -> tuple[torch.nn.Module, object]:
    """The run's model in a probe process, and the process group of one rank that stands for a
    distributed run's world (None otherwise)."""
    torch.set_num_threads(threads)
    memory.return_freed_memory()
    seed_everything(cfg.seed, cfg.trainer.deterministic, run_speed(cfg, torch.device("cpu")))
    group = None
    if distributed:  # a world of one rank, so DDP and SyncBatchNorm are really there
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        group = dist.group.WORLD
    return build_model(cfg, data), group  # what it reads of the data: the input's shape and classes


def _picklable(exc: Exception) -> Exception:
    try:
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
            group, _ = dist.new_subgroups(group_size=1)
        cap_device_memory(device, limit_bytes)
        self.runner = TrialRunner(
            cfg,
            TrialData.of(splits, cfg.trainer.eval_batch_size),
            device,
            copy.deepcopy(model),
            distributed=world.distributed,
            process_group=group,
        )
        self.budget_bytes = limit_bytes - torch.cuda.memory_allocated(device)
        self.startup = {"first_step_s": self.runner.first_step_s}
        self.model_memory = self.runner.model_memory()
        self.device = device

    def attempt(self, size: int, plain: bool = False, probe: bool = False) -> Trial:
        return self.runner.run(size, plain, probe)

    def evaluation(self) -> dict:
        return self.runner.evaluation()

    def close(self) -> None:
        del self.runner
        memory.release(self.device)
        cap_device_memory(self.device, None)
