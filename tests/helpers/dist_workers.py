"""Worker functions for tests that start real process groups (gloo, CPU) with torch's elastic
launch API, as torchrun would. They live in a module so that spawned workers can import them."""

from __future__ import annotations

import os
import uuid

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.launcher.api import LaunchConfig, elastic_launch


def launch(fn, *args, nproc: int = 2):
    """Run fn(*args) on `nproc` local ranks; the return values by rank."""
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.2,
    )
    return elastic_launch(config, fn)(*args)


def train_steps(cfg):
    """Build bsexp's loop on this rank's world, evaluate, train, evaluate; report rank 0's view."""
    from bsexp.engine.distributed import close_world, init_world
    from bsexp.train.loop import TrainState, build_loop, train

    torch.set_num_threads(1)
    world = init_world("cpu", "gloo", 60)
    try:
        loop = build_loop(cfg, world)
        before = loop.evaluator.split(loop, loop.splits.val)
        backwards = [0]
        loop.step.net.register_full_backward_hook(lambda *args: backwards.__setitem__(0, backwards[0] + 1))
        progress = TrainState()
        status = train(loop, progress)
        return {
            "rank": world.rank,
            "world_size": world.size,
            "status": status,
            "val_before": before,
            "params": {k: v.detach().clone() for k, v in loop.step.net.state_dict().items()},
            "records": progress.records,
            "norms": sorted({type(m).__name__ for m in loop.step.net.modules() if "Norm" in type(m).__name__}),
            "steps": progress.step,
            "buckets_reduced": loop.step.grad_sync.buckets_reduced,
            "backwards": backwards[0],
            "noise": loop.step.noise.scale.summary() if loop.step.noise is not None else None,
        }
    finally:
        close_world(world)


def sync_batchnorm(x: torch.Tensor, weight: torch.Tensor, dims: int, precision: str = "fp32"):
    """This rank's half of `x` through CPUSyncBatchNorm; loss = sum(out * weight) / len(x). With
    precision bf16 the input arrives in bf16, under autocast, as a conv's output would."""
    import contextlib

    from bsexp.engine.syncbn import convert_sync_batchnorm

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        rank, size = dist.get_rank(), dist.get_world_size()
        bn = (nn.BatchNorm1d, nn.BatchNorm2d)[dims - 1](x.shape[1], momentum=0.3)
        with torch.no_grad():
            bn.weight.copy_(torch.linspace(0.5, 1.5, x.shape[1]))
            bn.bias.copy_(torch.linspace(-1, 1, x.shape[1]))
        bn = convert_sync_batchnorm(bn, torch.device("cpu"))
        mine = x.chunk(size)[rank].clone().requires_grad_(True)
        bf16 = precision == "bf16"
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            out = bn(mine.to(torch.bfloat16) if bf16 else mine)
        (out.float() * weight.chunk(size)[rank]).sum().div(len(x)).backward()
        grads = torch.cat([bn.weight.grad, bn.bias.grad])
        dist.all_reduce(grads)  # parameter gradients add up over ranks, as DDP's sum hook does
        return {
            "rank": rank,
            "type": type(bn).__name__,
            "out": out.detach(),
            "grad_in": mine.grad,
            "dtype": out.dtype,
            "grad_params": grads,
            "running": torch.cat([bn.running_mean, bn.running_var]),
        }
    finally:
        dist.destroy_process_group()


def env_rank_is(rank: int) -> bool:
    return os.environ.get("RANK") == str(rank)


def find_and_train(cfg, limits_gb):
    """Each rank probes under its own memory limit (as on machines of different sizes), the ranks
    agree, and each then trains under its own limit."""
    from bsexp.engine.distributed import close_world, init_world
    from bsexp.system.runtime import limit_memory
    from bsexp.train.loop import TrainState, build_loop, train

    torch.set_num_threads(1)
    world = init_world("cpu", "gloo", 120)
    try:
        cfg.batch.finder.memory_limit_gb = limits_gb[world.rank]
        loop = build_loop(cfg, world)
        limit_memory(world.device, int(limits_gb[world.rank] * 2**30))
        status = train(loop, TrainState())
        return {
            "rank": world.rank,
            "plan": loop.batch_control.current,
            "status": status,
            "tried": {t.size: t.ok for t in loop.batch_control.found.trials},
        }
    finally:
        close_world(world)


def train_with_room(cfg, rooms_mb):
    """Each rank trains with its own room in memory above what it holds after building the run
    (0: no cap), so an OOM happens on some ranks only; returns what each rank ended with."""
    from bsexp.engine.distributed import close_world, init_world
    from bsexp.system import memory
    from bsexp.train.loop import TrainState, build_loop, train

    torch.set_num_threads(1)
    world = init_world("cpu", "gloo", 120)
    try:
        loop = build_loop(cfg, world)
        if rooms_mb[world.rank]:
            memory.return_freed_memory()
            memory.cap_memory(memory.held() + rooms_mb[world.rank] * memory.MIB)
        status = train(loop, TrainState())
        return {
            "rank": world.rank,
            "status": status,
            "plan": loop.batch_control.current,
            "oom_recoveries": loop.batch_control.oom_recoveries,
            "params": {k: v.detach().clone() for k, v in loop.step.net.state_dict().items()},
        }
    finally:
        close_world(world)


def train_adaptive(cfg):
    """Train an adaptive run on this rank's world; the batches it decided, as this rank saw them."""
    from bsexp.engine.distributed import close_world, init_world
    from bsexp.train.loop import TrainState, build_loop, train

    torch.set_num_threads(1)
    world = init_world("cpu", "gloo", 60)
    try:
        loop = build_loop(cfg, world)
        status = train(loop, TrainState())
        return {
            "status": status,
            "points": list(loop.batch_control.policy.points),
            "decisions": list(loop.batch_control.policy.decisions),
            "sizes": list(loop.batch_control.layout.run.sizes),
            "params": {k: v.detach().clone() for k, v in loop.step.net.state_dict().items()},
        }
    finally:
        close_world(world)


class _StopOnRank(torch.autograd.Function):
    """Identity forward; its backward raises on `rank` (a fault midway through that rank's backward,
    after the layers behind it have their gradients)."""

    @staticmethod
    def forward(ctx, x, stop):
        ctx.stop = stop
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if ctx.stop:
            raise RuntimeError("injected fault in the backward")
        return grad, None


def bucketed_backward(fail_rank: int | None):
    """Three linear layers in bsexp's gradient buckets (one layer a bucket), one backward on a
    rank-dependent batch: when each bucket was launched against which gradients were complete,
    whether the gradients are views of the buckets, the gradients after `finish`, and what the
    ranks agreed. With `fail_rank`, that rank's backward stops after the last layer's gradients
    (a fault between it and the first two); every rank then reduces a second, healthy step."""
    from bsexp.engine.distributed import GradBuckets, GradSync, close_world, init_world

    torch.set_num_threads(1)
    world = init_world("cpu", "gloo", 60)
    try:
        torch.manual_seed(0)
        layers = nn.ModuleList([nn.Linear(6, 6, bias=False) for _ in range(3)])
        sync = GradSync(measure=True)
        buckets = GradBuckets(layers.parameters(), sync, cap_bytes=6 * 6 * 4)
        ready = []  # (parameter index, buckets launched once its gradient was complete)
        for index, p in enumerate(layers.parameters()):
            p.register_post_accumulate_grad_hook(lambda p, index=index: ready.append((index, sync.buckets_reduced)))
        x = torch.arange(12.0).view(2, 6) * (world.rank + 1)

        def backward(stop: bool) -> bool:
            sync.buckets_reduced = 0
            buckets.zero()
            buckets.arm(world)
            try:
                h = layers[1](layers[0](x))
                layers[2](_StopOnRank.apply(h, stop)).pow(2).sum().backward()
            except RuntimeError:
                return buckets.finish(world, True)
            return buckets.finish(world, False)

        failed = backward(world.rank == fail_rank)
        first = {"failed": failed, "ready": list(ready), "local_sq": float(sync.local_sq)}
        ready.clear()
        healthy = backward(False)
        return {
            "first": first,
            "second_failed": healthy,
            "ready": ready,
            "views": all(
                p.grad.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
                for p, b in zip(reversed(list(layers.parameters())), buckets.buffers)
            ),
            "grads": [p.grad.clone() for p in layers.parameters()],
            "x": x,
            "weights": [p.detach().clone() for p in layers.parameters()],
        }
    finally:
        close_world(world)
