"""One trial of the finder: real training steps at one micro-batch size — the trainer's own
`train_step`, on the model as training wraps it (SyncBatchNorm, DDP and how gradients are
reduced), with the configured precision and noise measurement — then an evaluation forward, on
a cached real batch tiled to the size. Its peak memory above the baseline (model, data,
optimizer state) is what training at that size adds."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch
from omegaconf import DictConfig

from bsexp.batch.plan import MIN_MICRO, make_plan
from bsexp.batch.scaling import ScaledHparams
from bsexp.engine.build import make_step, wrap_model
from bsexp.engine.cuda_graphs import WARMUP_STEPS
from bsexp.engine.datasets import INDEXED, Augment, Splits, TensorSplit, TokenInfo
from bsexp.engine.distributed import World
from bsexp.engine.feed import augment_batch
from bsexp.engine.models import set_checkpointing
from bsexp.engine.step import train_step
from bsexp.finder.result import Trial
from bsexp.system import memory

CACHED_BATCH = 256  # real samples kept for probing, tiled to each trial's size


@dataclass(kw_only=True)
class TrialData:
    """What trials need of a run's data, small enough to hand to the probe process instead of
    loading the whole dataset again there: real training samples as the step receives them
    (tiled to each size), their augmentation, the evaluation batch's size, and the input's shape,
    classes and tokens (what `build_model` reads)."""

    x: torch.Tensor
    y: torch.Tensor
    augment: Augment | None
    fill: float | torch.Tensor  # what crop padding fills with
    eval_size: int
    input_shape: tuple[int, ...]
    num_classes: int
    tokens: TokenInfo | None = None  # a language model's data: `build_model` checks the model reads it

    @classmethod
    def of(cls, splits: Splits, eval_batch_size: int) -> TrialData:
        x, y = _cached_batch(splits.train, CACHED_BATCH)
        augment = splits.augment if isinstance(splits.train, TensorSplit) else None
        return cls(
            x=x.cpu(),
            y=y.cpu(),
            augment=augment,
            fill=splits.train.black if augment is not None else 0.0,
            eval_size=min(eval_batch_size, max(len(splits.val), len(splits.train_eval))),
            input_shape=splits.input_shape,
            num_classes=splits.num_classes,
            tokens=splits.tokens,
        )


class TrialRunner:
    """The model, optimizer and one cached real batch of a run, and the trial at a given size.
    `distributed`: whether the run trains on several ranks; the trial then runs in a world of its
    own (`process_group`, one rank) with the same modules and gradient reduction."""

    def __init__(
        self,
        cfg: DictConfig,
        data: TrialData,
        device: torch.device,
        model: torch.nn.Module,
        *,
        distributed: bool = False,
        process_group=None,
        first_size: int = MIN_MICRO,
    ) -> None:
        self.cfg, self.device = cfg, device
        self.steps = cfg.batch.finder.steps_per_trial
        self.eval_size = data.eval_size
        self.distributed, self.process_group = distributed, process_group
        self.model, grad_sync = wrap_model(cfg, model, device, distributed, process_group)
        hp = ScaledHparams(
            k=1.0,
            lr=cfg.optimizer.lr,
            lr_peak=cfg.optimizer.lr,
            weight_decay=cfg.optimizer.weight_decay,
            warmup_steps=0,
            total_steps=1,
        )
        self.step = make_step(cfg, self.model, World(device=device), distributed, hp, grad_sync)
        if self.step.graphs is not None:  # a graphed step: its warm-ups, then its capture and replay
            self.steps = max(self.steps, WARMUP_STEPS + 1)
        self.x, self.y = data.x.to(device), data.y.to(device)
        self.augment = data.augment
        self.fill = data.fill.to(device) if isinstance(data.fill, torch.Tensor) else data.fill
        self.generator = torch.Generator(device=device).manual_seed(0)
        self.eval_fits: bool | None = None  # check_eval, or a trial at least as large (evaluation)
        self.eval_peak_mb = self.eval_shown_by = None
        # CPU: what the cap limits, address space (the first step also pages in library code,
        # resident memory that costs no address space: ~20 MB for a conv net).
        before = memory.vm_size() if device.type == "cpu" else torch.cuda.memory_allocated(device)
        started = time.perf_counter()
        self._train_step(first_size)  # creates the optimizer's state: part of every trial's baseline
        self.step.optimizer.zero_grad(set_to_none=True)
        if device.type == "cpu":
            memory.free_blas_buffers()  # not this size's: each trial makes its own (run)
        self.first_step_s = time.perf_counter() - started
        after = memory.vm_size() if device.type == "cpu" else torch.cuda.memory_allocated(device)
        self.state_bytes = max(0, after - before)  # what the run will add before its first step
        self._marks: dict[str, float] = {}  # when the forward ended and the optimizer step began
        self._peaks: dict[str, int] = {}  # memory peaks before the first optimizer step of a trial
        self.step.net.register_forward_hook(lambda *_: self._mark("forward"))
        self.step.optimizer.register_step_pre_hook(lambda *_: self._mark("optimizer"))

    def _mark(self, event: str) -> None:  # a hook: returns None, so the output is left alone
        self._marks.setdefault(event, time.perf_counter())
        if event == "optimizer" and not self._peaks:
            # Forward and backward hold what grows with the size (activations) on top of what
            # does not (gradients); the optimizer step's own peak (an AdamW step's temporaries)
            # does not grow with it. Fitting the first alone keeps the line straight where the
            # second dominates small sizes.
            self._peaks["resident"] = self._peak()
            if self.device.type == "cpu":
                self._peaks["mapped"] = memory.vm_peak()

    def model_memory(self) -> dict:
        """What the model holds whatever the batch: its parameters and the optimizer's state, as
        tensors (exact), and the resident memory the first step added (measured)."""
        params = list(self.step.net.parameters())
        state = [
            v
            for s in self.step.optimizer.state.values()
            for v in s.values()
            if isinstance(v, torch.Tensor) and v.numel() > 1
        ]  # moments, not step counters
        return {
            "params": sum(p.numel() for p in params),
            "param_bytes": sum(p.numel() * p.element_size() for p in params),
            "state_bytes": sum(v.numel() * v.element_size() for v in state),
            "first_step_bytes": self.state_bytes,
            "optimizer": type(self.step.optimizer).__name__,
            "momentum": any(g.get("momentum", 0) for g in self.step.optimizer.param_groups),
        }

    def _batch(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.arange(size, device=self.device) % len(self.y)
        x = self.x[idx]
        if self.augment is not None:
            x = augment_batch(x, self.augment, self.generator, self.fill)
        return x, self.y[idx]

    def _train_step(self, size: int) -> None:
        x, y = self._batch(size)
        train_step(self.step, x, y, size, make_plan(size))

    def evaluation(self) -> dict:
        """Whether the evaluation pass fits beside the model: shown by a training trial at least
        as large that passed (a forward without gradients holds less than a training step's
        forward and backward at the same size), else checked now (`check_eval`)."""
        if self.eval_fits is None:
            self.check_eval()
        return {
            "eval_fits": self.eval_fits,
            "eval_size": self.eval_size,
            "eval_peak_mb": self.eval_peak_mb,
            "eval_shown_by": self.eval_shown_by,
        }

    def check_eval(self) -> None:
        """The evaluation pass at trainer.eval_batch_size, once, under the cap. Its memory does
        not depend on the training micro-batch (the step's activations are gone by then, its
        gradients, made here by a step of 2 samples, are fixed in size): one check serves every
        size, and one that fails ends the search (bsexp.finder.find)."""
        base = self._memory(reset=True)
        try:
            self._train_step(MIN_MICRO)
            self._eval_forward()
            self.eval_fits = True
        except Exception as exc:
            if not memory.is_oom(exc):
                raise
            self.eval_fits = False
        finally:
            self.step.optimizer.zero_grad(set_to_none=True)
        self.eval_peak_mb = (self._peak() - base) / memory.MIB
        memory.release(self.device)

    def eval_kernel_bytes(self) -> int:
        """Bytes of address space an evaluation forward at the evaluation batch's size leaves
        mapped: in a process with oneDNN's kernel cache on (as training has it), the kernels it
        compiled for that shape (3 MB at 200 samples for the bench's conv net, 6 MB for
        ResNet-18; a few samples' forward leaves none)."""
        memory.release(self.device)
        before = memory.vm_size()
        self._eval_forward()
        memory.release(self.device)
        # Not MKL's buffers for the forward's matrix products: the first step's were freed (as
        # here), so the forward made its own anew (13 MB for an MLP of 1,024 hidden units at 200
        # samples, counted as oneDNN's kernels until this freed them). Training holds none of
        # those beyond its step's: MKL reuses the step's buffers for the evaluation's products
        # (that MLP training at 243 mapped 25.5 MB of them before and after evaluating at 200),
        # and every trial's peak counts its step's own.
        memory.free_blas_buffers()
        return max(0, memory.vm_size() - before)

    def _eval_forward(self) -> None:
        net = self.step.net
        try:
            net.eval()
            with torch.no_grad(), self.step.autocast():
                net(self._batch(self.eval_size)[0])
        finally:
            net.train()

    def run(self, size: int, plain: bool = False, probe: bool = False) -> Trial:
        """A trial at `size`; `plain`: with activation checkpointing off (to measure its cost);
        `probe`: one training step, enough to measure the peak (the first step's is the one
        fitted), not to show that later steps fit too."""
        if plain:
            set_checkpointing(self.step.net, False)
            try:
                return self.run(size)
            finally:
                set_checkpointing(self.step.net, True)
        device = self.device
        if self.step.graphs is not None:
            self.step.graphs.clear()  # the sizes before's graphs, their memory back in the pool
        memory.release(device)
        if device.type == "cpu":
            # Not MKL's buffers from the sizes tried before: a step makes those of its size after
            # its peak and keeps them for the next (whose peak holds them), so the room a trial
            # leaves is the room a training step of its size has beside its own.
            memory.free_blas_buffers()
        base, mapped = self._memory(reset=True), (memory.vm_size() if device.type == "cpu" else 0)
        vm_high = memory.vm_peak() if device.type == "cpu" else 0
        started, cpu_started = time.perf_counter(), time.process_time()
        self._peaks.clear()
        step_times, parts, train_peak, error = self._steps(size, 1 if probe else self.steps, base)
        ok = error is None
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        peak = max(self._peak() - base, train_peak or 0)
        if ok and size >= self.eval_size and self.eval_fits is None:
            self.eval_fits, self.eval_shown_by = True, size
        timed = step_times[1:] or step_times  # after the first step (it warms up), where there are more
        memory.release(device)
        left = _left_after(device, mapped, vm_high, self._peaks.get("mapped", 0))
        mib = lambda b: None if b is None else b / memory.MIB  # noqa: E731
        # Forward, backward (with the loss) and optimizer seconds of the last training step.
        forward_s, backward_s, optimizer_s = parts[-1] if parts else (None, None, None)
        backward_peak = self._peaks["resident"] - base if ok and "resident" in self._peaks else None
        return Trial(
            size,
            ok,
            failed_in=None if ok else "train",
            peak_mb=mib(peak),
            seconds=seconds,
            cpu_seconds=cpu_seconds,
            samples_per_s=size / (sum(timed) / len(timed)) if ok and timed else None,
            train_peak_mb=mib(train_peak),
            forward_s=forward_s,
            backward_s=backward_s,
            optimizer_s=optimizer_s,
            backward_peak_mb=mib(backward_peak),
            probe=probe,
            error=error,
            **left,
        )

    def _steps(
        self, size: int, count: int, base: int
    ) -> tuple[list[float], list[tuple[float, float, float]], int | None, str | None]:
        """`count` training steps at `size`, the peak counter reset at `base` bytes: each step's
        seconds, each step's forward, backward (with the loss) and optimizer seconds, the peak
        through them above `base` (bytes; None after a failure), and None, or the out-of-memory
        error's first line where a step ran out of memory (any other error propagates)."""
        step_times, parts = [], []
        try:
            for _ in range(count):
                self._marks.clear()
                t = time.perf_counter()
                self._train_step(size)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                end = time.perf_counter()
                step_times.append(end - t)
                fwd, opt = self._marks.get("forward", t), self._marks.get("optimizer", end)
                parts.append((fwd - t, opt - fwd, end - opt))
            if self.step.graphs is not None and self.step.graphs.eager_only:
                # Training would run this size eagerly: the graphed step it was measured for does not fit.
                raise torch.OutOfMemoryError(f"the CUDA graph of a step of {size} ran out of memory in its capture")
            return step_times, parts, self._peak() - base, None
        except Exception as exc:
            if not memory.is_oom(exc):
                raise
            error = memory.error_line(exc)
            if self.step.reduce == "hook":  # DDP's reducer expects the step it never saw end: wrap afresh
                self._rewrap()
            return step_times, parts, None, error
        finally:
            self.step.net.train()
            self.step.optimizer.zero_grad(set_to_none=True)

    def _rewrap(self) -> None:
        """The same module and optimizer in a fresh DDP wrapper (its reducer reset)."""
        model, grad_sync = wrap_model(self.cfg, self.step.net, self.device, True, self.process_group)
        self.model = model
        noise = self.step.noise
        if noise is not None:
            noise.grad_sync = grad_sync
        self.step = replace(self.step, model=model, grad_sync=grad_sync)

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


def _left_after(device: torch.device, mapped: int, vm_high: int, mapped_high: int) -> dict[str, float | int | None]:
    """What a trial left, as a Trial's fields (MB): on CUDA the allocator's reserve and its
    retries; on CPU the address space still mapped beyond `mapped`, the bytes mapped before the
    trial (fragmentation), the peak of it through forward and backward (`mapped_high`, bytes)
    where known, and the room the cap leaves.

    CPU: the cap limits address space, which runs ahead of resident memory. Its peak through
    forward and backward is known when the trial set the process's new high (VmPeak cannot be
    reset; `vm_high` was the high before): the growing probes do; nothing after a failure does.
    The room is what the cap leaves after the trial: each new size keeps a little mapped (oneDNN
    caches the kernels it compiled for that shape, ~11 MB for a small conv net), so it is what
    the next trial will have."""
    if device.type == "cuda":
        return {
            "reserved_mb": torch.cuda.memory_reserved(device) / memory.MIB,
            "alloc_retries": torch.cuda.memory_stats(device).get("num_alloc_retries", 0),
            "mapped_peak_mb": None,
            "room_mb": None,
        }
    reserved = (memory.vm_size() - mapped) / memory.MIB
    mapped_peak = room = None
    if device.type == "cpu":
        mapped_peak = (mapped_high - mapped) / memory.MIB if mapped_high > vm_high else None
        room = memory.address_space_room(memory.vm_size())
        room = None if room is None else room / memory.MIB
    return {"reserved_mb": reserved, "alloc_retries": None, "mapped_peak_mb": mapped_peak, "room_mb": room}


def _cached_batch(split, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to n real training samples, as the training step receives them (normalised floats)."""
    count = min(n, len(split))
    if isinstance(split, INDEXED):
        return split.batch(torch.arange(count, device=split.device))
    xs, ys = zip(*(split[i] for i in range(count)))
    return torch.stack([torch.as_tensor(x) for x in xs]), torch.as_tensor(ys)
