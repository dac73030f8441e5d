"""`data=text`: a language model's data, as `Splits` of token windows (bsexp.engine.datasets.TokenWindows).

A sample is one sequence of `data.context` tokens; the model's targets are the next tokens (the
window shifted by one), and its loss is per token. Four sources (`data.source`; `auto` picks the
Markov source without `data.path`, shards where the folder holds `.bin` files, else text files):

- `markov`: byte sequences drawn from a random sparse Markov chain over `data.symbols` bytes, of
  order `data.order`, fixed by `data.seed` and generated locally; its entropy rate is known exactly
  (bsexp.engine.markov), so a run's loss can be read against the floor no model can pass;
- `files`: a user's own text, a file or a folder of files (`data.path`), read as bytes (vocabulary
  256): the first 1 - `data.val_fraction` of the bytes train, the rest validate;
- `shards`: token shards as nanoGPT writes them (`train.bin`, `val.bin`: raw uint16) and as llm.c
  and modded-nanogpt write them (a header of 256 int32: magic 20240520, version 1, the token count;
  then uint16 tokens; magic 20240801 marks uint32 tokens), read through numpy.memmap: a batch reads
  its windows from disk, never the whole shard. A file whose name holds "val" validates;
- `hf`: a Hugging Face `datasets` corpus (`data.name`, e.g. roneneldan/TinyStories), read as
  UTF-8 bytes up to `data.max_bytes`: needs the `text` extra and the network (or its cache).

Training windows start every `context` tokens (each token a target once an epoch); the feed
shuffles them per seed and epoch. Validation reads the first `data.val_size` windows of the
held-out tokens; `train_eval` the same number of training windows, chosen by the data seed."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from bsexp.engine.datasets import Splits, TokenInfo, TokenWindows
from bsexp.engine.markov import MarkovSource
from bsexp.errors import ConfigError

SOURCES = ("auto", "markov", "files", "shards", "hf")
GPT2_VOCAB = 50257  # the tokens of GPT-2's tokenizer, which nanoGPT's and llm.c's shards hold
LLMC_MAGIC = {20240520: np.uint16, 20240801: np.uint32}  # llm.c's header: magic -> token type
HEADER_INTS = 256


def text(
    source: str,
    path: str | None,
    context: int,
    seed: int,
    val_size: int,
    val_fraction: float,
    train_tokens: int,
    order: int,
    symbols: int,
    branching: int,
    vocab: int | None,
    name: str | None,
    max_bytes: int,
) -> Splits:
    """The `data=text` builder (conf/data/text.yaml; the keys' defaults and bounds in the schema)."""
    if source == "auto":
        source = "markov" if path is None else ("shards" if _bin_files(Path(path).expanduser()) else "files")
    if source in ("files", "shards") and path is None:
        raise ConfigError("data.path", None, f"data.source={source} reads data.path: give a file or a folder")
    if source == "markov":
        markov = MarkovSource.of(order, symbols, branching, seed)
        return _markov_splits(markov, context, seed, val_size, train_tokens, vocab)
    if source == "files":
        data = _read_text(Path(path).expanduser())
        return _byte_splits(data, context, seed, val_size, val_fraction, f"files under {path}", vocab)
    if source == "shards":
        return _shard_splits(Path(path).expanduser(), context, seed, val_size, vocab)
    if source == "hf":
        data = _hf_bytes(name, max_bytes)
        return _byte_splits(data, context, seed, val_size, val_fraction, f"Hugging Face dataset {name}", vocab)
    raise ConfigError("data.source", source, f"valid: {', '.join(SOURCES)}")


def _splits(train: TokenWindows, val: TokenWindows, seed: int, val_size: int, vocab: int, info: TokenInfo) -> Splits:
    if len(train) < 2 or len(val) < 1:
        raise ConfigError(
            "data.context",
            info.context,
            f"the data ({info.source}) holds {len(train)} training and {len(val)} validation windows of "
            f"{info.context + 1} tokens: too few; give more text or a shorter context",
        )
    eval_idx = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed + 1))[: min(val_size, len(val))]
    return Splits(
        name="text",
        train=train,
        train_eval=train.subset(eval_idx),
        val=val,
        test=None,
        input_shape=(info.context,),
        num_classes=vocab,
        tokens=info,
    )


def _markov_splits(
    markov: MarkovSource, context: int, seed: int, val_size: int, train_tokens: int, vocab: int | None = None
) -> Splits:
    """Independent sequences of context + 1 bytes, each from the chain's stationary distribution:
    the floor over a window is then exact (MarkovSource.window_floor). `vocab`: the model's
    vocabulary, 256 (the bytes) or more (a tokenizer's size, such as GPT-2's 50,257, of which the
    bytes use 256: the model and its cost at that size, the floor unchanged)."""
    if vocab is not None and vocab < 256:
        raise ConfigError("data.vocab", vocab, "the Markov source's bytes need 256 tokens; valid: null or >= 256")
    n_train = max(2, train_tokens // context)
    rng = np.random.default_rng([seed, 1])
    train = markov.sequences(n_train, context + 1, rng)
    val = markov.sequences(val_size, context + 1, np.random.default_rng([seed, 2]))
    info = TokenInfo(
        context=context,
        bytes_per_token=1.0,
        entropy_rate=markov.entropy_rate,
        floor=markov.window_floor(context),
        source=f"a Markov source of order {markov.order} over {markov.symbols} bytes (seed {seed})",
    )
    windows = lambda seqs: TokenWindows.of(torch.from_numpy(seqs.reshape(-1)), context, stride=context + 1)  # noqa: E731
    return _splits(windows(train), windows(val), seed, val_size, vocab or 256, info)


def _read_text(path: Path) -> np.ndarray:
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p.relative_to(path)))
    else:
        raise ConfigError("data.path", str(path), "no such file or folder")
    if not files:
        raise ConfigError("data.path", str(path), "the folder holds no files")
    return np.concatenate([np.fromfile(f, dtype=np.uint8) for f in files])


def _hidden(relative: Path) -> bool:
    """A file under a hidden folder of data.path, or hidden itself (.git, .DS_Store): not text of the corpus."""
    return any(part.startswith(".") for part in relative.parts)


def _byte_splits(
    data: np.ndarray, context: int, seed: int, val_size: int, val_fraction: float, source: str, vocab: int | None
) -> Splits:
    """Bytes (vocabulary 256): the first 1 - val_fraction train, the rest validate."""
    if vocab is not None and vocab != 256:
        raise ConfigError("data.vocab", vocab, "text read as bytes has a vocabulary of 256; valid: null or 256")
    cut = int(len(data) * (1 - val_fraction))
    tokens = torch.from_numpy(data.copy())
    info = TokenInfo(context=context, bytes_per_token=1.0, source=f"{source} ({len(data):,} bytes)")
    train = TokenWindows.of(tokens[:cut], context)
    return _splits(train, TokenWindows.of(tokens[cut:], context, limit=val_size), seed, val_size, 256, info)


def _bin_files(path: Path) -> list[Path]:
    if path.is_file() and path.suffix == ".bin":
        return [path]
    return sorted(path.glob("*.bin")) if path.is_dir() else []


def read_shard(path: Path) -> np.ndarray:
    """A shard's tokens as a read-only memmap: llm.c's format where its header says so (magic,
    version 1, a token count that matches the file's size), else nanoGPT's raw uint16."""
    size = path.stat().st_size
    if size >= 4 * HEADER_INTS:
        header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
        dtype = LLMC_MAGIC.get(int(header[0]))
        if dtype is not None and header[1] == 1 and 4 * HEADER_INTS + int(header[2]) * np.dtype(dtype).itemsize == size:
            return np.memmap(path, dtype=dtype, mode="r", offset=4 * HEADER_INTS, shape=(int(header[2]),))
    if size % 2:
        raise ConfigError("data.path", str(path), "neither an llm.c shard (header) nor raw uint16 tokens (odd size)")
    return np.memmap(path, dtype=np.uint16, mode="r")


class ShardStream:
    """Several shards read as one stream of tokens, each window within one shard (a shard's end is
    a document's): `starts` holds only windows that fit in their shard."""

    def __init__(self, shards: list[np.ndarray]) -> None:
        self.shards = shards
        self.offsets = np.cumsum([0] + [len(s) for s in shards])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def starts(self, context: int, stride: int, limit: int | None = None) -> torch.Tensor:
        per = [
            offset + np.arange(max(0, (len(s) - context - 1) // stride + 1), dtype=np.int64) * stride
            for s, offset in zip(self.shards, self.offsets)
        ]
        found = torch.from_numpy(np.concatenate(per))
        return found if limit is None else found[:limit]

    def __getitem__(self, span: np.ndarray) -> np.ndarray:
        """Rows of consecutive positions (windows), each read from its own shard."""
        which = np.searchsorted(self.offsets, span[:, 0], side="right") - 1
        out = np.empty(span.shape, dtype=np.int64)
        for shard in np.unique(which):
            rows = which == shard
            out[rows] = self.shards[shard][span[rows] - self.offsets[shard]]
        return out


def _shard_splits(path: Path, context: int, seed: int, val_size: int, vocab: int | None) -> Splits:
    files = _bin_files(path)
    val_files = [f for f in files if "val" in f.name]
    train_files = [f for f in files if f not in val_files]
    if not train_files or not val_files:
        raise ConfigError(
            "data.path",
            str(path),
            "needs token shards for training and for validation (.bin files; those named *val* validate): "
            "nanoGPT's train.bin and val.bin, or llm.c's *_train_*.bin and *_val_*.bin",
        )
    train, val = (ShardStream([read_shard(f) for f in fs]) for fs in (train_files, val_files))
    vocab = vocab or GPT2_VOCAB
    info = TokenInfo(
        context=context,
        bytes_per_token=None,
        source=f"{len(train_files)} training, {len(val_files)} validation shard(s) in {path} ({len(train):,} tokens)",
    )
    return _splits(
        TokenWindows(train, context, train.starts(context, context)),
        TokenWindows(val, context, val.starts(context, context, limit=val_size)),
        seed,
        val_size,
        vocab,
        info,
    )


def _hf_bytes(name: str | None, max_bytes: int) -> np.ndarray:
    """The text of a Hugging Face dataset's train split as UTF-8 bytes, streamed up to max_bytes."""
    if not name:
        raise ConfigError(
            "data.name", name, "data.source=hf needs a dataset name, e.g. data.name=roneneldan/TinyStories"
        )
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            "data.source", "hf", "needs the Hugging Face datasets package: pip install -e '.[text]'"
        ) from None
    chunks, total = [], 0
    try:
        for row in datasets.load_dataset(name, split="train", streaming=True):
            text = row.get("text")
            if not isinstance(text, str):
                raise ConfigError("data.name", name, f"its rows have no text column (columns: {', '.join(row)})")
            chunk = (text + "\n").encode()
            chunks.append(chunk)
            total += len(chunk)
            if total >= max_bytes:
                break
    except ConfigError:
        raise
    except Exception as exc:  # no network, no such dataset: the library's own reason, on one line
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        offline = " (offline: HF_DATASETS_OFFLINE is set)" if os.environ.get("HF_DATASETS_OFFLINE") else ""
        raise ConfigError("data.name", name, f"could not read the dataset{offline}: {reason}") from None
    return np.frombuffer(b"".join(chunks)[:max_bytes], dtype=np.uint8)
