"""The configuration reference the docs site generates (scripts/config_reference.py) lists every key
of every shipped option with the default the command line composes, the bounds the checks apply and
the comment the schema's source gives it: checked against Hydra's own composition and the source."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import re
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "config_reference.py"
spec = importlib.util.spec_from_file_location("config_reference", SCRIPT)
ref = importlib.util.module_from_spec(spec)
sys.modules["config_reference"] = ref
spec.loader.exec_module(ref)


@pytest.fixture(scope="module")
def page() -> str:
    return ref.render()


def sections(page: str) -> dict[str, dict[str, list[str]]]:
    """{'group=option': {key: [type, default, bounds, comment]}} from the page's `###` tables, and
    'top' for the top level."""
    out: dict[str, dict[str, list[str]]] = {}
    current: list[str] = []
    for line in page.splitlines():
        if line.startswith("## Top level"):
            current = ["top"]
            out["top"] = {}
        elif line.startswith("### "):
            current = re.findall(r"`([a-z_]+=[a-z0-9_]+)`", line)
            for name in current:
                out[name] = {}
        elif line.startswith("## "):
            current = []
        elif current and (row := re.match(r"^\| `([A-Za-z0-9_.]+)` \| (.*) \|$", line)):
            cells = re.split(r"(?<!\\)\|", row.group(2))
            for name in current:
                out[name][row.group(1)] = [c.strip().replace("\\|", "|") for c in cells]
    return out


def flat(node, prefix=""):
    out = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def composed(overrides):
    with initialize_config_module(config_module="bsexp.conf", version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=overrides), resolve=False)


def test_every_key_of_every_option_is_listed_with_the_default_the_cli_composes(page):
    tables = sections(page)
    checked = 0
    for group in ref.GROUPS:
        for option in ref.options(group):
            rows = tables[f"{group}={option}"]
            keys = {f"{group}.{k}": v for k, v in flat(composed([f"{group}={option}"])[group]).items()}
            assert set(rows) == set(keys), (option, set(rows) ^ set(keys))
            for key, value in keys.items():
                default = rows[key][1]
                shown = ref.value_text(value)
                assert default == shown or f"{option}: {shown}" in default, (key, default, shown)
                checked += 1
    top = {k: v for k, v in flat(composed([])).items() if k.split(".")[0] not in (*ref.GROUPS, "hydra")}
    assert set(tables["top"]) == set(top)
    assert all(tables["top"][k][1] == ref.value_text(v) for k, v in top.items())
    assert checked > 150


def test_bounds_are_those_the_checks_apply(page):
    tables = sections(page)
    assert tables["batch=finder"]["batch.finder.init"][2] == ">= 2 (BatchNorm needs two samples)"
    assert tables["top"]["schedule.factor"][2] == "in (0, 1]"
    assert tables["data=synthetic"]["data.shape"][2] == ">= 1, not empty"
    assert tables["batch=fixed"]["batch.size"][0] == "int"
    assert tables["batch=finder"]["batch.size"][0] == "int or null"


def schema_classes():
    top, by_group = ref.schemas()
    pending = [top, *(c for options in by_group.values() for c in options.values() if c)]
    seen = set()
    while pending:  # the nested dataclasses too (batch.finder, trainer, ...)
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if dataclasses.is_dataclass(default):
                pending.append(type(default))
    return seen


def test_each_comment_in_the_schemas_source_stands_beside_its_key(page):
    """Read here line by line from the source, apart from the generator's ast and tokenize: a
    field's trailing comment, and the first line of a comment block just above a field."""
    rows = [r for table in sections(page).values() for r in table.items()]
    groups = {g: next(line for line in page.splitlines() if line.startswith(f"| `{g}=` |")) for g in ref.GROUPS}
    rows += [(g, ["", "", "", line.replace("\\|", "|")]) for g, line in groups.items()]  # a group's own comment
    expected = 0
    for cls in schema_classes():
        lines = inspect.getsource(cls).splitlines()
        for n, line in enumerate(lines):
            field = re.match(r"^\s+(\w+): [^#]*=.*?\s+#\s*(.+)$", line)
            above = re.match(r"^\s+(\w+): ", line) and n and re.match(r"^\s+#\s*(.+)$", lines[n - 1])
            for name, text in [(field.group(1), field.group(2))] if field else []:
                expected += 1
                assert any(k.split(".")[-1] == name and text.strip() in cells[3] for k, cells in rows), (name, text)
            if above:
                block = n - 1
                while block > 0 and re.match(r"^\s+#", lines[block - 1]):
                    block -= 1
                first = lines[block].strip().lstrip("#").strip()
                name = re.match(r"^\s+(\w+): ", line).group(1)
                expected += 1
                assert any(k.split(".")[-1] == name and first in cells[3] for k, cells in rows), (name, first)
    assert expected > 50
