"""Files written whole or not at all: to a temporary name beside the target, then renamed, so a
reader (a resumed run, a sweep's report, a concurrent job) never sees half a file."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


def atomic_write(path: Path, write: Callable[[BinaryIO], None], durable: bool = False) -> Path:
    """`write` fills a temporary file, which then replaces `path`. `durable`: flushed to disk
    first, and the rename itself too (checkpoints: a crash leaves the previous file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as out:
        write(out)
        if durable:
            out.flush()
            os.fsync(out.fileno())
    os.replace(tmp, path)
    if durable:
        handle = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda out: out.write(text.encode("utf-8")))


def write_json(path: Path, obj: dict[str, Any]) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2) + "\n")
