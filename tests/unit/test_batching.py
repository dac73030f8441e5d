"""BatchControl: epoch orders, steps of scheduled sizes over ranks, micro-batch splits, on-device augmentation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bsexp.batch.plan import make_plan, micro_sizes
from bsexp.config.schema import DigitsData, MNIST1DData, SyntheticData, TorchvisionData
from bsexp.engine import datasets as data
from bsexp.engine.datasets import Augment, TensorSplit
from bsexp.engine.feed import TensorBatches, augment_batch, epoch_order, eval_batches, step_spans
from conftest import with_defaults

# The builders with their schema's defaults, as the config would call them.
mnist1d = with_defaults(data.mnist1d, MNIST1DData)
digits = with_defaults(data.digits, DigitsData)
synthetic = with_defaults(data.synthetic, SyntheticData)
torchvision_dataset = with_defaults(data.torchvision_dataset, TorchvisionData)

CPU = torch.device("cpu")


# ---------------------------------------------------------------------------- helpers


def row_keys(x: torch.Tensor | np.ndarray) -> list[bytes]:
    """One hashable key per sample: its bytes (sample identity, whatever the split)."""
    array = x.numpy() if isinstance(x, torch.Tensor) else x
    array = np.ascontiguousarray(array.reshape(len(array), -1))
    return [row.tobytes() for row in array]


def every(size: int, n: int) -> list[int]:
    """The same global batch for every step of an epoch of n samples."""
    return [size] * -(-n // size)


def all_of(split) -> tuple[torch.Tensor, torch.Tensor]:
    """A whole split, in order, as (x, y) — for TensorSplits and Datasets alike."""
    xs, ys = zip(*eval_batches(split, 256, CPU))
    return torch.cat(xs), torch.cat(ys)


def id_split(n: int, classes: int = 10) -> TensorSplit:
    """Samples whose single feature is their own index, so batches show which samples they hold."""
    return TensorSplit(torch.arange(n, dtype=torch.float32)[:, None], torch.arange(n) % classes)


def collect(batches, epoch, sizes, rank=0, world_size=1, drop_last=False):
    return list(batches.steps(epoch, sizes, rank, world_size, drop_last))


def assert_same_steps(got, expected, atol: float = 0.0) -> None:
    assert len(got) == len(expected) > 0
    for (xa, ya, samples_a), (xb, yb, samples_b) in zip(got, expected):
        assert samples_a == samples_b and xa.shape == xb.shape
        if atol:
            torch.testing.assert_close(xa, xb, atol=atol, rtol=0)
        else:
            assert torch.equal(xa, xb)
        assert torch.equal(ya, yb)


def test_epoch_order_is_a_fresh_reproducible_permutation_each_epoch():
    n, seed = 1000, 7
    orders = [epoch_order(n, seed, epoch) for epoch in range(3)]
    for order in orders:
        assert torch.equal(order.sort().values, torch.arange(n))
    for a in range(3):
        for b in range(a + 1, 3):
            assert not torch.equal(orders[a], orders[b])
    assert all(torch.equal(epoch_order(n, seed, e), orders[e]) for e in range(3))
    assert not torch.equal(epoch_order(n, seed + 1, 0), orders[0])


@pytest.mark.parametrize("n", [1000, 1024, 7])
@pytest.mark.parametrize("size, world", [(32, 1), (64, 2), (96, 3)])
def test_steps_cover_each_index_once_per_epoch_over_the_ranks(n, size, world):
    split = id_split(n)
    steps = [collect(TensorBatches(split, seed=3), 1, every(size, n), rank, world) for rank in range(world)]
    assert len({len(s) for s in steps}) == 1  # every rank takes part in every step
    order = epoch_order(n, seed=3, epoch=1)
    seen = []
    for number, ranks in enumerate(zip(*steps)):
        shares = [x[:, 0].long() for x, _, _ in ranks]
        in_step = sum(len(share) for share in shares)
        assert [samples for _, _, samples in ranks] == [in_step] * world  # the global count, everywhere
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
        assert in_step == size or number == len(steps[0]) - 1  # only the last step may be smaller
        seen.extend(shares)
    # Steps take consecutive slices of the epoch's order, rank 0 first.
    kept = torch.cat(seen)
    assert torch.equal(kept, order[: len(kept)])
    tail = n % size
    assert len(kept) == (n if tail == 0 or tail // world >= 2 else n - tail)  # a last step too thin for


def test_drop_last_drops_only_the_partial_step():
    assert list(step_spans(1000, every(64, 1000), 2, drop_last=True)) == [(64 * i, 64 * i + 64) for i in range(15)]
    assert list(step_spans(1000, every(64, 1000), 2, drop_last=False))[-1] == (960, 1000)
    assert len(list(step_spans(640, every(64, 640), 2, drop_last=True))) == 10  # nothing to drop


def test_steps_of_changing_sizes_within_an_epoch():
    # A schedule may change the batch mid-epoch (milestones in steps): 3 x 32, then 64s.
    n = 500
    x, y, samples = zip(*collect(TensorBatches(id_split(n), seed=2), 0, [32, 32, 32] + every(64, n)))
    assert [len(t) for t in y] == [32, 32, 32] + [64] * 6 + [20] and sum(samples) == n
    assert torch.equal(torch.cat(x)[:, 0].long().sort().values, torch.arange(n))


@pytest.mark.parametrize(
    "plan, local, samples, expected",
    [
        (make_plan(64, micro_size=16), 64, 64, [16, 16, 16, 16]),  # a full step
        (make_plan(64, world_size=2, micro_size=16), 17, 33, [9, 8]),  # a last step, on the larger share
        (make_plan(64, world_size=2, micro_size=16), 16, 33, [8, 8]),  # the same number on the other
        (make_plan(64, micro_size=4), 7, 7, [4, 3]),
        (make_plan(64, micro_size=1), 5, 5, [3, 2]),  # never below 2 samples a micro-batch
    ],
)
def test_micro_batch_sizes(plan, local, samples, expected):
    assert micro_sizes(local, samples, plan) == expected


def test_tensor_batches_follow_sizes_that_change_between_epochs():
    n = 1000
    batches = TensorBatches(id_split(n), seed=5)
    assert len(batches) == n
    orders = {}
    for epoch, size in {0: 32, 1: 64, 2: 48}.items():
        steps = collect(batches, epoch, every(size, n))
        for x, y, samples in steps:
            assert samples == len(y) and torch.equal(y, x[:, 0].long() % 10)  # labels stay with samples
        orders[epoch] = torch.cat([x[:, 0].long() for x, _, _ in steps])
        assert torch.equal(orders[epoch].sort().values, torch.arange(n))  # each sample once
    assert not torch.equal(orders[0], orders[1])
    # The shuffle depends on the epoch only: epoch 1 visits samples in the same order at size 32.
    again = torch.cat([x[:, 0].long() for x, _, _ in collect(batches, 1, every(32, n))])
    assert torch.equal(again, orders[1])


def test_tensor_batches_augment_the_samples_of_the_unaugmented_batches():
    n, pad = 200, 2
    x = torch.randn(n, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    split = TensorSplit(x, torch.arange(n) % 10)
    plain = collect(TensorBatches(split, seed=1), 0, every(64, n))
    augmented = collect(TensorBatches(split, seed=1, augment=Augment(pad, hflip=True)), 0, every(64, n))
    assert len(plain) == len(augmented)
    all_offsets, all_flips = [], []
    for (xp, yp, samples_p), (xa, ya, samples_a) in zip(plain, augmented):
        assert samples_p == samples_a and torch.equal(yp, ya) and xa.shape == xp.shape
        offsets, flips = crop_offsets(xp, xa, pad)
        all_offsets += offsets
        all_flips += flips
    assert len(all_offsets) == n and None not in all_offsets  # each sample, cropped and maybe flipped
    assert len(set(all_offsets)) > 10 and any(all_flips) and not all(all_flips)
    # Each step's draws depend on (seed, epoch, step, rank) only: the same again.
    again = collect(TensorBatches(split, seed=1, augment=Augment(pad, hflip=True)), 0, every(64, n))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(again, augmented))


def crop_offsets(x: torch.Tensor, out: torch.Tensor, pad: int):
    """For each sample, the (dy, dx) window of the zero-padded input it equals (None if none), by
    brute force over all (2p+1)^2 windows and both flips; and whether it matched flipped."""
    height, width = x.shape[-2:]
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    offsets, flips = [], []
    for i in range(len(x)):
        found = None
        for dy in range(2 * pad + 1):
            for dx in range(2 * pad + 1):
                window = padded[i, :, dy : dy + height, dx : dx + width]
                if torch.equal(out[i], window):
                    found = (dy, dx, False)
                elif torch.equal(out[i], window.flip(-1)):
                    found = (dy, dx, True)
                if found:
                    break
            if found:
                break
        offsets.append(None if found is None else found[:2])
        flips.append(None if found is None else found[2])
    return offsets, flips


def test_random_crop_is_a_window_of_the_zero_padded_input():
    pad = 2
    x = torch.randn(64, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    out = augment_batch(x, Augment(crop_padding=pad), torch.Generator().manual_seed(1))
    assert out.shape == x.shape and out.dtype == x.dtype
    offsets, flips = crop_offsets(x, out, pad)
    assert None not in offsets and not any(flips)
    assert len(set(offsets)) > 10  # the offsets vary (25 possible)
    assert any(offset != (pad, pad) for offset in offsets)
    # A shifted window brings in the zero padding.
    shifted = [i for i, offset in enumerate(offsets) if offset[0] == 0]
    assert shifted and all((out[i, :, :pad] == 0).all() for i in shifted)


def test_hflip_returns_the_image_or_its_mirror_and_both_happen():
    x = torch.randn(128, 2, 5, 7, generator=torch.Generator().manual_seed(0))
    out = augment_batch(x, Augment(hflip=True), torch.Generator().manual_seed(2))
    assert out.shape == x.shape
    same = [torch.equal(out[i], x[i]) for i in range(len(x))]
    mirrored = [torch.equal(out[i], x[i].flip(-1)) for i in range(len(x))]
    assert all(s != m for s, m in zip(same, mirrored))  # exactly one of the two, per sample
    assert 20 < sum(mirrored) < 108


def test_augmentation_is_reproducible_from_the_generator_seed():
    x = torch.randn(32, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    augment = Augment(crop_padding=3, hflip=True)
    first = augment_batch(x, augment, torch.Generator().manual_seed(9))
    assert torch.equal(first, augment_batch(x, augment, torch.Generator().manual_seed(9)))
    assert not torch.equal(first, augment_batch(x, augment, torch.Generator().manual_seed(10)))
    offsets, flips = crop_offsets(x, first, 3)
    assert None not in offsets and any(flips) and not all(flips)
    assert torch.equal(augment_batch(x, Augment(), torch.Generator().manual_seed(9)), x)
