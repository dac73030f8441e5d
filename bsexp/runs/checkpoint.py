"""Checkpoints: everything a run needs to go on as if it had never stopped, written atomically.

A checkpoint (`<run dir>/checkpoints/step-<step>.pt`) holds the model, optimizer and loss scaler;
every rank's random generators and running sums; where the run is (epoch, the step within it,
samples seen, the records logged so far, the batch and LR it started with); the batch policy's
state (the plan in force after a schedule change or an OOM recovery, what the finder chose); the
noise-scale averages; the W&B run id; and its format (`FORMAT`). It is written to a temporary file, flushed to disk and
renamed, so a crash leaves the previous one intact; the newest `checkpoint.keep` are kept. It
carries the SHA-256 digest of its bytes as written by torch.save, in the zip file's comment (so it
stays a file torch.load reads), checked on load: a checkpoint whose bytes changed on disk is
corrupt, never loaded.

`Checkpointer` is the loop's component (it decides its own interval); `restore` puts a freshly
built run where a checkpoint left it.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
import re
import struct
from dataclasses import asdict
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO

import torch
from omegaconf import DictConfig

import bsexp
from bsexp.engine.gradient_noise import NoiseScale
from bsexp.errors import ConfigError, one_line
from bsexp.runs.resume import CHECKPOINTS, NO_SUCH_CHECKPOINT, moved, pinned
from bsexp.system.io import atomic_write
from bsexp.system.runtime import rng_state, set_rng_state

log = logging.getLogger(__name__)

DIR = CHECKPOINTS
# The format a checkpoint is written in, and those this version resumes from, bit-identically:
#   2: the batch policy's state in one entry, and the LR scheduler's (main a76dc77 and before);
#   3: no LR scheduler: the LR and weight decay are a function of the step and the batch policy's
#      layout (bsexp.engine.optim.Hyperparameters), so a format-2 checkpoint's scheduler state is not read.
#   4: the digest of its bytes in the zip's comment (formats 2 and 3 carry none: read with a warning).
# tests/fixtures/checkpoints/ keeps one of each, written by the code that wrote that format.
FORMAT = 4
READS = (2, 3, 4)
DIGESTED = 4  # the first format that carries its digest
_NAME = re.compile(r"step-(\d+)\.pt$")
# The zip comment that carries the digest: this prefix, then the SHA-256 in hex. A zip ends with its
# end-of-central-directory record (22 bytes, the signature first), whose last 2 bytes give the
# comment's length; torch.save writes no comment.
_DIGEST = b"bsexp-sha256:"
_COMMENT = len(_DIGEST) + 64
_END = b"PK\x05\x06"


# ---------------------------------------------------------------------------- files


def checkpoints(run_dir: Path) -> list[Path]:
    """The run's checkpoints, newest first."""
    directory = Path(run_dir) / DIR
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.search(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


class _Digesting:
    """The file torch.save writes through: what it writes is hashed on the way, and its last 22
    bytes (the zip's end record) kept."""

    def __init__(self, out: BinaryIO) -> None:
        self.out, self.hash, self.tail = out, hashlib.sha256(), b""

    def write(self, data) -> int:
        self.hash.update(data)
        self.tail = (self.tail + bytes(data[-22:]))[-22:]
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


def write_digested(state: dict[str, Any], out: BinaryIO) -> None:
    """torch.save's zip of `state`, with the digest of its bytes as the zip's comment."""
    digesting = _Digesting(out)
    torch.save(state, digesting)
    if digesting.tail[:4] != _END or digesting.tail[-2:] != b"\0\0":
        raise ValueError("torch.save wrote no zip file without a comment: nowhere to put the digest")
    out.seek(-2, os.SEEK_END)
    out.write(struct.pack("<H", _COMMENT) + _DIGEST + digesting.hash.hexdigest().encode())


class Corrupt(ValueError):
    """A checkpoint whose bytes are not those written (the digest written with it disagrees)."""


def digest_of(data: bytes) -> str | None:
    """The digest a checkpoint's bytes carry (None where they carry none); Corrupt where it
    disagrees with them."""
    comment = data[-_COMMENT:]
    end = data[-_COMMENT - 22 : -_COMMENT]
    if not comment.startswith(_DIGEST) or end[:4] != _END or end[-2:] != struct.pack("<H", _COMMENT):
        return None
    written = comment[len(_DIGEST) :].decode("ascii", "replace")
    # The bytes as torch wrote them: the comment's length back to 0.
    found = hashlib.sha256(memoryview(data)[: -_COMMENT - 2])
    found.update(b"\0\0")
    if found.hexdigest() != written:
        raise Corrupt("its bytes differ from those written (the SHA-256 digest written with it does not match)")
    return written


def save(run_dir: Path, state: dict[str, Any], keep: int) -> Path:
    path = atomic_write(
        Path(run_dir) / DIR / f"step-{state['step']:09d}.pt",
        lambda out: write_digested({"format": FORMAT, **state}, out),
        durable=True,
    )
    for old in checkpoints(run_dir)[keep:]:
        old.unlink(missing_ok=True)
    return path


class UnknownFormat(ConfigError):
    """A checkpoint in a format this version of bsexp does not read (written by a newer one)."""

    def __init__(self, path: Path, found: object) -> None:
        super().__init__(
            "resume",
            str(path),
            f"is a checkpoint of format {found}; this bsexp ({bsexp.__version__}) "
            f"reads formats {READS[0]}-{READS[-1]}: resume it with the bsexp that "
            f"wrote it",
        )

    def __reduce__(self):
        return ConfigError, (self.key, self.value, self.expected)


class _Unpickler(pickle.Unpickler):
    """A checkpoint's classes where they live now: a release before the floors were folders (issue 56)
    pickled its model's class under the module's old name."""

    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(moved(module), name)


# torch.load's pickle_module: pickle, but for the Unpickler above
_PICKLE = ModuleType("bsexp_checkpoint_pickle")
_PICKLE.__dict__.update({k: v for k, v in vars(pickle).items() if not k.startswith("__")}, Unpickler=_Unpickler)


def load(path: Path) -> dict[str, Any]:
    """A checkpoint's state: its digest checked first (Corrupt where its bytes changed), then its
    format (UnknownFormat where this version does not read it). A format before digests is read
    with a warning that nothing could be checked."""
    data = Path(path).read_bytes()
    digest = digest_of(data)
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False, pickle_module=_PICKLE)
    if not isinstance(state, dict) or "format" not in state:
        raise ValueError("not a bsexp checkpoint")
    if state["format"] not in READS:
        raise UnknownFormat(path, state["format"])
    if digest is None and state["format"] >= DIGESTED:
        raise Corrupt(f"it carries no digest, which every checkpoint of format {state['format']} is written with")
    if digest is None:
        log.warning(
            "checkpoint %s is of format %d, written before checkpoints carried a digest: its bytes cannot be checked",
            path,
            state["format"],
        )
    return state


def newest_readable(run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads; unreadable ones (cut short, corrupt) are skipped with a warning."""
    for path in checkpoints(run_dir):
        try:
            return path, load(path)
        except UnknownFormat:  # not broken: another version's, whose run this one cannot continue
            raise
        except Exception as exc:  # noqa: BLE001 - whatever broke the file, the previous one may do
            log.warning(
                "checkpoint %s is %s (%s); trying the one before it",
                path,
                "corrupt" if isinstance(exc, Corrupt) else "unreadable",
                one_line(exc)[:160] or type(exc).__name__,
            )
    return None


# What find_early found, by (resume, run directory): the checkpoint and the warnings it gave.
_EARLY: dict[tuple[str, str], tuple[Any, list[logging.LogRecord]]] = {}


class _Held(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def find_early(resume: str, run_dir: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """`find`, before Hydra writes into the run (bsexp.train.preflight), so that what it refuses leaves
    the run as it was. What it finds, and its warnings (held until the job's logging is set up,
    or printed beside a refusal), are the job's `find`'s."""
    held = _Held()
    log.addHandler(held)
    log.propagate = False
    try:
        found = find(resume, Path(run_dir))
    except BaseException:
        for record in held.records:  # the refusal points to them
            print(record.getMessage(), flush=True)
        raise
    finally:
        log.removeHandler(held)
        log.propagate = True
    _EARLY[(str(resume), os.path.abspath(run_dir))] = (found, held.records)
    return found


def find(resume: str | None, run_dir: Path, restarted: bool = False) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint to resume from: `resume=auto` (or a torchrun restart) takes the newest
    readable one of the run directory, if any; `resume=PATH` that file (or that run's newest)."""
    if resume is None and not restarted:
        return None
    early = _EARLY.pop((str(resume), os.path.abspath(run_dir)), None)
    if early is not None:  # found before the job (bsexp.train.preflight); its warnings said now
        for record in early[1]:
            log.handle(record)
        return early[0]
    if resume is None or resume == "auto":
        found = newest_readable(run_dir)
        if found is None and (unreadable := checkpoints(run_dir)):  # starting over would write over the run
            raise ConfigError(
                "resume",
                resume or "auto",
                f"none of the {len(unreadable)} checkpoints in {Path(run_dir) / DIR} loads (each "
                f"is cut short or corrupt: see the warnings above); the run is left as it is: move "
                f"them aside to train it again from step 0",
            )
        if found is None:  # killed before its first checkpoint: the run's own config, from step 0
            log.warning("resume: no checkpoint in %s yet; starting the run from step 0", Path(run_dir) / DIR)
        return found
    path = Path(resume).expanduser()
    if path.is_dir():  # a run directory, or its checkpoints/
        found = newest_readable(path.parent if path.name == DIR else path)
        if found is None:
            raise ConfigError("resume", resume, "holds no readable checkpoint")
        return found
    if not path.is_file():
        raise ConfigError("resume", resume, NO_SUCH_CHECKPOINT)
    try:
        return path, load(path)
    except UnknownFormat:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ConfigError("resume", resume, f"is not a readable checkpoint ({one_line(exc)[:160]})") from None


# ---------------------------------------------------------------------------- a run's state


def identity(cfg: DictConfig, loop) -> dict[str, Any]:
    """What a checkpoint must share with the run that resumes from it."""
    return {
        "model": cfg.model._target_,
        "batch_size": loop.batch_control.layout.base_batch,
        "world_size": loop.world.size,
        "shapes": {k: list(v.shape) for k, v in loop.step.net.state_dict().items()},
    }


def mismatches(state: dict[str, Any], identity: dict[str, Any]) -> list[str]:
    """What differs between the run that wrote a checkpoint and this one, in the respects that make
    resuming meaningless: the model, its parameters' shapes, the global batch, the world size."""
    theirs = dict(state.get("identity", {}))
    if isinstance(theirs.get("model"), str):  # a model of bsexp's own named where it lived then
        theirs["model"] = moved(theirs["model"])
    found = []
    for key, what in (
        ("model", "model"),
        ("batch_size", "global batch"),
        ("world_size", "world size"),
        ("shapes", "parameter shapes"),
    ):
        if theirs.get(key) != identity.get(key):
            shown = "differ" if key == "shapes" else f"{theirs.get(key)} there, {identity.get(key)} here"
            found.append(f"{what} ({shown})")
    return found


class Checkpointer:
    """Saves the run every `every_steps` steps, at each epoch's end (`every_epoch`) and at its
    last step, keeping the newest `keep`; and at the first step at or past each of `at_samples`
    samples seen, kept for good as `samples-<mark>.pt` (a trunk's branch points). Every rank hands
    its random generators and running sums to rank 0, which writes."""

    def __init__(
        self,
        run_dir: Path,
        every_steps: int,
        every_epoch: bool,
        keep: int,
        cfg: DictConfig,
        at_samples: tuple[int, ...] = (),
    ) -> None:
        self.run_dir, self.every_steps, self.every_epoch, self.keep, self.cfg = (
            run_dir,
            every_steps,
            every_epoch,
            keep,
            cfg,
        )
        self.marks = sorted(m for m in set(at_samples) if not pinned(run_dir, m).exists())  # not yet saved

    @classmethod
    def of(cls, cfg: DictConfig, run_dir: Path) -> Checkpointer:
        """The run's checkpointer, as its config's checkpoint.* says."""
        node = cfg.checkpoint
        return cls(run_dir, node.every_steps, node.every_epoch, node.keep, cfg, tuple(node.get("at_samples") or ()))

    def start(self, loop, state) -> None:
        """Before the first step taken here: marks already passed (a run resumed past them) cannot
        be kept; a mark at the start itself (0) is saved now."""
        self.marks = [m for m in self.marks if m > state.samples_seen or (m == 0 and state.step == 0)]
        self.marks = loop.world.broadcast_object(self.marks)  # rank 0's files say which are saved
        if self.pins_due(state.samples_seen):
            self.save(loop, state)

    def pins_due(self, samples_seen: int) -> list[int]:
        return [m for m in self.marks if m <= samples_seen]

    def due(self, step: int, at_epoch_end: bool, total: int, samples_seen: int = 0) -> bool:
        return bool(
            (self.every_steps and step % self.every_steps == 0)
            or (at_epoch_end and self.every_epoch)
            or step >= total
            or self.pins_due(samples_seen)
        )

    def save(self, loop, state) -> None:
        mine = {"rng": rng_state(), "running": (float(state.loss_sum), float(state.correct), state.running_samples)}
        ranks = loop.world.gather_object(mine)
        pins = self.pins_due(state.samples_seen)
        self.marks = [m for m in self.marks if m not in pins]
        if not loop.world.is_main:
            return
        loop.sinks.durable()  # the records this checkpoint holds, on disk in metrics.jsonl too
        step, noise = loop.step, loop.step.noise
        saved = {
            "step": state.step,
            "epoch": state.epoch,
            "in_epoch": state.in_epoch,
            "samples_seen": state.samples_seen,
            "train_time_s": state.train_time_s,
            "wall_time_s": state.wall_time_s,
            "best_val_acc": state.best_val_acc,
            "records": state.records,
            "hparams": state.hparams,
            "lr": state.lr,
            "last_finite_loss": state.last_finite_loss,
            "model": step.net.state_dict(),
            "optimizer": step.optimizer.state_dict(),
            "scaler": step.scaler.state_dict(),
            "policy": loop.batch_control.state_dict(),
            "noise": asdict(noise.scale) if noise is not None else None,
            "ranks": ranks,
            "identity": identity(self.cfg, loop),
            "wandb_id": loop.sinks.wandb_id(),
        }
        path = save(self.run_dir, saved, self.keep)
        for mark in pins:  # a second name for the same file: rotation leaves it be
            atomic_write(pinned(self.run_dir, mark), lambda out: out.write(path.read_bytes()))
        log.debug("checkpoint %s%s", path, f" (kept as samples {pins})" if pins else "")


_STATE_KEYS = (
    "step",
    "epoch",
    "in_epoch",
    "samples_seen",
    "train_time_s",
    "best_val_acc",
    "records",
    "lr",
    "last_finite_loss",
)


def restore(cfg: DictConfig, loop, state, path: Path, saved: dict[str, Any], branch: bool = False) -> str | None:
    """Put a freshly built run (whose batch policy was resolved from `saved`) where the checkpoint
    left it; returns the W&B run id to continue. `branch`: a new run from another's checkpoint
    (bsexp.runs.trunk), which keeps the model, optimizer, generators and place in the data but starts
    its own records, clock and W&B run."""
    different = mismatches(saved, identity(cfg, loop))
    if different and not cfg.checkpoint.allow_mismatch:
        raise ConfigError(
            "resume",
            str(path),
            f"was written by another run: {'; '.join(different)}; set checkpoint.allow_mismatch=true to load it anyway",
        )
    ranks = saved["ranks"]
    if len(ranks) != loop.world.size:
        raise ConfigError("resume", str(path), f"holds {len(ranks)} rank(s), this run has {loop.world.size}")
    step = loop.step
    step.net.load_state_dict(saved["model"])
    step.optimizer.load_state_dict(saved["optimizer"])  # its LR and weight decay are rewritten before each step
    if branch and "momentum" in cfg.optimizer:  # the branch's own (tuned with its LR), not the trunk's
        for group in step.optimizer.param_groups:
            group["momentum"] = cfg.optimizer.momentum
    if saved["scaler"]:
        step.scaler.load_state_dict(saved["scaler"])
    if step.noise is not None and saved["noise"] is not None:
        step.noise.scale = NoiseScale.restored(saved["noise"], step.noise.scale.population)
    for key in _STATE_KEYS:
        setattr(state, key, saved[key])
    state.wall_time_before = saved.get("wall_time_s", 0.0)  # checkpoints from before it was kept: unknown
    state.hparams = saved.get("hparams")  # checkpoints from before they were kept: taken anew where it resumes
    mine = ranks[loop.world.rank]
    state.loss_sum, state.correct, state.running_samples = mine["running"]
    set_rng_state(mine["rng"])
    if branch:
        state.records, state.best_val_acc, state.train_time_s, state.wall_time_before = [], 0.0, 0.0, 0.0
        state.hparams = None  # the branch's own, at its batch
        state.samples_before = state.samples_seen
        log.info(
            "branched from %s: epoch %d, step %d, %d samples seen; %d steps to go",
            path,
            state.epoch,
            state.step,
            state.samples_seen,
            loop.batch_control.layout.total - state.step,
        )
        return None
    log.info("resumed from %s: epoch %d, step %d of %d", path, state.epoch, state.step, loop.batch_control.layout.total)
    return saved["wandb_id"]
