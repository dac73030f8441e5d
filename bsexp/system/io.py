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


class Unreadable(ValueError):
    """A file missing, cut short, not JSON, or not the JSON object it should hold; the message
    names the file and which."""


def read_json_object(path: Path, what: str = "JSON object") -> dict[str, Any]:
    """The JSON object a file holds (`what` it should be, for the message), or Unreadable."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Unreadable(f"{path} cannot be read ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise Unreadable(f"{path} holds no {what} (a JSON object): it holds {type(data).__name__}")
    return data
