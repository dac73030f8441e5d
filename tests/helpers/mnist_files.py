"""A small fake MNIST in the real IDX file format, so the torchvision path runs offline.

torchvision's `MNIST` reads `<root>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte`
(uncompressed; with `download=False` it only checks that the four files exist). IDX files are a
big-endian int32 magic number (0x0803 = 2051: unsigned bytes, 3 dimensions; 0x0801 = 2049: unsigned
bytes, 1 dimension), one big-endian int32 per dimension, then the raw uint8 data.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

IMAGE_MAGIC = 2051
LABEL_MAGIC = 2049
SIDE = 28


def write_idx_images(path: Path, images: np.ndarray) -> None:
    images = np.ascontiguousarray(images, dtype=np.uint8)
    n, rows, cols = images.shape
    header = np.array([IMAGE_MAGIC, n, rows, cols], dtype=">i4").tobytes()
    path.write_bytes(header + images.tobytes())


def write_idx_labels(path: Path, labels: np.ndarray) -> None:
    labels = np.ascontiguousarray(labels, dtype=np.uint8)
    header = np.array([LABEL_MAGIC, len(labels)], dtype=">i4").tobytes()
    path.write_bytes(header + labels.tobytes())


def fake_images(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Noisy images whose bright horizontal band (rows 2c+3 .. 2c+6) depends on the class c."""
    images = rng.integers(0, 60, size=(len(labels), SIDE, SIDE))
    for i, c in enumerate(labels):
        images[i, 2 * c + 3 : 2 * c + 7, 4:24] += 150
    return images.clip(0, 255).astype(np.uint8)


def write_fake_mnist(root: Path, num_train: int = 600, num_test: int = 100, seed: int = 0) -> dict:
    """Write the four MNIST raw files under `root/MNIST/raw/`; return the arrays written."""
    rng = np.random.default_rng(seed)
    raw = Path(root) / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for prefix, n in (("train", num_train), ("t10k", num_test)):
        labels = np.arange(n) % 10
        rng.shuffle(labels)
        images = fake_images(labels, rng)
        write_idx_images(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx_labels(raw / f"{prefix}-labels-idx1-ubyte", labels)
        arrays[f"{prefix}_images"], arrays[f"{prefix}_labels"] = images, labels.astype(np.int64)
    return arrays
