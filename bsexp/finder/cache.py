"""`batch.finder.cache=true`: a found size reused for the same question — the same model,
optimizer, input, precision, device and memory limit, global batch kept and largest size asked."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from bsexp.engine.datasets import Splits
from bsexp.engine.distributed import World
from bsexp.finder.result import FinderResult
from bsexp.finder.server import CACHE_CAPACITY
from bsexp.system import memory
from bsexp.system.io import write_json


def cache_key(cfg: DictConfig, world: World, splits: Splits, keep_size: int | None, largest: int | None) -> str:
    parts = {
        # The answer depends on the global batch kept (its micro-batch must divide it) and on the
        # largest size asked for, besides what decides the memory.
        "keep_size": keep_size,
        "largest": largest,
        "model": OmegaConf.to_container(cfg.model, resolve=True, enum_to_str=True),
        "optimizer": OmegaConf.to_container(cfg.optimizer, resolve=True, enum_to_str=True),
        "finder": OmegaConf.to_container(cfg.batch.finder, resolve=True, enum_to_str=True),
        "input_shape": list(splits.input_shape),
        "classes": splits.num_classes,
        "train": len(splits.train),
        "precision": str(cfg.precision),
        "world": world.size,
        # A limit of the machine's own varies with what else runs; the machine identifies it.
        "limit": cfg.batch.finder.memory_limit_gb or f"auto:{memory.total_memory()}",
        "device": torch.cuda.get_device_name(world.device) if world.device.type == "cuda" else "cpu",
        "eval_batch_size": cfg.trainer.eval_batch_size,
        "sync_batchnorm": cfg.distributed.sync_batchnorm,
        # What training's oneDNN kernel cache will keep, left out of the trials' room since
        # version 2 (answers stored before left no room for it).
        "kernel_cache": os.environ.get(CACHE_CAPACITY),
        "version": 3,
    }
    parts["finder"].pop("cache", None)
    parts["finder"].pop("cache_dir", None)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def cache_load(cfg: DictConfig, key: str) -> dict | None:
    path = Path(cfg.batch.finder.cache_dir).expanduser() / f"{key}.json"
    if not cfg.batch.finder.cache or not path.exists():
        return None
    return json.loads(path.read_text())


def cache_store(cfg: DictConfig, key: str, result: FinderResult) -> None:
    if not cfg.batch.finder.cache:
        return
    path = Path(cfg.batch.finder.cache_dir).expanduser() / f"{key}.json"
    write_json(path, result.to_json())
