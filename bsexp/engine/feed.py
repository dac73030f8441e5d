"""The feed: a split's samples one optimizer step at a time, as the batch policy lays the steps
out (the batch may change between steps): an epoch's seeded order shared by every rank, each
rank's share of a step, on-device crop and flip for image sets, and the evaluation's batches.
Tensors held on the device are batched by index; a torch `Dataset` is read through a
`DataLoader` with workers."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset, Subset

from bsexp.batch.plan import keep_final
from bsexp.engine.datasets import INDEXED, Augment, Split, Splits, TensorSplit, TokenWindows


def epoch_order(n: int, seed: int, epoch: int, device: torch.device | None = None) -> torch.Tensor:
    """One shuffle per epoch, shared by all ranks (Goyal et al. remark 4), epoch in the seed.
    On a CUDA `device` it is drawn there (another order than the CPU's, the same on every rank):
    a permutation drawn on the CPU and copied to the GPU makes the host wait for every step
    queued before it. Elsewhere it is the CPU's, as it always was."""
    if device is not None and device.type == "cuda":
        generator = torch.Generator(device=device).manual_seed(seed * 100_003 + epoch)
        return torch.randperm(n, generator=generator, device=device)
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


@dataclass(frozen=True)
class Rows:
    """A step's samples not gathered yet: their indices into a split held on the device. The
    graphed step (bsexp.engine.cuda_graphs) gathers them inside its graph, from a static copy of
    `index`; anything else calls `gather`."""

    split: TensorSplit
    index: torch.Tensor

    def __len__(self) -> int:
        return len(self.index)

    def gather(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.split.batch(self.index)


class TensorBatches:
    """Optimizer steps of in-memory samples, gathered by index on the data's device: per step,
    this rank's share of the step, which the trainer splits into micro-batches. `deferred`: each
    step's x and y are both its `Rows`, left to the step to gather (a set without augmentation)."""

    def __init__(
        self, split: TensorSplit | TokenWindows, seed: int, augment: Augment | None = None, deferred: bool = False
    ) -> None:
        self.split, self.seed, self.augment = split, seed, augment
        # token windows are gathered before the step (their gather is not written for a graph's capture)
        self.deferred = deferred and augment is None and isinstance(split, TensorSplit)

    def __len__(self) -> int:
        return len(self.split)

    def steps(self, epoch: int, sizes, rank: int = 0, world_size: int = 1, drop_last: bool = False, skip: int = 0):
        """(x, y, global samples of the step) for each step of `sizes` (global batches), from the
        step `skip` of the epoch on (a resumed run continues mid-epoch with the same data)."""
        device = self.split.device
        order = epoch_order(len(self.split), self.seed, epoch, device).to(device)
        generator = torch.Generator(device=device)
        for index, (start, stop) in enumerate(step_spans(len(order), sizes, world_size, drop_last)):
            if index < skip:
                continue
            share = rank_share(order[start:stop], rank, world_size)
            if self.deferred:
                rows = Rows(self.split, share)
                yield rows, rows, stop - start
                continue
            x, y = self.split.batch(share)
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


def train_feed(splits: Splits, seed: int, device: torch.device, deferred: bool = False):
    """`deferred`: in-memory steps come as `Rows`, for a step that gathers them itself."""
    if isinstance(splits.train, INDEXED):
        return TensorBatches(splits.train, seed, splits.augment, deferred)
    return LoaderBatches(splits.train, seed, device, splits.num_workers)


def shard(split: Split, rank: int, world_size: int) -> Split:
    """This rank's contiguous share of a split for evaluation (sizes differ by at most one)."""
    if world_size == 1:
        return split
    return subset(split, torch.tensor_split(torch.arange(len(split)), world_size)[rank])


def subset(split: Split, idx: torch.Tensor) -> Split:
    """The samples `idx` of a split, in that order: on its device where it is held in memory."""
    if isinstance(split, INDEXED):
        return split.subset(idx.to(split.device))
    return Subset(split, idx.tolist())


# The label of a row that pads an evaluation batch: F.cross_entropy's ignore_index, never a class.
PAD_LABEL = -100


def one_shape_size(n: int, batch_size: int) -> int:
    """The batch that covers `n` samples in as few batches of at most `batch_size` as before,
    each as full as can be: the last is padded to it by fewer rows than there are batches."""
    batches = -(-n // batch_size)
    return -(-n // batches) if batches else batch_size


def eval_batches(
    split: Split, batch_size: int, device: torch.device, num_workers: int = 0, one_shape: bool = False
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The whole split in order, in batches of `batch_size`. `one_shape` (a split held in
    memory): every batch of the split the same size, `one_shape_size`, the last one padded with
    repeats of its own last sample labelled PAD_LABEL (every token of a sequence), which the loss,
    the accuracy and the count leave out; cuDNN's autotuner and torch.compile then meet one
    evaluation shape per split."""
    if isinstance(split, INDEXED):
        size = one_shape_size(len(split), batch_size) if one_shape else batch_size
        for start in range(0, len(split), size):
            stop = min(start + size, len(split))
            index = torch.arange(start, stop, device=split.device)
            if not one_shape or stop - start == size:
                yield split.batch(index)
                continue
            x, y = split.batch(torch.cat([index, index[-1:].expand(size - len(index))]))
            y = y.clone()
            y[stop - start :] = PAD_LABEL
            yield x, y
        return
    loader = DataLoader(split, batch_size=batch_size, num_workers=num_workers, pin_memory=device.type == "cuda")
    for x, y in loader:
        yield x.to(device, non_blocking=True), y.to(device)
