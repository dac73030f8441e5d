"""Read the records of an offline W&B run file (`run-<id>.wandb`).

The file is W&B's LevelDB-style log: a 7-byte header (":W&B", magic 0xBEE1, version 0), then
32 KiB blocks of chunks, each with a 7-byte header (CRC-32, length, type: 1 full, 2 first,
3 middle, 4 last). Each assembled record is a `wandb_internal_pb2.Record` protobuf.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
HEADER = 7


def records(path: Path) -> list:
    data = Path(path).read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:HEADER])
    assert ident == b":W&B" and magic == 0xBEE1, f"not a W&B run file: {path}"
    out, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < HEADER:  # the rest of a block too small for a header is padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if length == 0 and kind == 0:
            break
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def history(path: Path) -> list[dict]:
    """The logged rows, as {key: value} dicts."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows


def summary(path: Path) -> dict:
    values = {}
    for record in records(path):
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                values[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return values
