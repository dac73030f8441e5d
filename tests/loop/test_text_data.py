"""data=text's sources other than the default: a user's text files split deterministically, the token
shards nanoGPT and llm.c write (written here in their documented formats, read back memory-mapped),
and the Hugging Face path, which says in one line what it lacks."""

import numpy as np
import pytest
import torch

from bsexp.engine.text import HEADER_INTS, read_shard, text
from bsexp.errors import ConfigError

DEFAULTS = dict(
    source="auto",
    path=None,
    context=8,
    seed=0,
    val_size=1000,
    val_fraction=0.25,
    train_tokens=4096,
    order=2,
    symbols=16,
    branching=4,
    vocab=None,
    name=None,
    max_bytes=1000,
)


def splits_of(**overrides):
    return text(**(DEFAULTS | overrides))


def every_token(split) -> torch.Tensor:
    """The tokens a split's windows cover, in order (windows `context` apart: each target once)."""
    x, y = split.batch(torch.arange(len(split)))
    return torch.cat([x[:, :1], y], dim=1).flatten() if len(split) == 1 else torch.cat([x[0, :1], y.flatten()])


def write_llmc(path, tokens: np.ndarray, magic: int = 20240520) -> None:
    """llm.c's shard: 256 int32 (magic, version 1, the token count, zeros), then the tokens."""
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:3] = magic, 1, len(tokens)
    path.write_bytes(header.tobytes() + tokens.tobytes())


def test_a_folder_of_text_files_splits_its_bytes_first_train_then_val(tmp_path):
    (tmp_path / "b.txt").write_bytes(b"the second file " * 40)
    (tmp_path / "a.txt").write_bytes(b"a first file of text " * 50)
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "z.txt").write_bytes(b"never read")
    data = (tmp_path / "a.txt").read_bytes() + (tmp_path / "b.txt").read_bytes()  # sorted by name
    splits = splits_of(path=str(tmp_path))
    cut = int(len(data) * 0.75)
    assert splits.tokens.source.startswith(f"files under {tmp_path} ({len(data):,} bytes)")
    assert splits.num_classes == 256 and splits.input_shape == (8,)
    assert splits.val.context == 8 and len(splits.train) == (cut - 9) // 8 + 1
    train = every_token(splits.train)
    assert bytes(train.tolist()) == data[: len(train)]  # the first bytes, in order, each a target once
    assert bytes(every_token(splits.val).tolist()) == data[cut : cut + len(every_token(splits.val))]
    again = splits_of(path=str(tmp_path))
    idx = torch.arange(len(again.train_eval))
    assert torch.equal(again.train_eval.batch(idx)[0], splits.train_eval.batch(idx)[0])  # deterministic


def test_one_text_file_is_read_and_too_little_text_is_one_clear_error(tmp_path):
    (tmp_path / "t.txt").write_bytes(bytes(range(256)) * 4)
    assert len(splits_of(path=str(tmp_path / "t.txt")).train) == (768 - 9) // 8 + 1
    (tmp_path / "short.txt").write_bytes(b"tiny")
    with pytest.raises(ConfigError, match="data.context=8: the data .* too few; give more text or a shorter"):
        splits_of(path=str(tmp_path / "short.txt"))
    with pytest.raises(ConfigError, match="data.path=.*nowhere: no such file or folder"):
        splits_of(path=str(tmp_path / "nowhere"))


@pytest.mark.parametrize("dtype, magic", [(np.uint16, 20240520), (np.uint32, 20240801)])
def test_an_llmc_shard_is_read_memory_mapped_as_written(tmp_path, dtype, magic):
    tokens = np.random.default_rng(0).integers(0, 50257, 1000).astype(dtype)
    write_llmc(tmp_path / "fineweb_train_000001.bin", tokens, magic)
    shard = read_shard(tmp_path / "fineweb_train_000001.bin")
    assert isinstance(shard, np.memmap) and shard.dtype == dtype and np.array_equal(shard, tokens)


def test_shards_train_and_validate_by_name_and_their_windows_are_the_written_tokens(tmp_path):
    rng = np.random.default_rng(1)
    train = [rng.integers(0, 50257, n).astype(np.uint16) for n in (500, 300)]
    val = rng.integers(0, 50257, 200).astype(np.uint16)
    write_llmc(tmp_path / "fw_train_000001.bin", train[0])
    write_llmc(tmp_path / "fw_train_000002.bin", train[1])
    (tmp_path / "fw_val_000000.bin").write_bytes(val.tobytes())  # nanoGPT's val.bin: raw uint16, no header
    splits = splits_of(path=str(tmp_path), val_size=10)
    assert splits.num_classes == 50257 and splits.tokens.bytes_per_token is None and splits.tokens.floor is None
    # Windows stay within their shard: (500 - 9) // 8 + 1 and (300 - 9) // 8 + 1 of them.
    assert len(splits.train) == 62 + 37 and len(splits.val) == 10
    x, y = splits.train.batch(torch.tensor([0, 61, 62, 98]))
    expected = [train[0][0:9], train[0][488:497], train[1][0:9], train[1][288:297]]
    assert torch.equal(torch.cat([x, y[:, -1:]], dim=1), torch.from_numpy(np.stack(expected).astype(np.int64)))
    vx, vy = splits.val.batch(torch.tensor([3]))
    assert vx.tolist() == [val[24:32].tolist()] and vy.tolist() == [val[25:33].tolist()]


def test_shards_without_validation_and_a_damaged_shard_are_refused(tmp_path):
    write_llmc(tmp_path / "train.bin", np.arange(100, dtype=np.uint16))
    with pytest.raises(ConfigError, match="needs token shards for training and for validation"):
        splits_of(path=str(tmp_path))
    (tmp_path / "val.bin").write_bytes(b"\x01\x02\x03")  # an odd number of bytes: no uint16 tokens
    with pytest.raises(ConfigError, match="neither an llm.c shard .* nor raw uint16 tokens"):
        splits_of(path=str(tmp_path))


def test_the_hugging_face_path_says_what_it_lacks_in_one_line(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # where `datasets` is installed: no network either
    with pytest.raises(ConfigError) as caught:
        splits_of(source="hf", name="roneneldan/TinyStories")
    assert "\n" not in str(caught.value)
    assert "pip install -e '.[text]'" in str(caught.value) or "could not read the dataset" in str(caught.value)
    with pytest.raises(ConfigError, match="data.name=None: data.source=hf needs a dataset name"):
        splits_of(source="hf")


def test_the_markov_source_takes_a_tokenizers_vocabulary_of_which_its_bytes_use_256():
    # GPT-2's 50,257 tokens: the model's embedding and output at that size (scripts/bench_gpu.py's
    # 124M GPT), the same bytes and floor as at 256; fewer than the bytes need is refused.
    args = dict(source="markov", path=None, context=16, seed=0, val_size=8, val_fraction=0.1, train_tokens=1024)
    args.update(order=2, symbols=16, branching=4, name=None, max_bytes=1)
    wide, bytes_ = text(**args, vocab=50257), text(**args, vocab=None)
    assert (wide.num_classes, bytes_.num_classes) == (50257, 256)
    idx = torch.arange(len(wide.train))
    assert all(torch.equal(a, b) for a, b in zip(wide.train.batch(idx), bytes_.train.batch(idx)))
    assert wide.tokens.floor == bytes_.tokens.floor
    with pytest.raises(ConfigError, match="data.vocab=100: the Markov source's bytes need 256 tokens"):
        text(**args, vocab=100)
