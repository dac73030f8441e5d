"""The batch policies' extension point, as a user meets it: a policy of your own is one module and
one YAML whose `_target_` names it (both in the tests' own folder: tests/helpers/toy_policy.py,
tests/helpers/conf/batch/doubling.yaml), with nothing of bsexp's edited; its config dataclass holds
its node to its keys."""

import json
import subprocess
import sys

from conftest import HELPERS, cli_env

TINY = ["data.num_samples=600", "data.val_size=100", "model.width=8", "logger=none", "trainer.progress=false"]


def bsexp(data_root, cwd, *args):
    return subprocess.run(
        [sys.executable, "-m", "bsexp.train", *args],
        cwd=cwd,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_policy_of_your_own_is_one_module_and_one_yaml(data_root, tmp_path):
    search = f"hydra.searchpath=[file://{HELPERS / 'conf'}]"
    run_dir = tmp_path / "run"
    out = bsexp(data_root, tmp_path, search, "batch=doubling", "epochs=4", *TINY, f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    # 16, 32, 64, then held at max_size 64: every step of an epoch at its batch.
    assert summary["status"] == "completed" and summary["batch_size"] == 16 and summary["final_batch_size"] == 64
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["batch_size"] for r in records] == [16, 32, 64, 64]
    assert summary["steps"] == 24 + 12 + 6 + 6  # ceil(380 / b) steps an epoch: 600 samples, 480 to train, 100 held out
    # Its config dataclass holds the node to its keys: a typo is one line naming the key, exit code 2.
    typo = bsexp(
        data_root, tmp_path, search, "batch=doubling", "+batch.max_sise=3", *TINY, f"hydra.run.dir={tmp_path / 'typo'}"
    )
    assert typo.returncode == 2
    [line] = typo.stderr.strip().splitlines()
    assert line.startswith("error: batch.max_sise") and "Doubling's config" in line and "max_size" in line
    assert not (tmp_path / "typo").exists()


def test_a_misspelt_hook_of_your_own_policy_is_refused_not_silently_never_called(data_root, tmp_path):
    search = f"hydra.searchpath=[file://{HELPERS / 'conf'}]"
    out = bsexp(
        data_root,
        tmp_path,
        search,
        "batch=doubling",
        "batch._target_=toy_policy.Misspelt",  # Doubling with `def recrod`
        *TINY,
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("error: batch._target_=toy_policy.Misspelt: Misspelt.recrod is no hook")
    assert "did you mean record?" in line
    assert not (tmp_path / "run").exists()
