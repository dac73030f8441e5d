"""Real process groups on CPU (gloo, 2 ranks): equivalence with one process, SyncBatchNorm, sharded evaluation, torchrun and self-launched jobs, and a failing rank."""

import json
import subprocess
import sys

import pytest
import torch
from torch import nn

import dist_workers
from bsexp.train.preflight import check_all as check
from bsexp.train.loop import TrainState, build_loop, train
from conftest import cli_env

# A model without BatchNorm, so that 2 x 32 and 1 x 64 compute the same function.
TINY = [
    "data=synthetic",
    "data.shape=[1,16]",
    "data.num_samples=1000",
    "data.val_size=101",
    "model=mlp",
    "model.norm=none",
    "model.hidden=[32]",
    "trainer.progress=false",
    "schedule.warmup_shape=none",
    "schedule.main=constant",
    "trainer.max_steps=5",
]


def single(make_cfg, *overrides):
    cfg = make_cfg(*TINY, *overrides)
    loop = build_loop(cfg)
    before = loop.evaluator.split(loop, loop.splits.val)
    progress = TrainState()
    assert train(loop, progress) == "completed"
    return loop, before, progress


ACCUMULATION = ["batch=accumulation", "batch.size=64", "batch.micro_size=16"]


# With OOM recovery on (the default) gradients are all-reduced after the last micro-step; off,
# inside its backward, through DDP's communication hook.
@pytest.mark.parametrize("batch", [["batch.size=64"], ACCUMULATION, [*ACCUMULATION, "trainer.oom_recovery=false"]])
def test_two_ranks_equal_one_process_and_evaluate_identically(make_cfg, batch):
    loop, before, progress = single(make_cfg, *batch)
    cfg = make_cfg(*TINY, *batch, "distributed=ddp", "distributed.nproc_per_node=2")
    results = dist_workers.launch(dist_workers.train_steps, cfg)
    ranks = results[0], results[1]
    assert [r["world_size"] for r in ranks] == [2, 2] and all(r["status"] == "completed" for r in ranks)
    assert (loop.batch_control.current.micro_size, loop.batch_control.current.accum_steps) == (
        (64, 1) if batch == ["batch.size=64"] else (16, 4)
    )
    for rank in ranks:  # 2 ranks x 32 (or 2 x 2 micro-steps x 16) against 1 x 64, after 5 steps
        for key, value in loop.step.net.state_dict().items():
            assert torch.allclose(rank["params"][key], value, atol=1e-5, rtol=0), key
    # Validation over 101 samples, sharded 51 + 50, all-reduced: the single process's figures
    # (the loss to float32 rounding: a forward over 51 samples rounds unlike one over 101).
    assert ranks[0]["val_before"][1] == before[1] and ranks[1]["val_before"] == ranks[0]["val_before"]
    assert ranks[0]["val_before"][0] == pytest.approx(before[0], rel=1e-6)
    # One gradient all-reduce per optimizer step (this small model fits one bucket): the first
    # micro-steps run under no_sync.
    assert [r["buckets_reduced"] for r in ranks] == [5, 5] and ranks[0]["steps"] == 5
    record, expected = ranks[0]["records"][-1], progress.records[-1]
    assert record["samples_seen"] == expected["samples_seen"] == 5 * 64
    assert record["train_loss"] == pytest.approx(expected["train_loss"], rel=1e-5)
    assert record["val_acc"] == pytest.approx(expected["val_acc"], abs=1 / 101 + 1e-9)


@pytest.mark.parametrize("mode", ["none", "default"])
def test_two_ranks_on_the_fast_path_equal_one_process_on_it(make_cfg, mode):
    # Eager (the fast path's default) and torch.compile around DDP (its buckets split the graph),
    # fused SGD on every rank.
    fast = ["trainer.speed=fast", f"trainer.compile_mode={mode}"]
    loop, _, progress = single(make_cfg, "batch.size=64", *fast)
    assert hasattr(loop.step.model, "_orig_mod") == (mode == "default")
    cfg = make_cfg(*TINY, "batch.size=64", *fast, "distributed=ddp", "distributed.nproc_per_node=2")
    ranks = dist_workers.launch(dist_workers.train_steps, cfg)
    assert all(r["status"] == "completed" and r["steps"] == 5 for r in ranks.values())
    for rank in ranks.values():  # 2 ranks x 32 against 1 x 64: rounding apart, as on the reproducible path
        for key, value in loop.step.net.state_dict().items():
            assert torch.allclose(rank["params"][key], value, atol=1e-5, rtol=0), key
    assert ranks[0]["records"][-1]["train_loss"] == pytest.approx(progress.records[-1]["train_loss"], rel=1e-5)


@pytest.mark.parametrize("dims, shape", [(1, (32, 6)), (2, (32, 3, 5, 4))])
def test_cpu_sync_batchnorm_over_two_ranks_equals_batchnorm_over_both(dims, shape):
    generator = torch.Generator().manual_seed(dims)
    x = torch.randn(shape, generator=generator) * 3 + 1
    weight = torch.randn(shape, generator=generator)
    results = dist_workers.launch(dist_workers.sync_batchnorm, x, weight, dims)
    bn = (nn.BatchNorm1d, nn.BatchNorm2d)[dims - 1](shape[1], momentum=0.3)
    with torch.no_grad():
        bn.weight.copy_(torch.linspace(0.5, 1.5, shape[1]))
        bn.bias.copy_(torch.linspace(-1, 1, shape[1]))
    full = x.clone().requires_grad_(True)
    out = bn(full)
    (out * weight).sum().div(len(x)).backward()
    for rank, mine in ((0, slice(0, 16)), (1, slice(16, 32))):
        got = results[rank]
        assert got["type"] == "CPUSyncBatchNorm"
        torch.testing.assert_close(got["out"], out[mine].detach(), atol=1e-5, rtol=0)
        torch.testing.assert_close(got["grad_in"], full.grad[mine], atol=1e-5, rtol=0)
        torch.testing.assert_close(got["grad_params"], torch.cat([bn.weight.grad, bn.bias.grad]), atol=1e-5, rtol=0)
        torch.testing.assert_close(got["running"], torch.cat([bn.running_mean, bn.running_var]), atol=1e-5, rtol=0)
    # And the halves alone would not do: per-rank BatchNorm gives other outputs.
    half = (nn.BatchNorm1d, nn.BatchNorm2d)[dims - 1](shape[1])
    assert not torch.allclose(half(x[:16]), out[:16].detach(), atol=1e-3)


def test_cpu_sync_batchnorm_under_bf16_autocast_keeps_its_statistics_in_fp32():
    # 4 x 51 x 51 = 10,404 values a channel: a count bf16 cannot hold (it rounds to 10,368), sums that
    # lose digits in bf16. The statistics must be as exact as torch's own BatchNorm on the same input.
    generator = torch.Generator().manual_seed(0)
    shape = (4, 3, 51, 51)
    x = (torch.randn(shape, generator=generator) * 3 + 1).to(torch.bfloat16).float()  # what bf16 holds
    weight = torch.randn(shape, generator=generator)
    results = dist_workers.launch(dist_workers.sync_batchnorm, x, weight, 2, "bf16")
    exact = x.double()
    mean = exact.mean(dim=(0, 2, 3))
    var = exact.var(dim=(0, 2, 3), unbiased=True)
    # Running statistics after one step from (0, 1) with momentum 0.3.
    expected = torch.cat([0.3 * mean, 0.7 + 0.3 * var])
    bn = nn.BatchNorm2d(shape[1], momentum=0.3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bn(x.to(torch.bfloat16))
    torch_error = (torch.cat([bn.running_mean, bn.running_var]).double() - expected).abs().max().item()
    for rank in (0, 1):
        got = results[rank]
        assert got["dtype"] == torch.bfloat16  # the output keeps the autocast dtype
        error = (got["running"].double() - expected).abs().max().item()
        assert error <= 2 * torch_error + 1e-6, (error, torch_error)


@pytest.mark.parametrize("sync, expected", [(None, ["CPUSyncBatchNorm"]), (False, ["BatchNorm1d"])])
def test_sync_batchnorm_is_the_default_with_several_ranks_and_can_be_turned_off(make_cfg, sync, expected):
    overrides = [*TINY, "model.norm=batch", "distributed=ddp", "trainer.max_steps=1"]
    if sync is False:
        overrides.append("distributed.sync_batchnorm=false")
    results = dist_workers.launch(dist_workers.train_steps, make_cfg(*overrides))
    assert results[0]["norms"] == results[1]["norms"] == expected


def test_two_ranks_with_batchnorm_per_rank_evaluate_with_rank_0s_statistics(make_cfg):
    # SyncBatchNorm off: each rank's running statistics follow its own shard, and DDP leaves them
    # apart (bsexp.engine.build turns its buffer sync off). Evaluation gives every rank rank 0's, so the
    # sharded, all-reduced figures are those of one process evaluating rank 0's model and buffers.
    overrides = [*TINY, "model.norm=batch", "batch.size=64"]
    cfg = make_cfg(*overrides, "distributed=ddp", "distributed.nproc_per_node=2", "distributed.sync_batchnorm=false")
    ranks = dist_workers.launch(dist_workers.train_steps, cfg)
    assert ranks[0]["norms"] == ["BatchNorm1d"] and ranks[0]["status"] == "completed"
    loop = build_loop(make_cfg(*overrides))
    loop.step.net.load_state_dict(ranks[0]["params"])
    val_loss, val_acc = loop.evaluator.split(loop, loop.splits.val)
    record = ranks[0]["records"][-1]
    assert record["val_acc"] == val_acc and record["val_loss"] == pytest.approx(val_loss, rel=1e-6)
    # Evaluating left rank 0's statistics on rank 1 too (and DDP kept the parameters equal).
    for key, value in ranks[0]["params"].items():
        assert torch.equal(ranks[1]["params"][key], value), key


TINY_CLI = ["data.num_samples=600", "data.val_size=100", "epochs=1", "model.width=8"]


def test_torchrun_job_shares_one_output_directory_written_by_rank_0(data_root, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "-m",
            "bsexp.train",
            "distributed=ddp",
            *TINY_CLI,
        ],
        cwd=tmp_path,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    [run_dir] = [p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir()]
    assert list((tmp_path / "outputs").glob("*/*")) == [run_dir]  # one directory for both ranks
    assert sorted(p.name for p in run_dir.iterdir()) == [
        ".bsexp.lock",
        ".hydra",
        "checkpoints",
        "metrics.jsonl",
        "summary.json",
        "train.log",
        "wandb",
    ]
    assert len(list(run_dir.glob("wandb/offline-run-*"))) == 1  # rank 0's W&B run only
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert (summary["batch_size"], summary["micro_size"]) == (128, 64)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs"]  # rank 1 wrote nothing in its cwd
    assert out.stdout.count("status") == 1  # one final table, from rank 0


@pytest.mark.slow  # 17-32 s on 2 cores: scripts/test_slow.sh (the default tiers' time)
def test_torchrun_without_a_distributed_option_trains_data_parallel_and_an_explicit_none_is_a_clear_error(
    data_root, tmp_path
):
    def torchrun(*args):
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node=2",
                "--standalone",
                "-m",
                "bsexp.train",
                *TINY_CLI,
                "logger=none",
                *args,
            ],
            cwd=tmp_path,
            env=cli_env(data_root),
            capture_output=True,
            text=True,
            timeout=300,
        )

    # torchrun started the ranks: distributed=ddp is implied, so there is no error (and none of
    # torchrun's own tracebacks, which follow any worker's failure).
    out = torchrun(f"hydra.run.dir={tmp_path / 'implied'}")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    summary = json.loads((tmp_path / "implied" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert "distributed=ddp" in (tmp_path / "implied" / ".hydra" / "overrides.yaml").read_text()
    out = torchrun("distributed=none", f"hydra.run.dir={tmp_path / 'none'}")
    assert out.returncode != 0
    assert "error: distributed=none: torchrun started 2 ranks; add distributed=ddp" in out.stderr


@pytest.mark.slow  # 17-32 s on 2 cores: scripts/test_slow.sh (the default tiers' time)
def test_a_self_launched_sweep_runs_each_job_as_its_own_worker_group(run_cli, tmp_path):
    sweep = tmp_path / "sweep"
    out = run_cli(
        "-m",
        "distributed=ddp",
        "distributed.nproc_per_node=2",
        "batch.size=64,128",
        *TINY_CLI,
        f"hydra.sweep.dir={sweep}",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summaries = sorted(sweep.glob("*/summary.json"))
    assert len(summaries) == 2
    sizes = sorted(json.loads(p.read_text())["batch_size"] for p in summaries)
    assert sizes == [64, 128]
    for path in summaries:
        summary = json.loads(path.read_text())
        assert summary["status"] == "completed" and summary["world_size"] == 2
        assert len(list(path.parent.glob("wandb/offline-run-*/run-*.wandb"))) == 1
    assert out.stdout.count("launching 2 workers") == 2


def test_a_failing_rank_ends_the_job_quickly_with_a_message_naming_it(run_cli, tmp_path):
    conf = tmp_path / "my_conf" / "model"
    conf.mkdir(parents=True)
    (conf / "fails.yaml").write_text("_target_: user_models.FailsOnRank\nrank: 1\nfail_at_step: 2\n")
    out = run_cli(
        "distributed=ddp",
        "logger=none",
        f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]",
        "model=fails",
        *TINY_CLI[:3],
        f"hydra.run.dir={tmp_path / 'run'}",
        timeout=120,
    )  # quickly: not after the collectives' 30-minute timeout (TimeoutExpired)
    assert out.returncode == 1
    [line] = [line for line in out.stderr.splitlines() if line.startswith("error:")]  # ours, once
    assert line.startswith("error: rank 1 failed: RuntimeError: FailsOnRank: rank 1 crashed at step 2"), line
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and "rank 1" in summary["error"]


def test_the_slurm_launcher_config_composes(data_root, monkeypatch):
    from hydra import compose, initialize_config_dir

    from conftest import CONF

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "hydra/launcher=slurm",
                "hydra.launcher.partition=gpu",
                "distributed=ddp",
                "distributed.nproc_per_node=4",
            ],
            return_hydra_config=True,
        )
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (1, 1, 2)
    assert launcher.partition == "gpu" and launcher.signal_delay_s == 120
    assert check(cfg).world_size == 4  # each job's plan counts the workers it will launch


@pytest.mark.slow  # 17-32 s on 2 cores: scripts/test_slow.sh (the default tiers' time)
def test_sweep_jobs_pickled_by_the_submitit_launcher_run_in_fresh_processes(run_cli, tmp_path):
    # The SLURM launcher pickles the job function and runs it elsewhere; submitit's local executor
    # does the same here, in new processes, so the job must be importable and self-contained.
    sweep = tmp_path / "sweep"
    out = run_cli(
        "-m", "hydra/launcher=submitit_local", "seed=0,1", "logger=none", *TINY_CLI, f"hydra.sweep.dir={sweep}"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/summary.json"))]
    assert [s["seed"] for s in summaries] == [0, 1] and all(s["status"] == "completed" for s in summaries)
    assert len(list(sweep.glob(".submitit/*/*_submitted.pkl"))) == 2  # the pickled jobs
