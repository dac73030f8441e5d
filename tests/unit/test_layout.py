"""The house keeps its own rules: every default lives in the schema, the shipped config is a
package, and nothing in the pure tier imports torch."""

import dataclasses
import subprocess
import sys

import yaml

from bsexp.config import schema
from conftest import CONF, ROOT


def schema_paths(cls, prefix=""):
    """Every key path a bsexp schema defines, nested dataclasses included."""
    paths = set()
    for f in dataclasses.fields(cls):
        paths.add(prefix + f.name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            paths |= schema_paths(type(default), f"{prefix}{f.name}.")
    return paths


def yaml_paths(node, prefix=""):
    paths = set()
    for key, value in node.items():
        paths.add(prefix + key)
        if isinstance(value, dict):
            paths |= yaml_paths(value, f"{prefix}{key}.")
    return paths


def test_config_yaml_holds_no_value_a_schema_defines():
    composed = yaml.safe_load((CONF / "config.yaml").read_text())
    written = yaml_paths({k: v for k, v in composed.items() if k not in ("defaults", "hydra")})
    defined = schema_paths(schema.Config)
    assert not written & defined, f"defaults written twice: {sorted(written & defined)}"
    assert set(composed) == {"defaults", "hydra"}


def test_group_options_do_not_repeat_their_schemas_defaults():
    # An option file sets only what differs from its schema (a value equal to the default is a
    # second copy that can drift).
    by_name = {name.removeprefix("schema_"): cls for name, cls in schema.SCHEMAS.items()}
    repeated = []
    for path in sorted(CONF.glob("*/*.yaml")):
        group = path.parent.name
        if group in ("experiment", "comparison", "hydra"):  # @package _global_: no schema of their own
            continue
        node = yaml.safe_load(path.read_text()) or {}
        schemas = [
            d.split("@")[0].strip("/").removeprefix("schema_")
            for d in node.get("defaults", [])
            if isinstance(d, str) and d.startswith("/schema_")
        ]
        if group == "logger":  # logger=[a,b] merges its options onto one schema, Config.logger's: none names it
            assert not schemas, path
            continue
        [schema_name] = schemas
        cls = by_name[schema_name]
        defaults = {
            f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
            for f in dataclasses.fields(cls)
        }
        for key, value in node.items():
            if key != "defaults" and key in defaults and str(defaults[key]) == str(value):
                repeated.append(f"{path.relative_to(CONF)}: {key}")
    assert not repeated, repeated


def test_the_config_is_shipped_inside_the_package():
    assert CONF == ROOT / "bsexp" / "conf" and (CONF / "__init__.py").exists()
    assert (ROOT / "conf").resolve() == CONF.resolve()  # the top-level conf/ is the same folder


def test_the_pure_modules_do_not_import_torch():
    # The batch math, the policies, the config and its checks are read, and run, without torch:
    # a bad config is refused in a second, and the unit tier stays fast.
    code = (
        "import sys; import bsexp.batch.plan, bsexp.batch.schedule, bsexp.batch.scaling, bsexp.batch.layout, "
        "bsexp.batch.hparams, bsexp.batch.control, bsexp.batch.policies, bsexp.batch.policies.fixed, "
        "bsexp.batch.policies.accumulation, bsexp.batch.policies.finder, bsexp.batch.policies.scheduled, "
        "bsexp.batch.policies.adaptive, bsexp.batch.policies.branch, "
        "bsexp.finder.search, bsexp.config.schema, bsexp.config.checks, bsexp.config.env, bsexp.train.preflight, "
        "bsexp.report.analysis; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
