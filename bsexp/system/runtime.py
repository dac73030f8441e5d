"""The process's runtime: device, seeds, precision, memory and provenance."""

from __future__ import annotations

import contextlib
import os
import platform
import random
import resource
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import bsexp
from bsexp.errors import ConfigError


def resolve_device(choice: str, local_rank: int = 0, cuda_devices: int | None = None) -> torch.device:
    """The device this process trains on, with its index: the GPU of its local rank (torchrun's
    one process per GPU), else the CPU. A bare `cuda` never leaves here: torch's memory caps and
    statistics refuse a device without an index. `cuda_devices`: the GPUs visible (torch is asked
    when None; counting them does not initialise CUDA)."""
    choice = str(choice)
    if cuda_devices is None:
        cuda_devices = 0 if choice == "cpu" else torch.cuda.device_count()
    if choice == "cpu" or (choice == "auto" and cuda_devices == 0):
        return torch.device("cpu")
    if cuda_devices == 0:
        raise ConfigError("device", choice, "CUDA is not available here; valid: auto, cpu")
    if local_rank >= cuda_devices:
        raise ConfigError(
            "device",
            choice,
            f"local rank {local_rank} has no GPU of its own ({gpus(cuda_devices)} "
            f"visible); valid: at most {cuda_devices} ranks per node, or device=cpu",
        )
    return torch.device("cuda", local_rank)


def gpus(count: int) -> str:
    return f"{count} GPU" + ("" if count == 1 else "s")


def seed_everything(seed: int, deterministic: bool, speed: Speed | None = None) -> None:
    """Seed every generator, and set how torch computes for the whole process (each run sets
    every flag, so that a run in a process another ran in does not inherit its)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    fast = speed is not None and speed.fast
    deterministic = deterministic and not fast
    if deterministic:
        # cuBLAS needs a fixed workspace to be deterministic; ops with no deterministic kernel warn.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    # The autotuner times algorithms (fastest, not the same each run), where they are worth timing:
    # set again once the model is known (bsexp.engine.build.wrap_model; Speed.cudnn_benchmark).
    torch.backends.cudnn.benchmark = speed is not None and speed.cudnn_benchmark
    # TF32 (10 mantissa bits) for fp32 matrix products; torch's own defaults on the reproducible path.
    torch.backends.cuda.matmul.allow_tf32 = fast
    torch.backends.cudnn.allow_tf32 = True


@dataclass(frozen=True, kw_only=True)
class Speed:
    """How a run computes, resolved once from trainer.speed (recorded in summary.json)."""

    fast: bool = False
    channels_last: bool = False  # image models' activations in NHWC, the layout tensor cores read
    compile: str | None = None  # torch.compile's mode (None: eager)
    fused_optimizer: bool = False  # the optimizer's update in one kernel over all parameters
    cuda: bool = False  # on a GPU: cuDNN's autotuner and TF32 apply (on the CPU they touch nothing)
    # cuDNN's autotuner: only for models that convolve images. It times every algorithm for each
    # new input shape and keeps their workspace: on ResNet-18 (bf16, batch 512, H200) the fast path
    # it is part of ran 1.9 x the reproducible one; on the default run (1-D convolutions of 40
    # samples, 560 steps) it cost 1.1 s of 4.5 s and 1 GB of workspace for kernels too small to gain.
    cudnn_benchmark: bool = False

    def summary(self) -> dict[str, Any]:
        return {
            "fast": self.fast,
            "cudnn_benchmark": self.cudnn_benchmark and self.cuda,
            "tf32": self.fast and self.cuda,
            "channels_last": self.channels_last,
            "compile": self.compile,
            "fused_optimizer": self.fused_optimizer,
        }


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far (a recompile adds one)."""
    import sys

    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def speed_for(choice: str, device: torch.device, images: bool, compile_mode: str | None = None) -> Speed:
    """trainer.speed for a run on `device`: auto is fast on CUDA and reproducible on the CPU (the
    path the equivalence tests hold bit for bit). `images`: the model reads N x C x H x W inputs,
    whose convolutions run fastest in channels_last. torch.compile's mode: `compile_mode`
    (bsexp.config.checks.COMPILE_MODES, checked with the config; none: eager)."""
    mode = compile_mode or "none"
    fast = choice == "fast" or (choice == "auto" and device.type == "cuda")
    if not fast:
        return Speed()
    return Speed(
        fast=True,
        channels_last=images,
        compile=None if mode == "none" else mode,
        fused_optimizer=True,
        cuda=device.type == "cuda",
        cudnn_benchmark=images,
    )


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, precision: str):
    """A context factory: autocast for bf16/fp16, nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext
    dtype = DTYPES[precision]
    return lambda: torch.autocast(device.type, dtype=dtype)


def grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """Loss scaling only for fp16 (bf16 has fp32's range); disabled, it passes calls through."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> float:
    """CUDA: peak bytes allocated by tensors. CPU: the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def provenance() -> dict[str, str]:
    """Versions and the git revision of the code that produced a result."""
    root = Path(bsexp.__file__).resolve().parent.parent
    try:  # no index lock: a job killed meanwhile (a SLURM requeue) would leave a stale .git/index.lock
        rev = subprocess.run(
            ["git", "--no-optional-locks", "-C", str(root), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = "unknown"
    return {
        "bsexp": bsexp.__version__,
        "git": rev,
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def rng_state() -> dict:
    """Every random generator's state: python, numpy, torch, CUDA."""
    # CUDA's only once this process uses it: asking would start CUDA, whose context maps gigabytes
    # of address space (a CPU run, or the finder's probe under an address-space cap, on a GPU machine).
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
    }


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_initialized():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def preserved_rng():
    """Every random generator as it was, whatever happens inside (the finder's probing)."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


def cap_device_memory(device: torch.device, limit_bytes: int | None) -> None:
    """CUDA: let this process allocate at most `limit_bytes` on `device` (None: all of it)."""
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = 1.0 if limit_bytes is None else min(1.0, limit_bytes / total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)


def limit_memory(device: torch.device, limit_bytes: int) -> None:
    """Train as on a machine with `limit_bytes` of memory: on CUDA a per-process memory fraction,
    on CPU a cap on the address space (see bsexp.system.memory), so that exceeding it is a real OOM."""
    from bsexp.system import memory

    if device.type == "cuda":
        cap_device_memory(device, limit_bytes)
    else:
        memory.return_freed_memory()
        try:
            memory.cap_memory(limit_bytes)
        except memory.CapBelowUse as exc:
            from bsexp.errors import ConfigError

            raise ConfigError("trainer.memory_limit_gb", round(limit_bytes / 2**30, 3), str(exc)) from None


def unlimit_memory(device: torch.device) -> None:
    """Lift limit_memory's cap once the training it was for has ended (or failed): on CPU the
    address space's soft limit goes back to the hard one, so that reporting an out-of-memory error
    (its frames still hold the tensors that filled the cap) never itself runs out of memory."""
    from bsexp.system import memory

    if device.type != "cuda":
        memory.lift_memory_cap()


def run_speed(cfg, device: torch.device, model: torch.nn.Module | None = None) -> Speed:
    """trainer.speed resolved for this run (bsexp.system.runtime.speed_for): channels_last where the
    model convolves images."""
    images = model is not None and any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    return speed_for(str(cfg.trainer.speed), device, images, cfg.trainer.get("compile_mode"))
