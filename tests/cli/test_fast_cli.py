"""The fast path through the CLI: a run stopped mid-way (SIGTERM: a checkpoint at the next step)
resumes, compiling anew, and ends where the same fast run uninterrupted ends; summary.json says
how it computed."""

import json
import signal
import subprocess
import sys

import pytest

from conftest import TINY_RUN, cli_env
from resuming import SLOW, assert_ends_as, newest_step, start, stop_mid_run, uninterrupted


@pytest.mark.slow  # 20-70 s on 2 cores: scripts/test_slow.sh (and .ci/run) runs it
@pytest.mark.parametrize("mode", ["none", "default"])  # eager (the fast path's default), compiled
def test_a_fast_run_stopped_mid_way_resumes_to_the_same_end(make_cfg, data_root, tmp_path, mode):
    fast = ["batch.size=64", "trainer.speed=fast", f"trainer.compile_mode={mode}"]
    run_dir = tmp_path / "run"
    code, err = stop_mid_run(
        start(data_root, tmp_path, *SLOW, *fast, f"hydra.run.dir={run_dir}"), run_dir, signal.SIGTERM, seed=11
    )
    assert code == 128 + signal.SIGTERM, err[-3000:]
    stopped_at = newest_step(run_dir)
    resumed = subprocess.run(
        [sys.executable, "-m", "bsexp.train", *SLOW, *fast, "resume=auto", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from"].endswith(f"step-{stopped_at:09d}.pt")
    assert summary["speed"] == {
        "fast": True,
        "cudnn_benchmark": False,  # on the CPU: cuDNN and TF32 do not apply
        "tf32": False,
        "channels_last": False,
        "compile": None if mode == "none" else "default",
        "fused_optimizer": True,
    }
    # In the resumed process: one graph where compiled, the last short step too.
    assert summary["compiled_graphs"] == (mode == "default")
    loop, _ = uninterrupted(make_cfg, *fast)
    assert_ends_as(run_dir, loop)  # bit for bit: the same compiled code, the same steps


@pytest.mark.slow  # 17-32 s on 2 cores: scripts/test_slow.sh (the default tiers' time)
def test_a_run_says_how_it_computes_in_its_log_and_its_summary(run_cli, tmp_path):
    lines, fused = {}, {}
    for name, args in {
        "reproducible": ["trainer.speed=reproducible"],
        "fast": ["trainer.speed=fast"],
        "lars": ["trainer.speed=fast", "optimizer=lars"],  # timm's LARS has no fused kernel
    }.items():
        run_dir = tmp_path / name
        out = run_cli(*TINY_RUN, *args, f"hydra.run.dir={run_dir}")
        assert out.returncode == 0, out.stderr[-3000:]
        [lines[name]] = [line for line in (run_dir / "train.log").read_text().splitlines() if "] speed " in line]
        speed = json.loads((run_dir / "summary.json").read_text())["speed"]
        assert speed["fast"] == (name != "reproducible") and not speed["tf32"] and not speed["cudnn_benchmark"]
        fused[name] = speed["fused_optimizer"]
    assert fused == {"reproducible": False, "fast": True, "lars": False}
    assert lines["lars"].endswith("speed fast: fast (no deterministic algorithms, eager)")
    assert lines["reproducible"].endswith(
        "speed reproducible: reproducible (deterministic algorithms, no autotuner, eager)"
    )
    # On the CPU: no cuDNN, no TF32 to speak of; cnn1d convolves sequences, not images (no channels_last).
    assert lines["fast"].endswith("speed fast: fast (no deterministic algorithms, fused optimizer, eager)")


@pytest.mark.slow  # 35-45 s each on 2 cores (the finder's trials compile in their own processes)
@pytest.mark.parametrize("policy", ["finder", "adaptive"])
def test_the_policies_that_measure_or_move_the_batch_train_compiled_with_few_graphs(run_cli, tmp_path, policy):
    # The finder's trials run the step as it will train (compiled: bsexp.engine.build.wrap_model); the
    # adaptive policy grows the batch mid-run, which must not compile a graph a size.
    run_dir = tmp_path / "run"
    compiled = ["trainer.speed=fast", "trainer.compile_mode=default", "data.num_samples=2000", "data.val_size=200"]
    out = run_cli(
        f"batch={policy}", *compiled, "epochs=3", "logger=none", "trainer.progress=false", f"hydra.run.dir={run_dir}"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["speed"]["compile"] == "default"
    # One graph for training (the batch dimension dynamic), one for evaluation: 2 measured on torch
    # 2.14 for both policies, however the batch moved.
    assert 1 <= summary["compiled_graphs"] <= 3, summary["compiled_graphs"]
    if policy == "finder":
        found = json.loads((run_dir / "finder.json").read_text())
        assert found["micro_size"] == summary["micro_size"] and any(t["ok"] for t in found["trials"])
    else:
        assert summary["final_batch_size"] > summary["batch_size"]  # it grew, compiled once
