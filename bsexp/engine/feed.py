"""The feed: a split's samples one optimizer step at a time, as the batch policy lays the steps
out (the batch may change between steps): an epoch's seeded order shared by every rank, each
rank's share of a step, on-device crop and flip for image sets, and the evaluation's batches.
Tensors held on the device are batched by index; a torch `Dataset` is read through a
`DataLoader` with workers."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Subset

from bsexp.batch.plan import keep_final
from bsexp.engine.datasets import INDEXED, Augment, Split, Splits, TensorSplit, TokenWindows


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """One shuffle per epoch, shared by all ranks (Goyal et al. remark 4), epoch in the seed."""
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(n, generator=generator)


def augment_seed(seed: int, epoch: int, rank: int) -> int:
    """Crops and flips of an epoch depend only on (seed, epoch, rank), never on earlier draws."""
    return (seed * 100_003 + epoch) * 1_009 + rank + 1


def step_spans(n: int, sizes, world_size: int, drop_last: bool) -> Iterator[tuple[int, int]]:
    """(start, stop) of each optimizer step within an epoch's order of `n` samples: consecutive
    chunks of the given global batch sizes. The last, smaller chunk follows `keep_final`."""
    start = 0
    for size in sizes:
        if start >= n:
            return
        stop = min(start + size, n)
        if stop - start < size and not keep_final(stop - start, world_size, drop_last):
            return
        yield start, stop
        start = stop


def rank_share(step: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's contiguous share of a step's indices (sizes differ by at most one)."""
    return step if world_size == 1 else torch.tensor_split(step, world_size)[rank]


class TensorBatches:
    """Optimizer steps of in-memory samples, gathered by index on the data's device: per step,
    this rank's share of the step, which the trainer splits into micro-batches."""

    def __init__(self, split: TensorSplit | TokenWindows, seed: int, augment: Augment | None = None) -> None:
        self.split, self.seed, self.augment = split, seed, augment

    def __len__(self) -> int:
        return len(self.split)

    def steps(self, epoch: int, sizes, rank: int = 0, world_size: int = 1, drop_last: bool = False, skip: int = 0):
        """(x, y, global samples of the step) for each step of `sizes` (global batches), from the
        step `skip` of the epoch on (a resumed run continues mid-epoch with the same data)."""
        device = self.split.device
        order = epoch_order(len(self.split), self.seed, epoch).to(device)
        generator = torch.Generator(device=device)
        for index, (start, stop) in enumerate(step_spans(len(order), sizes, world_size, drop_last)):
            if index < skip:
                continue
            x, y = self.split.batch(rank_share(order[start:stop], rank, world_size))
            if self.augment is not None:
                # Each step's crops and flips depend only on (seed, epoch, step, rank).
                generator.manual_seed(augment_seed(self.seed, epoch, rank) * 1_000_003 + index)
                x = augment_batch(x, self.augment, generator, self.split.black)
            yield x, y, stop - start


def augment_batch(
    x: torch.Tensor, augment: Augment, generator: torch.Generator, fill: float | torch.Tensor = 0.0
) -> torch.Tensor:
    """Random crop (padding with `fill`, per channel) and random horizontal flip of an NCHW batch."""
    n, _, height, width = x.shape
    if augment.crop_padding:
        pad = augment.crop_padding
        padded = torch.nn.functional.pad(x - fill, (pad, pad, pad, pad)) + fill
        dy = torch.randint(0, 2 * pad + 1, (n, 1), generator=generator, device=x.device)
        dx = torch.randint(0, 2 * pad + 1, (n, 1), generator=generator, device=x.device)
        rows = (dy + torch.arange(height, device=x.device))[:, None, :, None]
        cols = (dx + torch.arange(width, device=x.device))[:, None, None, :]
        batch = torch.arange(n, device=x.device)[:, None, None, None]
        channels = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
        x = padded[batch, channels, rows, cols]
    if augment.hflip:
        flip = torch.rand(n, generator=generator, device=x.device) < 0.5
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    return x


class _StepIndices:
    """A batch sampler that replays a precomputed list of per-step index lists."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class LoaderBatches:
    """Optimizer steps read through a `DataLoader` with workers, for data that is not in memory:
    per step, this rank's share, loaded as one batch."""

    def __init__(self, dataset: Dataset, seed: int, device: torch.device, num_workers: int) -> None:
        self.dataset, self.seed, self.device = dataset, seed, device
        self.sampler = _StepIndices()
        self.loader = DataLoader(
            dataset,
            batch_sampler=self.sampler,
            num_workers=num_workers,
            pin_memory=device.type == "cuda",
            persistent_workers=num_workers > 0,
        )

    def __len__(self) -> int:
        return len(self.dataset)

    def steps(self, epoch: int, sizes, rank: int = 0, world_size: int = 1, drop_last: bool = False, skip: int = 0):
        order = epoch_order(len(self.dataset), self.seed, epoch)
        spans = list(step_spans(len(order), sizes, world_size, drop_last))[skip:]
        # The sampler lives in this process, so the steps can change every epoch.
        self.sampler.batches = [rank_share(order[a:b], rank, world_size).tolist() for a, b in spans]
        for (start, stop), (x, y) in zip(spans, self.loader):
            yield x.to(self.device, non_blocking=True), y.to(self.device), stop - start


def train_feed(splits: Splits, seed: int, device: torch.device):
    if isinstance(splits.train, INDEXED):
        return TensorBatches(splits.train, seed, splits.augment)
    return LoaderBatches(splits.train, seed, device, splits.num_workers)


def shard(split: Split, rank: int, world_size: int) -> Split:
    """This rank's contiguous share of a split for evaluation (sizes differ by at most one)."""
    if world_size == 1:
        return split
    idx = torch.tensor_split(torch.arange(len(split)), world_size)[rank]
    if isinstance(split, INDEXED):
        return split.subset(idx.to(split.device))
    return Subset(split, idx.tolist())


def eval_batches(
    split: Split, batch_size: int, device: torch.device, num_workers: int = 0
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The whole split in order, in batches of `batch_size`."""
    if isinstance(split, INDEXED):
        for start in range(0, len(split), batch_size):
            yield split.batch(torch.arange(start, min(start + batch_size, len(split)), device=split.device))
        return
    loader = DataLoader(split, batch_size=batch_size, num_workers=num_workers, pin_memory=device.type == "cuda")
    for x, y in loader:
        yield x.to(device, non_blocking=True), y.to(device)
