"""Datasets: the built-in builders and the `Splits` every builder returns.

A dataset builder (`data._target_`) returns `Splits`. Data that fits is held as tensors on the
training device (and batched by index, with on-device crop/flip for image sets: bsexp.engine.feed);
a builder may instead return torch `Dataset`s, which are read through a `DataLoader` with workers.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from bsexp.config.schema import VISION_SETS
from bsexp.errors import ConfigError
from bsexp.system.io import atomic_write


@dataclass
class TensorSplit:
    """Samples held as tensors; `x` may be stored as uint8 and normalised per batch."""

    x: torch.Tensor
    y: torch.Tensor
    mean: torch.Tensor | None = None  # per channel, for uint8 images
    std: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.y)

    @property
    def device(self) -> torch.device:
        return self.x.device

    @property
    def black(self) -> float | torch.Tensor:
        """The normalised value of a zero pixel: what crop padding fills with."""
        return 0.0 if self.mean is None else -self.mean / self.std

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x[idx]
        if self.mean is not None:
            x = (x.float() / 255.0 - self.mean) / self.std
        return x, self.y[idx]

    def subset(self, idx: torch.Tensor) -> TensorSplit:
        return TensorSplit(self.x[idx], self.y[idx], self.mean, self.std)

    def to(self, device: torch.device) -> TensorSplit:
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return TensorSplit(move(self.x), move(self.y), move(self.mean), move(self.std))


class TokenWindows:
    """Samples that are windows of a token stream (a language model's data): sample i is the
    `context` tokens from `starts[i]` (the model's input) and the `context` tokens one further on
    (its targets: each position's next token). The stream may be a tensor on the training device
    or a numpy array or memmap on disk, of which only the windows a batch asks for are read."""

    def __init__(self, tokens, context: int, starts: torch.Tensor, device: torch.device | None = None) -> None:
        self.tokens, self.context, self.starts = tokens, context, starts
        self.device = device or (tokens.device if isinstance(tokens, torch.Tensor) else torch.device("cpu"))

    @classmethod
    def of(cls, tokens, context: int, stride: int | None = None, limit: int | None = None) -> TokenWindows:
        """Every window of `tokens` `stride` apart (default `context`: each token a target once),
        the first `limit` of them where given."""
        count = max(0, (len(tokens) - context - 1) // (stride or context) + 1)
        count = count if limit is None else min(count, limit)
        return cls(tokens, context, torch.arange(count, dtype=torch.long) * (stride or context))

    def __len__(self) -> int:
        return len(self.starts)

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self.starts[idx.to(self.starts.device)]
        if isinstance(self.tokens, torch.Tensor):
            span = starts[:, None] + torch.arange(self.context + 1, device=self.tokens.device)
            windows = self.tokens[span].long()
        else:  # read from disk: only these windows
            span = starts.numpy()[:, None] + np.arange(self.context + 1)
            windows = torch.from_numpy(np.asarray(self.tokens[span], dtype=np.int64)).to(self.device)
        return windows[:, :-1], windows[:, 1:]

    def subset(self, idx: torch.Tensor) -> TokenWindows:
        return TokenWindows(self.tokens, self.context, self.starts[idx.to(self.starts.device)], self.device)

    def to(self, device: torch.device) -> TokenWindows:
        """Tokens held in memory move with their window starts (a batch is then gathered on the
        device alone); tokens on disk stay there, read into batches sent to `device`."""
        if isinstance(self.tokens, torch.Tensor):
            return TokenWindows(self.tokens.to(device), self.context, self.starts.to(device), device)
        return TokenWindows(self.tokens, self.context, self.starts, device)


# Splits whose samples are batched by index on the training device (bsexp.engine.feed).
INDEXED = (TensorSplit, TokenWindows)
Split = TensorSplit | TokenWindows | Dataset


@dataclass(frozen=True)
class Augment:
    """Random crop (zero padding of `crop_padding` pixels) and horizontal flip, on device."""

    crop_padding: int = 0
    hflip: bool = False


@dataclass(frozen=True)
class TokenInfo:
    """What a language model's data is in tokens: the tokens a sample holds (its context), the
    bytes of text a token stands for on average (1 for bytes; None where unknown, as for shards
    of another tokenizer's tokens), and the loss a perfect model would reach (nats per token;
    None where unknown): the source's entropy rate, and the floor over a window of the context,
    whose first tokens have less to condition on."""

    context: int
    bytes_per_token: float | None = 1.0
    entropy_rate: float | None = None
    floor: float | None = None
    source: str = ""  # where the tokens came from, in words

    def bits_per_byte(self, loss: float | None) -> float | None:
        """A loss in nats per token as bits per byte of text, where a token's bytes are known."""
        if loss is None or self.bytes_per_token is None:
            return None
        return loss / math.log(2) / self.bytes_per_token

    def record(self, samples_seen: int, samples_per_s: float, val_loss: float) -> dict[str, float | None]:
        """What a metrics record adds for a language model: tokens seen, tokens/s, bits per byte."""
        return {
            "tokens_seen": samples_seen * self.context,
            "tokens_per_s": samples_per_s * self.context,
            "val_bpb": self.bits_per_byte(val_loss),
        }

    def summary(self, batch_size: int, samples_seen: int, samples_per_s: float | None, val_loss: float | None):
        """What summary.json adds for a language model: the batch and throughput in tokens, the
        loss against the data's floor, and bits per byte."""
        return {
            "context": self.context,
            "tokens_per_step": batch_size * self.context,
            "tokens_seen": samples_seen * self.context,
            "tokens_per_s": None if samples_per_s is None else samples_per_s * self.context,
            "val_bpb": self.bits_per_byte(val_loss),
            "loss_floor": self.floor,  # nats per token: what a perfect model reaches on windows of the context
            "entropy_rate": self.entropy_rate,
            "loss_above_floor": None if val_loss is None or self.floor is None else val_loss - self.floor,
            "text_source": self.source,
        }


@dataclass(kw_only=True)
class Splits:
    name: str
    train: Split
    train_eval: Split  # a fixed train subset, the size of `val`, never augmented
    val: Split
    test: Split | None
    input_shape: tuple[int, ...]
    num_classes: int
    augment: Augment | None = None  # applied to in-memory train batches
    num_workers: int = 0  # for Dataset splits
    tokens: TokenInfo | None = None  # a language model's data: what its samples are in tokens

    @property
    def in_memory(self) -> bool:
        return isinstance(self.train, INDEXED)

    def to(self, device: torch.device) -> Splits:
        if not self.in_memory:
            return self
        move = lambda s: None if s is None else s.to(device)  # noqa: E731
        return dataclasses.replace(
            self, train=move(self.train), train_eval=move(self.train_eval), val=move(self.val), test=move(self.test)
        )


# ---------------------------------------------------------------------------- builders


def _split_train(n: int, val_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic (train, val) index split of n samples, seeded by the data seed. Val may
    take at most half, so that train accuracy is measured on as many samples as val accuracy."""
    if not 0 < val_size <= n // 2:
        raise ConfigError(
            "data.val_size", val_size, f"must be between 1 and {n // 2}, half of the {n} training samples"
        )
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return order[val_size:], order[:val_size]


def _tensor_splits(
    name: str,
    x: torch.Tensor,
    y: torch.Tensor,
    test: tuple[torch.Tensor, torch.Tensor] | None,
    val_size: int,
    seed: int,
    num_classes: int,
    mean: torch.Tensor | None = None,
    std: torch.Tensor | None = None,
    augment: Augment | None = None,
) -> Splits:
    train_idx, val_idx = _split_train(len(y), val_size, seed)
    train = TensorSplit(x[train_idx], y[train_idx], mean, std)
    eval_idx = torch.randperm(len(train_idx), generator=torch.Generator().manual_seed(seed + 1))
    return Splits(
        name=name,
        train=train,
        train_eval=train.subset(eval_idx[:val_size]),
        val=TensorSplit(x[val_idx], y[val_idx], mean, std),
        test=None if test is None else TensorSplit(test[0], test[1], mean, std),
        input_shape=tuple(x.shape[1:]),
        num_classes=num_classes,
        augment=augment,
    )


def _writable_root(root: str) -> Path:
    path = Path(root).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("data.root", root, f"cannot create the data directory ({exc.strerror})") from None
    return path


def mnist1d(root: str, val_size: int, seed: int, num_samples: int, train_split: float) -> Splits:
    """MNIST-1D (Greydanus 2020), generated locally and cached; the schema's defaults
    (bsexp.config.schema.MNIST1DData) give the published 4000 train / 1000 test split (val
    carved out of train). Every builder takes its node's keys; their defaults live in the schema."""
    if num_samples < 20:
        raise ConfigError("data.num_samples", num_samples, "must be at least 20 (10 classes, two splits)")
    if not 0.0 < train_split < 1.0:
        raise ConfigError("data.train_split", train_split, "must be strictly between 0 and 1")
    cache = _writable_root(root) / "mnist1d" / f"mnist1d-n{num_samples}-s{seed}-t{train_split}.pt"
    if cache.exists():
        data = torch.load(cache)
    else:
        data = _generate_mnist1d(num_samples, seed, train_split)
        atomic_write(cache, lambda out: torch.save(data, out))  # concurrent jobs never see half of it
    return _tensor_splits("mnist1d", data["x"], data["y"], (data["x_test"], data["y_test"]), val_size, seed, 10)


def _generate_mnist1d(num_samples: int, seed: int, train_split: float) -> dict[str, torch.Tensor]:
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed, args.train_split = num_samples, seed, train_split
    # make_dataset seeds the global numpy and random generators; leave them as they were.
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        raw = make_dataset(args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    as_x = lambda a: torch.tensor(a, dtype=torch.float32).unsqueeze(1)  # noqa: E731  (N, 1, 40)
    return {
        "x": as_x(raw["x"]),
        "y": torch.tensor(raw["y"], dtype=torch.long),
        "x_test": as_x(raw["x_test"]),
        "y_test": torch.tensor(raw["y_test"], dtype=torch.long),
    }


def digits(val_size: int, seed: int) -> Splits:
    """scikit-learn's bundled 8×8 digits (1797 images, no separate test split), read straight
    from the CSV file scikit-learn ships (importing sklearn.datasets takes seconds)."""
    import importlib.util

    sklearn_dir = Path(importlib.util.find_spec("sklearn").origin).parent
    table = np.loadtxt(sklearn_dir / "datasets" / "data" / "digits.csv.gz", delimiter=",", dtype=np.float32)
    x = torch.from_numpy(table[:, :64]).reshape(-1, 1, 8, 8) / 16.0
    y = torch.from_numpy(table[:, 64]).long()
    train = x[_split_train(len(y), val_size, seed)[0]]  # standardise with the training split's statistics
    return _tensor_splits("digits", (x - train.mean()) / train.std(), y, None, val_size, seed, 10)


def torchvision_dataset(
    name: str,
    root: str,
    download: bool,
    val_size: int,
    seed: int,
    augment: bool,
    crop_padding: int,
    hflip: bool,
    in_memory: bool,
    num_workers: int,
) -> Splits:
    """A torchvision image set. Files are read from `root`; fetched only with `download=True`."""
    if name not in VISION_SETS:
        raise ConfigError("data.name", name, f"valid: {', '.join(VISION_SETS)}")
    import torchvision

    cls = getattr(torchvision.datasets, VISION_SETS[name][0])
    folder = _writable_root(root) if download else Path(root).expanduser()
    try:
        train_set = cls(str(folder), train=True, download=download)
        test_set = cls(str(folder), train=False, download=download)
    except RuntimeError as exc:
        if not download and "download=True" in str(exc):
            raise ConfigError(
                "data.download",
                False,
                f"{name} files are missing under {folder}; set data.download=true to fetch them "
                f"(needs the network) or point data.root at a copy",
            ) from None
        raise _download_error(name, folder, exc) from None
    except OSError as exc:  # URLError and socket errors when the network is unreachable
        raise _download_error(name, folder, exc) from None

    x, y = _image_tensor(train_set.data), torch.as_tensor(train_set.targets, dtype=torch.long)
    x_test, y_test = _image_tensor(test_set.data), torch.as_tensor(test_set.targets, dtype=torch.long)
    train = x[_split_train(len(y), val_size, seed)[0]].float() / 255.0  # statistics of the training split
    mean, std = train.mean(dim=(0, 2, 3)).view(1, -1, 1, 1), train.std(dim=(0, 2, 3)).view(1, -1, 1, 1)
    aug = Augment(crop_padding, hflip) if augment else None
    if in_memory:
        return _tensor_splits(name, x, y, (x_test, y_test), val_size, seed, VISION_SETS[name][1], mean, std, aug)
    return _dataset_splits(
        name,
        train_set,
        test_set,
        x.shape[1:],
        VISION_SETS[name][1],
        val_size,
        seed,
        mean.flatten(),
        std.flatten(),
        aug,
        num_workers,
    )


def _download_error(name: str, folder: Path, exc: BaseException) -> ConfigError:
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return ConfigError("data.download", True, f"could not download {name} into {folder}: {reason}")


def _image_tensor(data) -> torch.Tensor:
    """uint8 NCHW from torchvision's NHW (MNIST) or NHWC numpy (CIFAR) storage."""
    x = torch.as_tensor(np.asarray(data))
    return x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2).contiguous()


def _dataset_splits(
    name,
    train_set,
    test_set,
    input_shape,
    num_classes,
    val_size,
    seed,
    mean,
    std,
    augment: Augment | None,
    num_workers: int,
) -> Splits:
    from torchvision.transforms import v2

    plain = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean.tolist(), std.tolist())])
    steps = [v2.ToImage()]
    if augment is not None and augment.crop_padding:
        steps.append(v2.RandomCrop(input_shape[-1], padding=augment.crop_padding))
    if augment is not None and augment.hflip:
        steps.append(v2.RandomHorizontalFlip())
    train_tf = v2.Compose(steps + [v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean.tolist(), std.tolist())])
    y = torch.as_tensor(train_set.targets)
    train_idx, val_idx = _split_train(len(y), val_size, seed)
    eval_idx = torch.randperm(len(train_idx), generator=torch.Generator().manual_seed(seed + 1))
    augmented = _Transformed(train_set, train_tf)
    clean = _Transformed(train_set, plain)
    return Splits(
        name=name,
        train=Subset(augmented, train_idx.tolist()),
        train_eval=Subset(clean, train_idx[eval_idx[:val_size]].tolist()),
        val=Subset(clean, val_idx.tolist()),
        test=_Transformed(test_set, plain),
        input_shape=tuple(input_shape),
        num_classes=num_classes,
        num_workers=num_workers,
    )


class _Transformed(Dataset):
    """A torchvision dataset read raw (PIL image, label) with our own transform applied."""

    def __init__(self, dataset, transform) -> None:
        self.dataset, self.transform = dataset, transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i):
        image, label = self.dataset[i]
        return self.transform(image), label


def synthetic(
    shape: Sequence[int],
    num_classes: int,
    num_samples: int,
    val_size: int,
    test_size: int,
    noise: float,
    seed: int,
    in_memory: bool,
    num_workers: int,
) -> Splits:
    """Gaussian classes of any input shape: x = mean[y] + noise·N(0, 1). For probing and benchmarks."""
    shape = tuple(int(s) for s in shape)
    if not shape or min(shape) < 1:
        raise ConfigError("data.shape", list(shape), "must be a non-empty list of positive sizes")
    if num_classes < 2:
        raise ConfigError("data.num_classes", num_classes, "must be at least 2")
    if test_size < 0:
        raise ConfigError("data.test_size", test_size, "must be >= 0")
    generator = torch.Generator().manual_seed(seed)
    means = torch.randn((num_classes, *shape), generator=generator)
    total = num_samples + test_size
    y = torch.randint(0, num_classes, (total,), generator=generator)
    x = means[y] + noise * torch.randn((total, *shape), generator=generator)
    test = (x[num_samples:], y[num_samples:]) if test_size else None
    splits = _tensor_splits("synthetic", x[:num_samples], y[:num_samples], test, val_size, seed, num_classes)
    if in_memory:
        return splits
    as_dataset = lambda s: None if s is None else torch.utils.data.TensorDataset(s.x, s.y)  # noqa: E731
    return Splits(
        name="synthetic",
        train=as_dataset(splits.train),
        train_eval=as_dataset(splits.train_eval),
        val=as_dataset(splits.val),
        test=as_dataset(splits.test),
        input_shape=splits.input_shape,
        num_classes=num_classes,
        num_workers=num_workers,
    )
