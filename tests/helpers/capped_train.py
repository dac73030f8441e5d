"""Train under a real memory cap in a fresh process, and save what the run ended with.

    python capped_train.py OUT ROOM_MB OVERRIDE...

composes bsexp's config with the overrides, builds the run as `bsexp.train.job` does, caps the
process at what it holds plus ROOM_MB (ROOM_MB 0: no cap), trains, and writes to OUT (torch.save)
the final parameters, the plan in force, the number of OOM recoveries and how a graphed step ran. A test's own process
cannot be capped: the cap would outlive the test.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from bsexp.config.schema import register_configs
from bsexp.runs.sweep import register_resolvers
from bsexp.system import memory
from bsexp.train.loop import TrainState, build_loop, train

CONF = Path(__file__).resolve().parents[2] / "bsexp" / "conf"


def main(out: str, room_mb: str, *overrides: str) -> None:
    memory.one_arena()  # as bsexp.train.job does for a capped run, before any thread allocates
    register_configs()
    register_resolvers()
    torch.set_num_threads(int(os.environ.get("BSEXP_TEST_THREADS", "1")))
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["logger=none", "trainer.progress=false", *overrides])
    loop = build_loop(cfg)
    if float(room_mb):
        memory.return_freed_memory()
        memory.cap_memory(memory.held() + int(float(room_mb) * memory.MIB))
    progress = TrainState()
    status = train(loop, progress)
    torch.save(
        {
            "status": status,
            "params": loop.step.model.state_dict(),
            "plan": loop.batch_control.current,
            "oom_recoveries": loop.batch_control.oom_recoveries,
            "records": progress.records,
            "graphs": loop.step.graphs.summary() if loop.step.graphs is not None else None,
        },
        out,
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
