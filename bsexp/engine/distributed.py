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

    def all_reduce_gradients(self, parameters, grad_sync: GradSync | None = None) -> None:
        """Sum every parameter's gradient over the ranks, in one flat buffer (see
        `sum_gradients_hook` for why a sum). In a world of one (the finder's trial of a DDP run)
        the buffer is still made, so the trial holds what training holds."""
        params = [p for p in parameters if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        if grad_sync is not None and grad_sync.measure:
            grad_sync.local_sq = flat.double().pow(2).sum()
        if self.distributed:
            dist.all_reduce(flat)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
            offset += p.numel()
        if grad_sync is not None:
            grad_sync.buckets_reduced += 1

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
    if not dist.is_initialized():
        timeout = datetime.timedelta(seconds=timeout_s)
        if "TORCHELASTIC_RESTART_COUNT" in os.environ:
            dist.init_process_group(
                backend, store=_attempt_store(rank, size, timeout), rank=rank, world_size=size, timeout=timeout
            )
        else:
            dist.init_process_group(backend, timeout=timeout)
    return World(rank=rank, local_rank=local_rank, size=size, device=device)


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
    """State of `sum_gradients_hook`: how many gradient buckets it has all-reduced."""

    buckets_reduced: int = 0
    measure: bool = False  # keep the squared norm of this rank's gradient before the all-reduce
    local_sq: Any = None  # (for the gradient noise scale), summed over buckets


def sum_gradients_hook(state, bucket):  # no annotations: DDP checks them, and ours are strings
    """DDP communication hook: all-reduce by SUM. DDP's own hook averages over ranks, but each
    rank's loss is already divided by the samples of the whole step on every rank (Goyal et al.
    remark 3), so the ranks' gradients add up to the global one."""
    state.buckets_reduced += 1
    if state.measure:
        local = bucket.buffer().double().pow(2).sum()
        state.local_sq = local if state.local_sq is None else state.local_sq + local
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])
