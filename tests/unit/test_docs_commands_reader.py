"""How scripts/docs_commands.py reads a documented command (tests/cli/test_docs_commands.py then
composes each): continuations, comments, torchrun, environment prefixes, placeholders, variables,
sweeps, resumes, set-up lines and documented errors, on markdown written here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "docs_commands.py"
spec = importlib.util.spec_from_file_location("docs_commands_reader", SCRIPT)
docs = importlib.util.module_from_spec(spec)
sys.modules["docs_commands_reader"] = docs
spec.loader.exec_module(docs)

PAGE = """# A page

Train with `python -m bsexp.train batch=finder
batch.size=1024` in prose, or `python -m bsexp.report <dir>` (not a training command).

```bash
D="data.num_samples=6875 data.val_size=2000"
python -m bsexp.train -m batch.size=32,64,128 seed=0,1 $D     # a sweep
torchrun --nnodes=2 --nproc_per_node=4 \\
    --rdzv-id=bs -m bsexp.train batch.size=1024 &
WANDB_MODE=online python -m bsexp.train logger.wandb.project=p; echo done
python -m bsexp.train branch.trunk=<the trunk sweep's directory> batch.size=512   # 7 x 6 branches
python -m bsexp.train batch.sise=64        # exits 2: did you mean batch.size?
python -m bsexp.train resume=auto hydra.run.dir=outputs/2026-11-22/10-00-00-4242
mkdir -p my_conf/model
python -m bsexp.train hydra.searchpath=[file://$PWD/my_conf] model=mynet
```
"""


@pytest.fixture(scope="module")
def commands():
    return docs.extract("page.md", PAGE)


def test_every_training_command_is_found_where_it_stands(commands):
    assert [c.where for c in commands] == [f"page.md:{n}" for n in (8, 9, 11, 12, 13, 14, 16, 3)]


def test_a_code_span_that_wraps_onto_the_next_line_is_one_command(commands):
    prose = commands[-1]
    assert prose.args == ["batch=finder", "batch.size=1024"] and not prose.multirun


def test_a_sweep_expands_so_that_every_value_of_every_key_is_composed(commands):
    sweep = commands[0]
    assert sweep.multirun and sweep.args[-2:] == ["data.num_samples=6875", "data.val_size=2000"]  # $D expanded
    points = docs.command_lines(sweep)
    assert [p[2:4] for p in points] == [
        ["batch.size=32", "seed=0"],
        ["batch.size=64", "seed=1"],
        ["batch.size=128", "seed=0"],
    ]
    assert all(p[:2] == ["--cfg", "job"] and "-m" not in p for p in points)


def test_torchrun_options_continuations_and_a_trailing_ampersand(commands):
    launched = commands[1]
    assert launched.torchrun and launched.args == ["batch.size=1024"]
    assert docs.command_lines(launched) == [["--cfg", "job", "batch.size=1024", "distributed=ddp"]]


def test_an_environment_prefix_and_what_follows_a_semicolon_are_not_arguments(commands):
    assert commands[2].args == ["logger.wandb.project=p"]


def test_a_placeholder_gets_a_stand_in_and_its_apostrophe_does_not_open_a_quote(commands):
    branch = commands[3]
    assert branch.args == ["branch.trunk=PLACEHOLDER", "batch.size=512"] and branch.expect_exit == 0


def test_a_documented_error_must_exit_2(commands):
    assert commands[4].expect_exit == 2 and commands[4].args == ["batch.sise=64"]


def test_a_resume_is_pointed_at_a_real_run(commands):
    resume = commands[5]
    assert resume.resumes
    assert docs.command_lines(resume, run_dir="/runs/a", checkpoint="/runs/a/c.pt") == [
        ["resume=auto", "hydra.run.dir=/runs/a"]  # run as written: Hydra takes no --cfg with a resume's own overrides
    ]
    with pytest.raises(ValueError, match="needs a run"):
        docs.command_lines(resume)


def test_set_up_lines_run_first_and_pwd_is_the_scratch_directory(commands):
    custom = commands[6]
    assert custom.setup == ["mkdir -p my_conf/model"]
    assert docs.command_lines(custom, cwd="/scratch")[0][2] == "hydra.searchpath=[file:///scratch/my_conf]"


def test_a_variable_not_assigned_in_its_block_is_an_error():
    with pytest.raises(ValueError, match=r"\$TINY is not assigned"):
        docs.extract("page.md", "```bash\npython -m bsexp.train $TINY\n```\n")
