"""The real command line, in subprocesses: a tiny run, its outputs, and bad input."""

import json

import pytest
import torch
import yaml

import wandb_records

TINY_DATA = ["data.num_samples=1000", "data.val_size=100", "epochs=2"]
TINY = [*TINY_DATA, "model.width=8"]
SUMMARY_KEYS = {
    "status",
    "batch_size",
    "micro_size",
    "accum_steps",
    "world_size",
    "lr",
    "weight_decay",
    "epochs",
    "steps",
    "samples_seen",
    "train_loss",
    "train_acc",
    "val_loss",
    "val_acc",
    "best_val_acc",
    "test_acc",
    "gen_gap",
    "wall_time_s",
    "samples_per_s",
    "peak_memory_mb",
    "seed",
    "k",
    "warmup_steps",
}
RECORD_KEYS = {
    "epoch",
    "step",
    "samples_seen",
    "train_loss",
    "train_acc",
    "val_loss",
    "val_acc",
    "gen_gap",
    "lr",
    "batch_size",
    "micro_size",
    "accum_steps",
}


def test_help_lists_every_group_and_its_options(run_cli):
    out = run_cli("--help")
    assert out.returncode == 0, out.stderr
    for line in [
        "batch: accumulation, adaptive, finder, fixed, scheduled",
        "data: cifar10, cifar100, digits, fashion_mnist, mnist, mnist1d, synthetic, text",
        "distributed: ddp, none",
        "logger: mlflow, none, tensorboard, wandb",
        "model: cnn, cnn1d, gpt, mlp, resnet18",
        "optimizer: adamw, lamb, lars, sgd",
    ]:
        assert line in out.stdout
    assert "schema" not in out.stdout.split("== Config ==")[0]  # schemas are not options


def test_cfg_job_prints_the_composed_config_without_running(run_cli, tmp_path):
    out = run_cli("--cfg", "job", "batch=accumulation", "batch.micro_size=64", "optimizer=adamw")
    assert out.returncode == 0, out.stderr
    cfg = yaml.safe_load(out.stdout)
    assert cfg["batch"] == {
        "policy": "accumulation",
        "size": 512,
        "drop_last": False,
        "micro_size": 64,
        "accum_steps": None,
    }
    assert (
        cfg["optimizer"]["_target_"] == "torch.optim.AdamW"
        and cfg["data"]["_target_"] == "bsexp.engine.datasets.mnist1d"
    )
    assert {"seed", "epochs", "device", "precision", "scaling", "schedule", "trainer"} <= cfg.keys()
    assert not (tmp_path / "outputs").exists()


def test_a_tiny_run_writes_config_metrics_summary_and_an_offline_wandb_run(run_cli, tmp_path):
    run_dir = tmp_path / "run"
    out = run_cli(*TINY, "batch=accumulation", "batch.size=64", "batch.micro_size=16", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert SUMMARY_KEYS <= summary.keys()
    assert summary["status"] == "completed"
    assert (summary["batch_size"], summary["micro_size"], summary["accum_steps"], summary["world_size"]) == (
        64,
        16,
        4,
        1,
    )
    assert summary["k"] == 0.5 and summary["lr"] == pytest.approx(0.05)  # linear rule from 0.1 at 128
    assert summary["weight_decay"] == pytest.approx(5e-4 * 0.5**0.5)  # sqrt rule
    assert summary["steps"] == 2 * 11 and summary["samples_seen"] == 2 * 700  # 700 train samples
    assert summary["gen_gap"] == pytest.approx(summary["train_acc"] - summary["val_acc"])
    assert 0 <= summary["test_acc"] <= 1
    assert "status" in out.stdout and "test acc" in out.stdout  # the final table

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2] and [r["step"] for r in records] == [11, 22]
    assert all(RECORD_KEYS <= r.keys() for r in records)
    assert records[-1]["val_acc"] == summary["val_acc"]
    assert summary["best_val_acc"] == max(r["val_acc"] for r in records)

    composed = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    assert composed["batch"]["micro_size"] == 16
    assert (run_dir / "train.log").read_text().count("val_acc") == 2

    [run_file] = run_dir.glob("wandb/offline-run-*/run-*.wandb")  # offline by default: no WANDB_MODE set
    metrics = wandb_records.of_type(run_file, "metric")
    assert any(m.get("glob_name") == "*" and m.get("step_metric") == "samples_seen" for m in metrics)  # define_metric
    rows = wandb_records.history(run_file)
    assert [row["samples_seen"] for row in rows] == [700, 1400]
    assert RECORD_KEYS <= rows[-1].keys() and rows[-1]["val_acc"] == pytest.approx(summary["val_acc"])
    logged = wandb_records.summary(run_file)
    assert logged["test_acc"] == pytest.approx(summary["test_acc"]) and logged["lr"] == pytest.approx(0.05)
    [run] = wandb_records.of_type(run_file, "run")
    config = run["config"]["update"]
    assert config["batch"]["micro_size"] == 16 and config["derived"]["lr"] == pytest.approx(0.05)


def test_logger_none_writes_no_wandb_run(run_cli, tmp_path):
    run_dir = tmp_path / "run"
    out = run_cli(*TINY, "epochs=1", "logger=none", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr
    assert (run_dir / "summary.json").exists() and not (run_dir / "wandb").exists()


def _no_cuda():
    return "device=cuda" if not torch.cuda.is_available() else None


BAD_INPUTS = [
    # (overrides, key the message must name, fragment of what is valid)
    (["batch=accumulation", "batch.size=100", "batch.micro_size=64"], "batch.micro_size", "divisors: 1, 2, 4, 5"),
    (["batch=accumulation", "batch.micro_size=1024"], "batch.micro_size", "at most"),
    (["batch=accumulation", "batch.micro_size=null"], "batch.micro_size", "or batch.accum_steps"),
    (["batch.size=0"], "batch.size", ">= 1"),
    (["branch.samples=100"], "branch.trunk", "branch.trunk=<the trunk's run or sweep directory>"),
    (["optimizer.lr=0"], "optimizer.lr", "> 0"),
    (["optimizer.lr=-0.1"], "optimizer.lr", "> 0"),
    (["scaling.lr_rule=cube"], "scaling.lr_rule", "linear, sqrt, none"),
    (["scaling.wd_rule=quadratic"], "scaling.wd_rule", "linear, sqrt, none"),
    (["data=imagenet"], "data=imagenet", "mnist1d"),
    (["model=transformer"], "model=transformer", "cnn1d"),
    (["epochs=abc"], "epochs", "Integer"),
    (["model.widht=64"], "model.widht", "width"),
    (["precision=fp8"], "precision", "fp32, bf16, fp16"),
    (["schedule.main=step"], "schedule.milestones", "at least one milestone"),
    (["trainer.clip_grad_norm=0"], "trainer.clip_grad_norm", "> 0"),
    (["optimizer=adamw", "optimizer.betas=[0.9]"], "optimizer.betas", "two values"),
    (["model._target_=nope.Model"], "model._target_", "cannot be imported"),
    (["seed=-1"], "seed", ">= 0"),
    (["model.width=0"], "model.width", ">= 1"),
    (["model=mlp", "model.hidden=[64,-3]"], "model.hidden", "sizes >= 1"),
    (["model=mlp", "model.dropout=1.5"], "model.dropout", "in [0, 1)"),
    (["schedule.warmup=nan"], "schedule.warmup", ">= 0"),
    (["optimizer.lr=inf"], "optimizer.lr", "finite"),
    (["+trainer.max_step=5"], "trainer.max_step", "max_steps"),
    (["lr=0.01"], "lr", "did you mean optimizer.lr?"),
    (["warmup=3"], "warmup", "did you mean schedule.warmup?"),
    (["batch.micro_size=8"], "batch.micro_size", "a key of batch=accumulation or batch=scheduled"),
    (["data=synthetic", "data.num_workers=-1"], "data.num_workers", ">= 0"),
    (["data=synthetic", "data.num_samples=0"], "data.num_samples", ">= 1"),
    (["batch=accumulation", "batch.accum_steps=3"], "batch.accum_steps", "must divide"),
    (["distributed=ddp", "distributed.nproc_per_node=3"], "batch.size", "divisible by the world size 3"),
    (
        [
            "batch=scheduled",
            "batch.schedule.kind=list",
            "batch.schedule.points=[[0,32],[2,3]]",
            "distributed=ddp",
            "distributed.nproc_per_node=2",
        ],
        "batch.schedule",
        "multiple of the world size 2",
    ),
    (
        ["batch=scheduled", "batch.size=33", "batch.schedule.factor=1.5"],
        "batch.schedule.factor",
        "factor=1.5: must make every scheduled batch a whole number; batch 33 x 1.5^1 = 49.5",
    ),
    (["batch=scheduled", "batch.schedule.kind=linear"], "batch.schedule.end", "needs the final batch"),
    (["trainer.noise_scale=sometimes"], "trainer.noise_scale", "auto, off, always"),
    (["checkpoint.keep=0"], "checkpoint.keep", ">= 1"),
    (["batch=finder", "batch.finder.objective=biggest"], "batch.finder.objective", "noise_scale"),
    (["batch=adaptive", "batch.adaptive.objective=speed"], "batch.adaptive.objective", "noise, goodput"),
    (["batch=adaptive", "batch.adaptive.max_growth=0.5"], "batch.adaptive.max_growth", ">= 1"),
    (["batch=adaptive", "batch.adaptive.interval=0"], "batch.adaptive.interval", ">= 1"),
    (["batch=adaptive", "batch.adaptive.c=0"], "batch.adaptive.c", "> 0"),
    (["batch=adaptive", "batch.adaptive.shrink=sometimes"], "batch.adaptive.shrink", "not a valid bool"),
    (["batch=adaptive", "batch.adaptive.power=0"], "batch.adaptive.power", "in (0, 1]"),
    (["batch=adaptive", "batch.adaptive.power=2"], "batch.adaptive.power", "in (0, 1]"),
    (["batch=adaptive", "batch.adaptive.max_size=16"], "batch.adaptive.max_size", "at least batch.size=32"),
    (["batch=adaptive", "batch.adaptive.min_size=64"], "batch.adaptive.min_size", "at most batch.size=32"),
    (["batch=adaptive", "trainer.noise_scale=off"], "trainer.noise_scale", "use auto or always"),
    (
        ["batch=adaptive", "batch.adaptive.objective=goodput", "batch.find_micro_size=false"],
        "batch.adaptive.objective",
        "batch.find_micro_size=true",
    ),
    (["batch=adaptive", "batch.adaptive.lr=linear"], "batch.adaptive.lr", "rule, adascale"),
    (["batch=scheduled", "batch.schedule.kind=seesaw"], "batch.schedule.kind", "schedule.main=step"),
    (
        [
            "batch=scheduled",
            "batch.schedule.kind=seesaw",
            "schedule.main=step",
            "schedule.milestones=[5]",
            "schedule.factor=0.3",
        ],
        "schedule.factor",
        "whole alpha",
    ),
    (["model.activation_checkpointing=maybe"], "model.activation_checkpointing", "not a valid bool"),
    (["~batch"], "batch", "Missing mandatory value"),
    # Raised while optimizer.lr: ${bsexp_tuned:lr} resolves: they named optimizer.lr and a Python error.
    (["experiment=steps_to_result", "tune.best=/no/such/best.json"], "tune.best", "cannot be read (FileNotFoundError"),
    (["experiment=steps_to_result", "tune.trial=0", "tune.lr_min=-1"], "tune.lr_min", "must be > 0"),
    (  # a sweep point's directory, unquoted: Hydra's parse error named no override
        ["hydra.run.dir=points/0_batch.size=32"],
        "hydra.run.dir=points/0_batch.size=32: not an override Hydra can read",
        "key='value'",
    ),
    (["distributed.nproc_per_node=2"], "distributed.nproc_per_node", "add distributed=ddp"),  # was ignored
    (  # was torch elastic's 45-line traceback from every rank
        ["distributed=ddp", "distributed.backend=nccl", "device=cpu"],
        "distributed.backend",
        "valid here: auto, gloo",
    ),  # was 5 lines: the finder's server asked first
    (["trainer.compile_mode=reduce-overhead"], "trainer.compile_mode", "pytorch/pytorch#169545"),
    (["model.ghost_batch=1"], "model.ghost_batch", ">= 2"),
    (["model.ghost_batch=16", "distributed.sync_batchnorm=true"], "distributed.sync_batchnorm", "null or false"),
    pytest.param(
        [_no_cuda()],
        "device",
        "auto, cpu",
        marks=pytest.mark.skipif(_no_cuda() is None, reason="CUDA is available here"),
    ),
]


# Errors found once the data is known (the job has started, into a fresh directory).
LATE_BAD_INPUTS = [
    (["data=cifar10"], "data.download", "data.download=true"),
    (["data=digits", "batch.size=4096"], "batch.size", "training samples"),
    (["model=cnn"], "model._target_", "(channels, height, width)"),
    (["model._target_=collections.OrderedDict"], "model._target_", "torch.nn.Module"),
    (["model.norm=group", "model.ghost_batch=16"], "model.ghost_batch", "model.norm=batch"),
    (["data=digits", "data.val_size=1500"], "data.val_size", "between 1 and 898"),
    (["optimizer.nesterov=true", "optimizer.momentum=0"], "optimizer._target_", "Nesterov"),
    (["device=cpu", "trainer.cuda_graphs=on"], "trainer.cuda_graphs", "CUDA graphs need a GPU; valid here: auto"),
    (
        ["model._target_=torch.nn.Identity", "model.activation_checkpointing=true"],
        "model.activation_checkpointing",
        "valid for mlp, cnn, cnn1d, resnet18, gpt and any nn.Sequential",
    ),
]


def _assert_one_clear_line(out, key, fragment):
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"error: {key}") and fragment in lines[0], lines[0]
    assert "Traceback" not in out.stdout + out.stderr


@pytest.mark.parametrize("overrides, key, fragment", BAD_INPUTS)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(run_cli, tmp_path, overrides, key, fragment):
    out = run_cli(*overrides)
    _assert_one_clear_line(out, key, fragment)
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("overrides, key, fragment", LATE_BAD_INPUTS)
def test_bad_input_found_with_the_data_is_one_line_exit_2(run_cli, tmp_path, overrides, key, fragment):
    out = run_cli(*overrides, f"data.root={tmp_path / 'empty'}" if "data=cifar10" in overrides else "logger=none")
    _assert_one_clear_line(out, key, fragment)
    assert not list(tmp_path.glob("outputs/*/*/summary.json")) and not list(tmp_path.glob("outputs/*/*/wandb"))
    [log] = tmp_path.glob("outputs/*/*/train.log")  # the run's log says why it ended
    assert log.read_text().splitlines()[-1].endswith(f"[ERROR] {out.stderr.strip()}"), log.read_text()


def test_an_unwritable_output_dir_is_refused(run_cli, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    out = run_cli(f"hydra.run.dir={blocker}/run")
    _assert_one_clear_line(out, "hydra.run.dir", "cannot be created")
    assert blocker.read_text() == "not a directory"


def test_a_finished_run_is_never_written_over(run_cli, tmp_path):
    run_dir = tmp_path / "done"
    (run_dir / ".hydra").mkdir(parents=True)
    files = {"summary.json": '{"status": "completed"}', "metrics.jsonl": "{}\n", ".hydra/config.yaml": "seed: 7\n"}
    for name, text in files.items():
        (run_dir / name).write_text(text)
    # The line names the tool that helps: resume=auto, which continues the run (or says it finished).
    resume = f"python -m bsexp.train resume=auto hydra.run.dir={run_dir}"
    for overrides, key, fragment in (([], "hydra.run.dir", resume), (["optimizer.lr=-1"], "optimizer.lr", "")):
        out = run_cli(*overrides, f"hydra.run.dir={run_dir}")
        _assert_one_clear_line(out, key, fragment)
        assert {name: (run_dir / name).read_text() for name in files} == files


def test_a_finished_sweep_point_is_refused_with_a_command_that_continues_it_as_printed(run_cli, data_root, tmp_path):
    """A sweep point's directory holds `=` and `,`, which Hydra reads only quoted: the command the
    refusal prints runs as printed, through a shell (this interpreter for its `python`)."""
    import shlex
    import subprocess
    import sys

    from conftest import cli_env

    run_dir = tmp_path / "sweep" / "0_batch.size=64,seed=0"
    tiny = [*TINY, "logger=none", "trainer.progress=false"]
    assert run_cli(*tiny, f"hydra.run.dir='{run_dir}'").returncode == 0
    out = run_cli(*tiny, f"hydra.run.dir='{run_dir}'")
    _assert_one_clear_line(out, "hydra.run.dir", "already holds a run's results (summary.json)")
    command = out.stderr.split("continue that run with ", 1)[1].rsplit(", or choose a new directory", 1)[0]
    assert command == f"python -m bsexp.train resume=auto \"hydra.run.dir='{run_dir}'\""
    before = (run_dir / "summary.json").read_text()
    resumed = subprocess.run(
        shlex.quote(sys.executable) + command.removeprefix("python"),
        shell=True,
        cwd=tmp_path,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "nothing left to resume" in resumed.stdout + resumed.stderr
    assert (run_dir / "summary.json").read_text() == before


def test_a_sweep_never_writes_into_an_earlier_sweeps_results(run_cli, tmp_path):
    sweep = tmp_path / "sweep"
    (sweep / "0").mkdir(parents=True)
    (sweep / "0" / "summary.json").write_text('{"status": "completed"}')
    out = run_cli("-m", "seed=0,1", f"hydra.sweep.dir={sweep}")
    _assert_one_clear_line(out, "hydra.sweep.dir", "0/summary.json")
    assert f"continue that sweep with python -m bsexp.train -m resume=auto hydra.sweep.dir={sweep}," in out.stderr
    assert (
        sorted(p.name for p in sweep.iterdir()) == ["0"]
        and (sweep / "0" / "summary.json").read_text() == '{"status": "completed"}'
    )


def test_a_bad_value_shared_by_every_sweep_job_stops_the_sweep_before_it_starts(run_cli, tmp_path):
    out = run_cli("-m", "seed=0,1", "optimizer.lr=-1", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    _assert_one_clear_line(out, "optimizer.lr", "> 0")
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow  # minutes on 2 cores: scripts/test_slow.sh (and .ci/run) runs it
def test_the_default_run_reaches_90_percent_test_accuracy_on_mnist1d(run_cli, tmp_path):
    # The README's main command, as is: 20 epochs of a 1-D CNN (the dataset paper's CNN: 94 %).
    out = run_cli("logger=none", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs"] == 20
    assert summary["test_acc"] >= 0.90, summary["test_acc"]


def test_a_users_own_model_gets_the_data_shape_through_its_own_config(run_cli, tmp_path):
    conf = tmp_path / "my_conf" / "model"
    conf.mkdir(parents=True)
    (conf / "tiny.yaml").write_text("_target_: user_models.TinyNet\nhidden: 16\n")
    run_dir = tmp_path / "run"
    out = run_cli(
        *TINY_DATA,
        "logger=none",
        f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]",
        "model=tiny",
        "model.hidden=12",
        f"hydra.run.dir={run_dir}",
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["model"] == "user_models.TinyNet"
    assert summary["parameters"] == (40 * 12 + 12) + (12 * 10 + 10)  # MNIST-1D: 40 inputs, 10 classes
    assert summary["status"] == "completed"


def test_a_ctrl_c_as_a_sweep_point_ends_stops_the_sweep_before_its_next_point(run_cli, tmp_path):
    # The SIGINT comes in the test split's evaluation, after the last step: there is no step left
    # to stop at. It was lost there (the handler set a flag nothing read any more), and a sweep went
    # on to its next point as if no Ctrl-C had come (once in CI: a stopped sweep's test ran through).
    conf = tmp_path / "my_conf" / "model"
    conf.mkdir(parents=True)
    (conf / "late.yaml").write_text("_target_: user_models.SignalsAtEval\nsize: 120\n")
    sweep = tmp_path / "sweep"
    out = run_cli(
        "-m",
        "seed=0,1",
        "data.num_samples=600",  # 380 train, 100 val, 120 test: the test split's batch alone is 120
        "data.val_size=100",
        "epochs=1",
        "logger=none",
        f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]",
        "model=late",
        f"hydra.sweep.dir={sweep}",
    )
    assert out.returncode == 130, out.stderr[-3000:]
    [summary] = [json.loads(p.read_text()) for p in sweep.glob("*/summary.json")]
    assert summary["status"] == "completed" and summary["seed"] == 0 and summary["test_acc"] is not None
    assert not list(sweep.glob("1_*")), "the next point ran"
    assert "stopped by SIGINT as point 0 ended (it completed: " in out.stderr


def test_a_failure_mid_run_keeps_the_metrics_and_finishes_the_wandb_run(run_cli, tmp_path):
    conf = tmp_path / "my_conf" / "model"
    conf.mkdir(parents=True)
    (conf / "tiny.yaml").write_text("_target_: user_models.TinyNet\nfail_at_step: 7\n")
    run_dir = tmp_path / "run"
    out = run_cli(
        *TINY_DATA,
        f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]",
        "model=tiny",
        "trainer.eval_every_steps=3",
        f"hydra.run.dir={run_dir}",
    )
    assert out.returncode == 1
    assert "TinyNet failed on purpose at training step 7" in out.stderr
    log = (run_dir / "train.log").read_text()  # the error and its traceback, as the console had them
    assert "[ERROR] error: RuntimeError: TinyNet failed on purpose at training step 7" in log
    assert "Traceback (most recent call last)" in log and 'in forward\n    raise RuntimeError(f"TinyNet failed' in log
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["steps"] == 6
    assert "TinyNet failed on purpose at training step 7" in summary["error"]  # what failed
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [3, 6]
    [run_file] = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    exits = wandb_records.of_type(run_file, "exit")
    assert [e["exit_code"] for e in exits] == [1]  # the W&B run was finished, marked failed
    assert wandb_records.run_summary(run_file)["state"] == "failed"
    assert [row["step"] for row in wandb_records.history(run_file)] == [3, 6]


def test_progress_bars_show_on_a_terminal_and_not_in_a_pipe(run_cli, tmp_path):
    import fcntl
    import os
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # a 120-column terminal
    args = (*TINY, "logger=none", "trainer.eval_every_steps=0")
    out = run_cli(
        *args,
        f"hydra.run.dir={tmp_path / 'tty'}",
        stdout=follower,
        stderr=follower,
        stdin=follower,
        capture_output=False,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    terminal = b"".join(chunks).decode(errors="replace")
    assert out.returncode == 0, terminal
    assert "epoch 1/2" in terminal and "samples_s=" in terminal and "lr=" in terminal and "acc=" in terminal
    piped = run_cli(*args, f"hydra.run.dir={tmp_path / 'pipe'}")
    assert piped.returncode == 0
    assert "samples_s=" not in piped.stdout + piped.stderr and "val_acc" in piped.stdout
