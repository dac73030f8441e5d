"""The training step as one CUDA graph per shape (trainer.cuda_graphs), accumulation kept exact.

On a GPU an eager step is bound by the host: ResNet-18 dispatches about 362 kernels a step and
cnn1d about 125, at about 32 µs each on the H200 measured (docs/results/gpu.md), whatever their
size. A CUDA graph replays a whole step in one launch. `torch.compile(mode="reduce-overhead")`
breaks accumulation (pytorch/pytorch#169545): its graph's backward output becomes a gradient
that was set to None, and the next replay overwrites it. Autograd only takes an incoming gradient
over where `.grad` is None; where it exists, it adds into it in place. So here, as Megatron's
`main_grad` and torchtitan do:

- **static gradients**: every parameter's `.grad` is allocated once and zeroed in place before
  each step, never set to None (`bsexp.engine.step` zeroes in place whenever a `StepGraphs` is on);
- **one graph per key** (`GraphKey`): every micro-batch's forward and backward, the clip, the
  optimizer's update and the metric sums, captured with `torch.cuda.graph` after WARMUP_STEPS
  eager steps of the same key, graphs sharing one memory pool, at most MAX_GRAPHS kept (LRU).
  The key holds what a captured kernel reads as a constant: the micro-batch sizes and the step's
  samples, each parameter group's weight decay, every dropout rate and BatchNorm momentum (they
  change only with the batch). The LR is a 0-d device tensor written in place before each step
  (bsexp.engine.optim.Hyperparameters), read by the fused update inside the graph;
- **the batch gathered inside the graph** from the data set held on the device, through a
  static index buffer (bsexp.engine.feed.Rows), or copied into static inputs where the feed
  gathers it (augmentation, a DataLoader, the finder's trials);
- **eager** where a graph does not fit: an epoch's short last step, the noise meter's side
  measurement (`noise_scale=always` at one micro-batch), a key whose capture ran out of memory
  (then OOM recovery as ever), and the whole run after any other capture failure (said once).

Without `capture` (`trainer.cuda_graphs=static`, any device) the same code runs with no graph:
static gradients, keys, warm-ups, static inputs, and each "replay" running the recorded step
eagerly. That is what the CPU tests hold equal to the eager step.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bsexp.batch.plan import BatchPlan, micro_sizes
from bsexp.engine.feed import Rows
from bsexp.engine.step import Step, eager_step, finish, micro_steps
from bsexp.errors import ConfigError
from bsexp.system.memory import error_line, is_oom, release

log = logging.getLogger(__name__)

CHOICES = ("auto", "on", "static", "off")
MAX_GRAPHS = 8  # graphs kept: a batch schedule's sizes, an OOM's halvings; more are captured again
WARMUP_STEPS = 2  # eager steps of a key before its capture: cuDNN's autotuner, compiling, lazy state


def graph_mode(
    choice: str, device: torch.device, *, fused: bool, precision: str, distributed: bool
) -> tuple[str, str | None]:
    """trainer.cuda_graphs for a run: "capture", "static" (no capture) or "off", and why not
    captured (None where it is). `fused`: the optimizer will be built with a fused update (the
    fast path, an optimizer that has one). `on` where a graph cannot run is refused (exit 2)."""
    if choice in ("off", "static"):
        return choice, None if choice == "static" else "trainer.cuda_graphs=off"
    why = None
    if device.type != "cuda":
        why = "CUDA graphs need a GPU"
    elif not fused:
        why = "the update must be fused (trainer.speed=fast; torch's SGD, Adam, AdamW): others read the LR on the host"
    elif precision == "fp16":
        why = "fp16's loss scaler reads its overflow check on the host every step"
    elif distributed:
        why = "DDP's gradient reduction is not captured"
    if why is None:
        return "capture", None
    if choice == "on":
        raise ConfigError("trainer.cuda_graphs", choice, f"{why}; valid here: auto, static, off")
    return "off", why


@dataclass(frozen=True)
class GraphKey:
    """What a captured step reads as a constant (see the module's docstring)."""

    sizes: tuple[int, ...]  # this rank's micro-batches
    step_samples: int  # the step's global samples (the loss's divisor)
    rows: bool  # gathered inside the graph (bsexp.engine.feed.Rows), or static inputs copied in
    weight_decays: tuple[float, ...]  # each parameter group's
    dropouts: tuple[float, ...]  # each dropout layer's rate
    momenta: tuple[float | None, ...]  # each BatchNorm layer's momentum


def graph_key(
    sizes: list[int],
    step_samples: int,
    plan: BatchPlan,
    *,
    rows: bool,
    weight_decays: tuple[float, ...],
    dropouts: tuple[float, ...] = (),
    momenta: tuple[float | None, ...] = (),
    side_measurement: bool = False,
) -> GraphKey | None:
    """The key of a step, or None where it runs eagerly: a step shorter than the plan's batch (an
    epoch's last: once an epoch, not worth a graph), one whose noise is measured on the side
    (`side_measurement` at one micro-batch: its own forward and backward, its buffers put back),
    a BatchNorm with a cumulative average (momentum None: it reads its step count on the host)."""
    if step_samples != plan.size or (side_measurement and len(sizes) == 1) or None in momenta:
        return None
    return GraphKey(tuple(sizes), step_samples, rows, tuple(weight_decays), tuple(dropouts), tuple(momenta))


class GraphCache:
    """At most `capacity` values by key, the least recently used dropped first; and how often
    each key not (yet) held was seen, for its warm-up. Pure: it holds whatever it is given."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[Hashable, Any] = OrderedDict()
        self.seen: OrderedDict[Hashable, int] = OrderedDict()  # warm-up counts, bounded like the entries
        self.evicted = 0

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: Hashable) -> Any:
        value = self.entries.get(key)
        if value is not None:
            self.entries.move_to_end(key)
        return value

    def warmed(self, key: Hashable, warmup: int) -> bool:
        """Whether `key` was seen `warmup` times before (counting this time)."""
        count = self.seen.pop(key, 0) + 1
        self.seen[key] = count
        while len(self.seen) > 4 * self.capacity:
            self.seen.popitem(last=False)
        return count > warmup

    def put(self, key: Hashable, value: Any) -> list[Any]:
        """Hold `value`; the values dropped to make room (least recently used first)."""
        self.entries[key] = value
        self.entries.move_to_end(key)
        self.seen.pop(key, None)
        dropped = []
        while len(self.entries) > self.capacity:
            dropped.append(self.entries.popitem(last=False)[1])
        self.evicted += len(dropped)
        return dropped

    def drop(self, key: Hashable) -> None:
        self.entries.pop(key, None)

    def clear(self) -> None:
        self.entries.clear()
        self.seen.clear()


class _StaticInputs:
    """A captured step's inputs at fixed addresses: the index of its rows in a split held on the
    device (gathered inside the graph), or a copy of its x and y."""

    def __init__(self, x: torch.Tensor | Rows, y: torch.Tensor | Rows) -> None:
        if isinstance(x, Rows):
            self.split, self.index, self.x, self.y = x.split, x.index.clone(), None, None
        else:
            self.split, self.index, self.x, self.y = None, None, x.clone(), y.clone()

    def load(self, x: torch.Tensor | Rows, y: torch.Tensor | Rows) -> None:
        if self.index is not None:
            self.index.copy_(x.index)
        else:
            self.x.copy_(x)
            self.y.copy_(y)

    def read(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.split.batch(self.index) if self.index is not None else (self.x, self.y)


@dataclass
class _Captured:
    body: Callable[[], tuple]  # the step on the static inputs: (loss sum, correct, noise measurement)
    inputs: _StaticInputs
    graph: Any = None  # torch.cuda.CUDAGraph; None: no capture (`static`), the body runs each time
    outputs: tuple | None = None  # the graph's outputs, rewritten by each replay


def _body(step: Step, inputs: _StaticInputs, step_samples: int, sizes: list[int]) -> tuple:
    """One whole step on the static inputs: what a graph captures."""
    x, y = inputs.read()
    if step.noise is not None:
        step.noise.begin(step, x, y, len(sizes))  # resets its measurement: host only (no side half: graph_key)
    step.optimizer.zero_grad(set_to_none=False)
    loss_sum, correct = micro_steps(step, x, y, step_samples, sizes)
    return loss_sum, correct, finish(step, len(y), step_samples)


class StepGraphs:
    """The graphed training step of one run (see the module's docstring). `capture`: record CUDA
    graphs (a GPU); else the same step without them (`static`)."""

    def __init__(self, optimizer: torch.optim.Optimizer, net: nn.Module, device: torch.device, capture: bool) -> None:
        self.device, self.capture = device, capture
        self.params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        self.grads: list[torch.Tensor] = []
        self.dropouts = [m for m in net.modules() if isinstance(m, nn.modules.dropout._DropoutNd)]
        self.norms = [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        self.cache = GraphCache(MAX_GRAPHS)
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.stream = torch.cuda.Stream(device) if capture else None  # warm-ups and captures: one side stream
        self.eager_only: set[GraphKey] = set()  # keys whose capture ran out of memory
        self.disabled: str | None = None  # why nothing is captured any more
        self.counts = {"captured": 0, "replays": 0, "eager_steps": 0}

    def train_step(self, step: Step, x, y, step_samples: int, plan: BatchPlan):
        """bsexp.engine.step.train_step's contract: (summed loss, correct count, plan after the step)."""
        self._static_grads()
        sizes = micro_sizes(len(y), step_samples, plan)
        key = self._key(step, x, sizes, step_samples, plan)
        entry = None if key is None else self.cache.get(key)
        if entry is None and key is not None and self._due(key):
            entry = self._capture(step, key, x, y, step_samples, sizes)
        if entry is not None:
            done = self._replay(step, key, entry, x, y)
            if done is not None:
                return (*done, plan)
        return self._eager(step, x, y, step_samples, plan)

    def summary(self) -> dict[str, Any]:
        """For summary.json: how the run's steps ran."""
        return {
            "mode": "captured" if self.capture else "static",
            **self.counts,
            "evicted": self.cache.evicted,
            "disabled": self.disabled,
        }

    def clear(self) -> None:
        """Drop every graph (their memory stays in the pool for the next captures)."""
        self.cache.clear()
        self.eager_only.clear()

    def _static_grads(self) -> None:
        """Every trainable parameter's gradient allocated, where the graphs read and write it. Where
        something set them to None or replaced them (the finder's trials do between sizes), they
        are allocated anew and the graphs that held the old ones dropped."""
        if self.grads and all(p.grad is g for p, g in zip(self.params, self.grads)):
            return
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.grads = [p.grad for p in self.params]
        self.clear()

    def _key(self, step: Step, x, sizes: list[int], step_samples: int, plan: BatchPlan) -> GraphKey | None:
        if step.reduce != "none":  # DDP (`static` only): its reduction runs eagerly, as ever
            return None
        return graph_key(
            sizes,
            step_samples,
            plan,
            rows=isinstance(x, Rows),
            weight_decays=tuple(group["weight_decay"] for group in step.optimizer.param_groups),
            dropouts=tuple(m.p for m in self.dropouts),
            momenta=tuple(m.momentum for m in self.norms),
            side_measurement=step.noise is not None and step.noise.side_half,
        )

    def _due(self, key: GraphKey) -> bool:
        return self.disabled is None and key not in self.eager_only and self.cache.warmed(key, WARMUP_STEPS)

    def _eager(self, step: Step, x, y, step_samples: int, plan: BatchPlan):
        """The step run eagerly on the static gradients, with OOM recovery as ever."""
        if isinstance(x, Rows):
            x, y = x.gather()
        self.counts["eager_steps"] += 1
        return self._on_side_stream(lambda: eager_step(step, x, y, step_samples, plan))

    def _on_side_stream(self, fn: Callable[[], Any]) -> Any:
        """`fn` on the stream graphs are captured on, so that what it initialises lazily (cuBLAS's
        workspace, the optimizer's state) is there for the capture; the default stream waits."""
        if self.stream is None:
            return fn()
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            out = fn()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        return out

    def _capture(self, step: Step, key: GraphKey, x, y, step_samples: int, sizes: list[int]) -> _Captured | None:
        inputs = _StaticInputs(x, y)
        entry = _Captured(body=lambda: _body(step, inputs, step_samples, sizes), inputs=inputs)
        if self.capture:
            try:
                torch.cuda.synchronize(self.device)  # the warm-ups done
                entry.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(
                    entry.graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"
                ):
                    entry.outputs = entry.body()
            except Exception as exc:
                self._failed(key, exc, "capture")
                return None
        self.counts["captured"] += 1
        self.cache.put(key, entry)
        return entry

    def _replay(self, step: Step, key: GraphKey, entry: _Captured, x, y) -> tuple | None:
        """The step replayed: (summed loss, correct count), copies of the graph's outputs; None
        where a step without capture ran out of memory (it is then run eagerly, recovering)."""
        entry.inputs.load(x, y)
        if entry.graph is not None:
            entry.graph.replay()
            loss_sum, correct, measured = entry.outputs
        else:
            try:
                loss_sum, correct, measured = entry.body()
            except Exception as exc:
                self._failed(key, exc, "step")
                return None
        if measured is not None:
            step.noise.scale.update(*measured)
        self.counts["replays"] += 1
        return loss_sum.clone(), correct.clone()

    def _failed(self, key: GraphKey, exc: BaseException, where: str) -> None:
        """An out-of-memory error: this key runs eagerly from now on (and recovers as an eager step
        does). Anything else: no graph for the rest of the run, said once."""
        self.cache.drop(key)
        release(self.device)
        chain = [exc, exc.__cause__, exc.__context__]
        if any(e is not None and is_oom(e) for e in chain):
            self.eager_only.add(key)
            log.warning("out of memory in the graphed %s of micro-batches %s: eager from now on", where, key.sizes)
            return
        if self.capture is False:
            raise exc
        self.disabled = f"{type(exc).__name__}: {error_line(exc)}"
        self.cache.clear()
        log.warning("CUDA graphs off for the rest of the run, the %s failed: %s", where, self.disabled)
