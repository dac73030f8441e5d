"""The world of processes a run trains on: one process, or ranks under torchrun or self-launched.

Every rank check lives here (`World.is_main`). A process group comes from torchrun's environment
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT), whether torchrun itself or bsexp's own
`launch_workers` (torch's elastic launch API) started the process.
"""

from __future__ import annotations

import datetime
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from bsexp.config.env import under_torchrun


@dataclass(frozen=True)
class World:
    rank: int = 0
    local_rank: int = 0
    size: int = 1
    device: torch.device = torch.device("cpu")
    host_group: Any = None  # a gloo group for values the hosts hold (NCCL's ranks); None: the default group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """In place over every rank (no-op alone); returns the tensor."""
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return tensor

    def any_host(self, flag: bool) -> bool:
        """Whether `flag` holds on any rank: a value each host holds, agreed between the hosts
        (over gloo) without waiting for a device to finish its queued work."""
        if not self.distributed:
            return flag
        value = torch.tensor([float(flag)])
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.host_group)
        return bool(value.item())

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's `obj`, on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather_object(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj`, in rank order, on rank 0 (None on the others)."""
        if not self.distributed:
            return [obj]
        gathered = [None] * self.size if self.is_main else None
        dist.gather_object(obj, gathered, dst=0)
        return gathered

    def sync_buffers(self, module: torch.nn.Module) -> None:
        """Give every rank rank 0's buffers (BatchNorm running statistics), before evaluating."""
        if self.distributed:
            for buffer in module.buffers():
                dist.broadcast(buffer, src=0)


def init_world(device_choice: str, backend: str, timeout_s: float) -> World:
    """The world of this process: a process group when started by torchrun, else one process."""
    from bsexp.system.runtime import resolve_device

    if not under_torchrun():
        return World(device=resolve_device(device_choice))
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    size = int(os.environ["WORLD_SIZE"])
    device = resolve_device(device_choice, local_rank)  # one GPU per local rank
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        if "TORCHELASTIC_RESTART_COUNT" in os.environ:
            dist.init_process_group(
                backend, store=_attempt_store(rank, size, timeout), rank=rank, world_size=size, timeout=timeout
            )
        else:
            dist.init_process_group(backend, timeout=timeout)
    # NCCL reduces device tensors only: the hosts' agreements (World.any_host) go over gloo.
    host_group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    return World(rank=rank, local_rank=local_rank, size=size, device=device, host_group=host_group)


def _attempt_store(rank: int, size: int, timeout: datetime.timedelta):
    """torchrun's store, with keys of this restart attempt only. The elastic agent's store
    outlives a restart (--max-restarts), and gloo would otherwise read the previous attempt's
    addresses from it and fail to connect ("Gloo connectFullMesh failed ... Connection refused")."""
    agent_hosts_it = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        size,
        is_master=not agent_hosts_it and rank == 0,
        timeout=timeout,
    )
    attempt = os.environ.get("BSEXP_ATTEMPT", os.environ["TORCHELASTIC_RESTART_COUNT"])  # see agree_on_attempt
    return dist.PrefixStore(f"/bsexp/attempt_{attempt}", store)


AGREE_TIMEOUT_S = 300.0  # for every rank of a torchrun attempt to say hello


def agree_on_attempt() -> None:
    """Give every rank of a torchrun job the same TORCHELASTIC_RESTART_COUNT: the most restarts
    any rank's agent counted, or rounds rank 0's agent store has seen; and a name for this
    attempt's store keys (BSEXP_ATTEMPT), new each attempt.

    Each agent counts only its own restarts. When a worker fails on one node, the agent of
    another node, whose worker was still healthy, restarts it for the new rendezvous round
    without counting: the ranks would disagree on resuming and on their attempt's keys. Each
    rank says hello under a key only its own process knows, and rank 0 answers it, so keys left
    by an earlier attempt are never taken for this one's."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return  # the store is new each attempt (rank 0 hosts it): nothing stale, nothing to count in
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    own = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or "0"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        size,
        is_master=False,
        timeout=datetime.timedelta(seconds=AGREE_TIMEOUT_S),
    )
    if rank == 0:
        name, deadline = uuid.uuid4().hex, time.monotonic() + AGREE_TIMEOUT_S
        counts, waiting = [int(own), store.add("/bsexp/rounds", 1) - 1], set(range(1, size))
        while waiting:
            for r in sorted(waiting):
                if store.check([f"/bsexp/ready/{name}/{r}"]):
                    counts.append(int(store.get(f"/bsexp/ready/{name}/{r}")))
                    waiting.discard(r)
                elif store.check([f"/bsexp/hello/{r}"]):  # this attempt's rank r or a dead one's: answer
                    store.set(f"/bsexp/answer/{store.get(f'/bsexp/hello/{r}').decode()}", name)
            if waiting and time.monotonic() > deadline:
                raise TimeoutError(f"torchrun ranks {sorted(waiting)} did not start within {AGREE_TIMEOUT_S:.0f} s")
            time.sleep(0.02 if waiting else 0)
        store.set(f"/bsexp/attempt/{name}", str(max(counts)))
    else:
        hello = uuid.uuid4().hex
        store.set(f"/bsexp/hello/{rank}", hello)
        name = store.get(f"/bsexp/answer/{hello}").decode()
        store.set(f"/bsexp/ready/{name}/{rank}", own)
    os.environ["TORCHELASTIC_RESTART_COUNT"] = store.get(f"/bsexp/attempt/{name}").decode()
    os.environ["BSEXP_ATTEMPT"] = name


def close_world(world: World) -> None:
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()


@dataclass
class GradSync:
    """How a DDP run's gradients meet: the state of `sum_gradients_hook` (DDP's own buckets) or,
    with OOM recovery on, bsexp's (`buckets`); how many buckets were all-reduced."""

    buckets_reduced: int = 0
    measure: bool = False  # keep the squared norm of this rank's gradient before the all-reduce
    local_sq: Any = None  # (for the gradient noise scale), summed over buckets
    buckets: GradBuckets | None = None

    def reducing(self, buffer: torch.Tensor) -> None:
        """Count a bucket about to be all-reduced, and its local squared norm where measured."""
        self.buckets_reduced += 1
        if self.measure:
            local = buffer.double().pow(2).sum()
            self.local_sq = local if self.local_sq is None else self.local_sq + local


BUCKET_BYTES = 25 * 1024 * 1024  # DDP's default bucket_cap_mb


class GradBuckets:
    """This rank's gradients as views of a few flat buffers (allocated once, zeroed in place),
    each buffer all-reduced by SUM as soon as the backward of the step's last micro-batch has
    completed every gradient in it, while the backward goes on: DDP's bucketed, overlapped
    reduction, with buckets bsexp owns, so that a step can fail on one rank and not the others.

    DDP's reducer cannot abandon a backward that an out-of-memory error cut short (its next
    forward refuses to start) and leaves the other ranks waiting in reductions that rank never
    starts. Here every backward runs under DDP's no_sync and the buckets are launched in one order
    on every rank: a rank whose step failed launches the ones it has not (`finish`), so every rank
    makes the same collectives; then the hosts agree on whether any rank failed
    (`World.any_host`, no wait for the device), and every rank retries the step or none does.
    Buckets follow the parameters in reverse (the order a backward completes them), DDP's way."""

    def __init__(self, parameters, sync: GradSync, group: Any = None, cap_bytes: int = BUCKET_BYTES) -> None:
        params = [p for p in parameters if p.requires_grad]
        self.sync, self.group = sync, group
        members: list[list[torch.nn.Parameter]] = []
        filled = 0  # bytes in the last bucket
        for p in reversed(params):
            last = members[-1] if members else None
            if last and (last[0].dtype, last[0].device) == (p.dtype, p.device) and filled + p.nbytes <= cap_bytes:
                last.append(p)
                filled += p.nbytes
            else:
                members.append([p])
                filled = p.nbytes
        self.buffers = [
            torch.zeros(sum(p.numel() for p in ps), dtype=ps[0].dtype, device=ps[0].device) for ps in members
        ]
        self.views: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        self.bucket_of: dict[torch.nn.Parameter, int] = {}
        self.sizes = [len(ps) for ps in members]
        for index, (ps, buffer) in enumerate(zip(members, self.buffers)):
            offset = 0
            for p in ps:
                self.views.append((p, _view(buffer, offset, p)))
                self.bucket_of[p] = index
                offset += p.numel()
        for p in params:
            p.register_post_accumulate_grad_hook(self._ready)
        self._world: World | None = None  # set while the last micro-batch's backward may launch buckets
        self._pending: list[int] = []
        self._next = 0
        self._works: list[Any] = []

    def zero(self) -> None:
        """Every gradient zeroed in place and a view of its bucket again (after a
        zero_grad(set_to_none=True) elsewhere: the finder's trials)."""
        for buffer in self.buffers:
            buffer.zero_()
        for p, view in self.views:
            if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                p.grad = view
        self._world, self._next, self._works = None, 0, []

    def arm(self, world: World) -> None:
        """From here (the step's last backward) a completed bucket is launched."""
        self._pending, self._next, self._world = list(self.sizes), 0, world
        self.sync.local_sq = None

    def finish(self, world: World, failed: bool) -> bool:
        """After the step's micro-batches (`failed`: this rank's ended in an OOM): every bucket not
        yet launched launched in order, all of them waited for; whether any rank failed."""
        self._world = world
        while self._next < len(self.buffers):
            self._launch()
        self._world = None
        for work in self._works:
            work.wait()
        self._works = []
        return world.any_host(failed)

    def _ready(self, p: torch.nn.Parameter) -> None:
        if self._world is None:
            return
        self._pending[self.bucket_of[p]] -= 1
        while self._next < len(self.buffers) and self._pending[self._next] == 0:
            self._launch()

    def _launch(self) -> None:
        buffer = self.buffers[self._next]
        self.sync.reducing(buffer)
        if self._world.distributed:
            self._works.append(dist.all_reduce(buffer, group=self.group, async_op=True))
        self._next += 1


def _view(buffer: torch.Tensor, offset: int, p: torch.Tensor) -> torch.Tensor:
    """p's gradient at `offset` of `buffer`, laid out as p is (channels_last too, where dense)."""
    dense = p.is_contiguous() or (p.dim() == 4 and p.is_contiguous(memory_format=torch.channels_last))
    if dense:
        return buffer.as_strided(p.size(), p.stride(), buffer.storage_offset() + offset)
    return buffer[offset : offset + p.numel()].view(p.shape)


def sum_gradients_hook(state, bucket):  # no annotations: DDP checks them, and ours are strings
    """DDP communication hook: all-reduce by SUM. DDP's own hook averages over ranks, but each
    rank's loss is already divided by the samples of the whole step on every rank (Goyal et al.
    remark 3), so the ranks' gradients add up to the global one."""
    state.reducing(bucket.buffer())
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])
