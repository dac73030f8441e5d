"""Dataset builders: disjoint deterministic splits, the published MNIST-1D, torchvision sets, the DataLoader path."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from bsexp.batch.schedule import BatchSchedule
from bsexp.config.schema import DigitsData, MNIST1DData, SyntheticData, TorchvisionData
from bsexp.engine import datasets as data
from bsexp.engine.datasets import Augment, TensorSplit
from bsexp.engine.feed import LoaderBatches, TensorBatches, eval_batches, train_feed
from bsexp.errors import ConfigError
from conftest import with_defaults
from mnist_files import write_fake_mnist

# The builders with their schema's defaults, as the config would call them.
mnist1d = with_defaults(data.mnist1d, MNIST1DData)
digits = with_defaults(data.digits, DigitsData)
synthetic = with_defaults(data.synthetic, SyntheticData)
torchvision_dataset = with_defaults(data.torchvision_dataset, TorchvisionData)

CPU = torch.device("cpu")


# ---------------------------------------------------------------------------- helpers


def every(size: int, n: int) -> list[int]:
    """The same global batch for every step of an epoch of n samples."""
    return [size] * -(-n // size)


def all_of(split) -> tuple[torch.Tensor, torch.Tensor]:
    """A whole split, in order, as (x, y) — for TensorSplits and Datasets alike."""
    xs, ys = zip(*eval_batches(split, 256, CPU))
    return torch.cat(xs), torch.cat(ys)


def row_keys(x: torch.Tensor | np.ndarray) -> list[bytes]:
    """One hashable key per sample: its bytes (sample identity, whatever the split)."""
    array = x.numpy() if isinstance(x, torch.Tensor) else x
    array = np.ascontiguousarray(array.reshape(len(array), -1))
    return [row.tobytes() for row in array]


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


def _mnist1d_small(root):
    return mnist1d(root=str(root), num_samples=1000, val_size=100)


def _digits(root):
    return digits()


def _synthetic(root):
    return synthetic(shape=[3, 8, 8], num_classes=5, num_samples=600, val_size=100, test_size=50)


BUILDERS = {
    # name: (builder, input shape, classes, train + val samples, val samples, test samples)
    "mnist1d": (_mnist1d_small, (1, 40), 10, 800, 100, 200),
    "digits": (_digits, (1, 8, 8), 10, 1797, 360, None),
    "synthetic": (_synthetic, (3, 8, 8), 5, 600, 100, 50),
}


@pytest.mark.parametrize("name", BUILDERS)
def test_builders_return_disjoint_deterministic_splits(name, data_root):
    build, shape, classes, total, val_size, test_size = BUILDERS[name]
    splits = build(data_root)
    assert splits.name == name and splits.in_memory
    assert splits.input_shape == shape and splits.num_classes == classes
    assert len(splits.train) + len(splits.val) == total and len(splits.val) == val_size
    if test_size is None:
        assert splits.test is None
    else:
        assert len(splits.test) == test_size and tuple(splits.test.x.shape[1:]) == shape
    for split in (splits.train, splits.val, splits.train_eval):
        assert tuple(split.x.shape[1:]) == shape and split.x.dtype == torch.float32
        assert split.y.dtype == torch.long and 0 <= split.y.min() and split.y.max() < classes
    assert set(splits.train.y.tolist()) == set(range(classes))

    train, val, train_eval = (row_keys(s.x) for s in (splits.train, splits.val, splits.train_eval))
    assert len(set(train)) == len(train) and len(set(val)) == len(val)  # distinct samples
    assert not set(train) & set(val)
    # train_eval: a fixed subset of train, the size of val, without repeats.
    assert len(train_eval) == len(val) == len(set(train_eval))
    assert set(train_eval) <= set(train)
    labels = dict(zip(train, splits.train.y.tolist()))
    assert [labels[key] for key in train_eval] == splits.train_eval.y.tolist()

    again = build(data_root)
    for a, b in zip(
        (splits.train, splits.val, splits.train_eval, splits.test),
        (again.train, again.val, again.train_eval, again.test),
    ):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)


def test_val_size_is_at_most_half_so_train_accuracy_gets_as_many_samples():
    for val_size in (0, 51, 100, 150):
        with pytest.raises(ConfigError) as info:
            synthetic(num_samples=100, val_size=val_size)
        assert info.value.key == "data.val_size" and "between 1 and 50" in str(info.value)
    splits = synthetic(num_samples=100, val_size=50)
    assert len(splits.train) == len(splits.val) == len(splits.train_eval) == 50


def test_digits_are_sklearn_digits_standardised_by_the_training_split():
    from sklearn.datasets import load_digits

    bunch = load_digits()
    raw = torch.from_numpy(bunch.images.reshape(len(bunch.images), -1)).double()
    splits = digits(val_size=300, seed=1)
    train = splits.train.x.double()
    assert abs(train.mean().item()) < 1e-5 and abs(train.std().item() - 1) < 1e-4
    x = torch.cat([splits.train.x, splits.val.x]).reshape(1797, -1).double()
    y = torch.cat([splits.train.y, splits.val.y])
    # One affine map of sklearn's pixels for every sample; match each sample to its image.
    scale = (x.max() - x.min()) / (raw.max() - raw.min())
    expected = raw * scale + (x.min() - scale * raw.min())
    distance = torch.cdist(x, expected)
    nearest = distance.argmin(dim=1)
    assert distance.min(dim=1).values.max() < 1e-3
    assert sorted(nearest.tolist()) == list(range(1797))
    assert torch.equal(y, torch.as_tensor(bunch.target)[nearest])
    assert len(splits.val) == 300
    assert not torch.equal(splits.val.x, digits(val_size=300, seed=2).val.x)


def test_synthetic_classes_are_gaussian_clusters_of_any_shape():
    splits = synthetic(shape=[2, 3, 4], num_classes=4, num_samples=400, val_size=80, test_size=40, noise=0.05, seed=3)
    assert splits.input_shape == (2, 3, 4)
    train_x, train_y = splits.train.x.flatten(1), splits.train.y
    centroids = torch.stack([train_x[train_y == c].mean(0) for c in range(4)])
    for split in (splits.val, splits.test):
        predicted = torch.cdist(split.x.flatten(1), centroids).argmin(1)
        assert torch.equal(predicted, split.y)  # low noise: nearest class mean is always right
    spread = (train_x - centroids[train_y]).std().item()
    assert 0.03 < spread < 0.07
    assert synthetic(num_samples=100, val_size=10, test_size=0).test is None
    assert not torch.equal(
        synthetic(num_samples=100, val_size=10, seed=4).train.x, synthetic(num_samples=100, val_size=10, seed=5).train.x
    )


def test_mnist1d_equals_the_reference_generator(data_root):
    from mnist1d.data import get_dataset_args, make_dataset

    splits = _mnist1d_small(data_root)
    args = get_dataset_args()
    args.num_samples, args.seed = 1000, 42
    raw = make_dataset(args)  # reseeds numpy and random globally; every test seeds its own
    reference = dict(zip(row_keys(raw["x"][:, None, :].astype(np.float32)), raw["y"].tolist()))
    ours = row_keys(torch.cat([splits.train.x, splits.val.x]))
    assert len(reference) == len(ours) == 800 and set(ours) == set(reference)
    assert torch.cat([splits.train.y, splits.val.y]).tolist() == [reference[k] for k in ours]
    assert torch.equal(splits.test.x, torch.tensor(raw["x_test"], dtype=torch.float32)[:, None])
    assert splits.test.y.tolist() == raw["y_test"].tolist()


def test_mnist1d_published_defaults(data_root):
    splits = mnist1d(root=str(data_root))
    assert len(splits.train) + len(splits.val) == 4000 and len(splits.val) == 500
    assert len(splits.test) == 1000
    assert splits.input_shape == (1, 40) and splits.num_classes == 10


def _rng_states():
    return np.random.get_state(), random.getstate()


def _same_np_state(a, b) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and tuple(a[2:]) == tuple(b[2:])


def test_mnist1d_keeps_global_rngs_and_reuses_its_cache(data_root):
    root = data_root / "mnist1d-fresh"  # a cache of its own, so this call generates
    cache_dir = root / "mnist1d"
    assert not cache_dir.exists()
    np.random.seed(1234)
    random.seed(5678)
    np.random.random(3), random.random()  # somewhere in the middle of the streams
    np_before, py_before = _rng_states()
    first = mnist1d(root=str(root), num_samples=1000, val_size=100, seed=3)
    np_after, py_after = _rng_states()
    assert _same_np_state(np_before, np_after) and py_before == py_after

    files = sorted(cache_dir.iterdir())
    assert len(files) == 1 and files[0].suffix == ".pt"  # no temporary file left behind
    cache = files[0]
    mtime = cache.stat().st_mtime_ns
    cached = torch.load(cache)
    assert set(row_keys(cached["x"])) == set(row_keys(torch.cat([first.train.x, first.val.x])))
    assert torch.equal(cached["x_test"], first.test.x)

    second = mnist1d(root=str(root), num_samples=1000, val_size=100, seed=3)
    assert sorted(cache_dir.iterdir()) == [cache] and cache.stat().st_mtime_ns == mtime
    for a, b in ((first.train, second.train), (first.val, second.val), (first.test, second.test)):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert _same_np_state(np_before, np.random.get_state()) and py_before == random.getstate()
    # Another size is another cache file.
    mnist1d(root=str(root), num_samples=500, val_size=50, seed=3)
    assert len(list(cache_dir.iterdir())) == 2


def _synthetic_pair(num_samples=1000, **kwargs):
    common = dict(shape=[3, 4, 4], num_samples=num_samples, val_size=100, test_size=60, seed=8)
    common.update(kwargs)
    return synthetic(**common), synthetic(**common, in_memory=False, num_workers=0)


def test_synthetic_datasets_hold_the_in_memory_samples():
    memory, datasets = _synthetic_pair()
    assert not datasets.in_memory and datasets.num_workers == 0
    for name in ("train", "train_eval", "val", "test"):
        split, dataset = getattr(memory, name), getattr(datasets, name)
        assert isinstance(dataset, Dataset) and not isinstance(dataset, TensorSplit)
        assert len(dataset) == len(split)
        x, y = all_of(dataset)
        assert torch.equal(x, split.x) and torch.equal(y, split.y)
    assert datasets.input_shape == memory.input_shape == (3, 4, 4)
    assert isinstance(train_feed(datasets, 0, CPU), LoaderBatches)
    assert isinstance(train_feed(memory, 0, CPU), TensorBatches)


@pytest.mark.parametrize("drop_last", [False, True])
def test_loader_batches_equal_tensor_batches(drop_last):
    memory, datasets = _synthetic_pair()  # 900 train samples
    in_memory, loader = train_feed(memory, 4, CPU), train_feed(datasets, 4, CPU)
    # A partial last step (900 = 18 * 48 + 36), sizes changing within an epoch and between epochs.
    for epoch, sizes in ((0, every(48, 900)), (1, [16] * 10 + every(128, 900)), (2, every(128, 900))):
        expected = collect(in_memory, epoch, sizes, drop_last=drop_last)
        got = collect(loader, epoch, sizes, drop_last=drop_last)
        assert_same_steps(got, expected)


def test_loader_batches_equal_tensor_batches_per_rank():
    memory, datasets = _synthetic_pair(num_samples=430)  # 330 train = 10 * 32 + 10
    in_memory, loader = train_feed(memory, 2, CPU), train_feed(datasets, 2, CPU)
    for rank in (0, 1):
        assert_same_steps(collect(loader, 0, every(32, 330), rank, 2), collect(in_memory, 0, every(32, 330), rank, 2))


def test_a_last_step_too_small_to_give_every_rank_two_samples_is_dropped():
    memory, datasets = _synthetic_pair(num_samples=13, val_size=4, shape=[2])  # 9 train = 8 + 1
    for rank in (0, 1):
        expected = collect(train_feed(memory, 0, CPU), 0, every(8, 9), rank, 2)
        assert_same_steps(collect(train_feed(datasets, 0, CPU), 0, every(8, 9), rank, 2), expected)
        assert len(expected) == 1  # one sample cannot be shared by two ranks
    assert BatchSchedule(8, world_size=2).run_steps(1, 9, False).total == 1
    assert BatchSchedule(8).run_steps(1, 10, False).total == 2  # 2 samples on one rank: kept


def test_loader_batches_with_persistent_workers_follow_size_changes():
    memory, _ = _synthetic_pair()
    _, datasets = _synthetic_pair()
    loader = LoaderBatches(datasets.train, seed=6, device=CPU, num_workers=2)
    in_memory = train_feed(memory, 6, CPU)
    for epoch, size in ((0, 100), (1, 64), (2, 30)):
        assert_same_steps(collect(loader, epoch, every(size, 900)), collect(in_memory, epoch, every(size, 900)))


@pytest.fixture(scope="module")
def fake_mnist(data_root):
    root = data_root / "fake-vision"
    return root, write_fake_mnist(root, num_train=600, num_test=100)


def test_torchvision_mnist_in_memory(fake_mnist):
    root, written = fake_mnist
    splits = torchvision_dataset("mnist", root=str(root), val_size=100, augment=False)
    assert splits.in_memory and splits.augment is None
    assert splits.input_shape == (1, 28, 28) and splits.num_classes == 10
    assert (len(splits.train), len(splits.val), len(splits.train_eval), len(splits.test)) == (500, 100, 100, 100)

    # The raw uint8 pixels are the images written, each with its own label.
    assert splits.train.x.dtype == torch.uint8
    labels = dict(zip(row_keys(written["train_images"]), written["train_labels"].tolist()))
    stored = row_keys(torch.cat([splits.train.x, splits.val.x]))
    assert len(stored) == 600 and set(stored) == set(labels)
    assert torch.cat([splits.train.y, splits.val.y]).tolist() == [labels[k] for k in stored]
    assert not set(row_keys(splits.train.x)) & set(row_keys(splits.val.x))
    assert set(row_keys(splits.train_eval.x)) <= set(row_keys(splits.train.x))
    assert torch.equal(splits.test.x[:, 0], torch.from_numpy(written["t10k_images"]))
    assert splits.test.y.tolist() == written["t10k_labels"].tolist()

    # Batches come normalised with the training set's per-channel statistics.
    x_train, _ = all_of(splits.train)
    x_all = torch.cat([x_train, all_of(splits.val)[0]]).double()
    assert x_train.dtype == torch.float32 and x_train.shape == (500, 1, 28, 28)
    assert abs(x_all.mean().item()) < 1e-4 and abs(x_all.std().item() - 1) < 1e-3
    assert abs(x_train.mean().item()) < 0.05 and abs(x_train.std().item() - 1) < 0.05


def test_torchvision_mnist_dataloader_matches_in_memory(fake_mnist):
    root, _ = fake_mnist
    memory = torchvision_dataset("mnist", root=str(root), val_size=100, augment=False)
    datasets = torchvision_dataset("mnist", root=str(root), val_size=100, augment=False, in_memory=False, num_workers=0)
    assert not datasets.in_memory and datasets.num_workers == 0
    assert datasets.input_shape == (1, 28, 28) and datasets.num_classes == 10
    for name in ("train_eval", "val", "test"):
        x, y = all_of(getattr(datasets, name))
        x_ref, y_ref = all_of(getattr(memory, name))
        torch.testing.assert_close(x, x_ref, atol=1e-5, rtol=0)
        assert torch.equal(y, y_ref)
    loader, in_memory = train_feed(datasets, 3, CPU), train_feed(memory, 3, CPU)
    assert isinstance(loader, LoaderBatches) and len(loader) == 500
    sizes = every(64, 500)  # 500 = 7 * 64 + 52: a partial last step
    assert_same_steps(collect(loader, 1, sizes), collect(in_memory, 1, sizes), atol=1e-5)


@pytest.mark.parametrize("exists", [True, False])
def test_torchvision_without_files_asks_for_download(tmp_path, exists):
    root = tmp_path / "empty"
    if exists:
        root.mkdir()
    with pytest.raises(ConfigError) as info:
        torchvision_dataset("mnist", root=str(root))
    assert info.value.key == "data.download"
    assert "data.download=true" in str(info.value)
    assert root.exists() == exists  # nothing is created without download=True


def test_torchvision_unknown_set_names_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError) as info:
        torchvision_dataset("svhn", root=str(tmp_path))
    assert info.value.key == "data.name" and "cifar10" in str(info.value)


def test_crop_padding_is_black_after_normalisation():
    # Padding must be what a zero pixel normalises to (-mean/std), as torchvision's RandomCrop
    # gives when it pads the raw image, not the mean colour (0 after normalising).
    white = torch.full((64, 1, 8, 8), 255, dtype=torch.uint8)
    mean, std = torch.full((1, 1, 1, 1), 0.5), torch.full((1, 1, 1, 1), 0.25)
    split = TensorSplit(white, torch.zeros(64, dtype=torch.long), mean, std)
    batches = TensorBatches(split, seed=0, augment=Augment(crop_padding=2))
    x, _, _ = next(batches.steps(0, [64]))
    values = set(x.unique().tolist())
    assert values == {2.0, -2.0}  # white (1 - 0.5) / 0.25 and black (0 - 0.5) / 0.25


def test_download_without_a_network_is_a_clear_error(tmp_path, monkeypatch):
    # The real downloader, pointed at a closed port on this machine (no other address is tried).
    import torchvision

    monkeypatch.setattr(torchvision.datasets.MNIST, "mirrors", ["http://127.0.0.1:9/"])
    with pytest.raises(ConfigError) as info:
        torchvision_dataset("mnist", root=str(tmp_path / "dl"), download=True)
    assert info.value.key == "data.download" and info.value.value is True
    assert "could not download mnist" in str(info.value) and "127.0.0.1" in str(info.value)
