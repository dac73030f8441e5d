"""The configuration reference, generated from the schemas: every key, its type, default, bounds
and the comment beside it in the schema's source.

    python scripts/config_reference.py > config.md     # the page the docs site builds (docs/)

The docs build (`mkdocs build`, through scripts/docs_pages.py) calls `render()`, so the page can
never lag the schema. Each shipped option (bsexp/conf/) is composed as the CLI composes it, and
its schema is the dataclass the composed node is typed by (bsexp/config/schema.py today), found
from the composition, not from a list kept here; a default that a config file sets over its
schema's is the one shown. Types and bounds come from the dataclasses and
their field metadata; the comments from the source (the comment lines just above a field and the
comment at the end of its line), read with `ast` and `tokenize`.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import importlib.resources
import inspect
import io
import re
import sys
import textwrap
import tokenize
import typing
from enum import Enum
from pathlib import Path
from typing import Any

ENTRY = "bsexp.train.cli"  # the CLI's module: importing it registers the schemas, wherever they live
CONF_PACKAGE = "bsexp.conf"
ROOT = Path(__file__).resolve().parent.parent
GROUPS = ("data", "model", "optimizer", "batch", "distributed", "logger")


# ---------------------------------------------------------------------------- the source's comments


def field_comments(cls: type) -> dict[str, str]:
    """{field name: its comment} for the fields a class declares itself: the comment lines just
    above the field (no blank line between) and the comment at the end of its statement."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}  # line -> comment text
    full_line: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            line = tok.start[0]
            comments[line] = tok.string.lstrip("#").strip()
            if not tok.line[: tok.start[1]].strip():
                full_line.add(line)
    lines = source.splitlines()
    body = ast.parse(source).body[0]
    out: dict[str, str] = {}
    for node in getattr(body, "body", []):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        line = node.lineno - 1
        while line in full_line and lines[line - 1].strip():
            above.insert(0, comments[line])
            line -= 1
        trailing = [
            comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments and n not in full_line
        ]
        text = " ".join(part for part in [*above, *trailing] if part and not part.startswith("noqa"))
        if text:
            out[node.target.id] = text
    return out


def comment_for(cls: type, name: str) -> str:
    """The comment of `name` in the nearest class of the MRO that comments it."""
    for klass in cls.__mro__:
        if dataclasses.is_dataclass(klass) and name in klass.__dict__.get("__annotations__", {}):
            text = field_comments(klass).get(name)
            if text:
                return text
    return ""


# ---------------------------------------------------------------------------- types, defaults, bounds


def type_text(tp: Any) -> str:
    """A field's type as a user writes it on the command line."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return " or ".join(type_text(a) for a in inner) + (" or null" if len(inner) < len(args) else "")
    if origin in (list, typing.List):  # noqa: UP006 (the schema's own spelling)
        return f"list of {type_text(args[0])}" if args else "list"
    if origin in (dict, typing.Dict):  # noqa: UP006 (the schema's own spelling)
        return f"map of {type_text(args[0])} to {type_text(args[1])}" if args else "map"
    if isinstance(tp, type) and issubclass(tp, Enum):
        return " \\| ".join(f"`{m.value}`" for m in tp)
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", str(tp))


def bound_text(f: dataclasses.Field) -> str:
    bound = f.metadata.get("bound")
    if bound is None:
        return ""
    parts = []
    if bound.low is not None or bound.high is not None:
        parts.append(bound.text)
    if bound.nonempty:
        parts.append("not empty")
    why = f.metadata.get("why")
    return " ".join([", ".join(parts), why]).strip()


def value_text(value: Any) -> str:
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Enum):
        return f"`{value.value}`"
    if isinstance(value, str) and value == "???":
        return "required"
    if isinstance(value, (list, tuple)):
        return "`[" + ", ".join(value_text(v).strip("`") for v in value) + "]`"
    return f"`{value}`"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") if "\\|" not in text else text.replace("\n", " ")


# ---------------------------------------------------------------------------- walking the schemas


def leaf_fields(cls: type, prefix: str = "") -> list[tuple[str, type, dataclasses.Field]]:
    """(dotted key, owning class, field) of every key under a dataclass, nested dataclasses opened."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            out += leaf_fields(type(default), f"{key}.")
        else:
            out.append((key, cls, f, hints[f.name]))
    return out


def table(rows: list[tuple[str, str, str, str, str]]) -> list[str]:
    out = ["| key | type | default | bounds | what it is |", "| --- | --- | --- | --- | --- |"]
    for key, tp, default, bound, comment in rows:
        out.append(f"| `{key}` | {tp} | {cell(default)} | {cell(bound)} | {cell(comment)} |")
    return out


def rows_for(cls: type, prefix: str, values: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, str, str]]:
    """One row per key; `values`: {option name: {key: composed default}} of the options that use
    this schema (a default shown per option where they differ)."""
    rows = []
    for key, owner, f, tp in leaf_fields(cls):
        if key == "_target_":
            comment = "the callable Hydra instantiates (swap it for your own)"
        else:
            comment = comment_for(owner, f.name)
        seen = {option: v.get(key) for option, v in values.items()}
        distinct = {value_text(v) for v in seen.values()}
        if len(distinct) == 1:
            default = distinct.pop()
        else:
            default = "; ".join(f"{option}: {value_text(v)}" for option, v in seen.items())
        rows.append((f"{prefix}{key}", type_text(tp), default, bound_text(f), comment))
    return rows


def flatten(container: Any, prefix: str = "") -> dict[str, Any]:
    out = {}
    if isinstance(container, dict):
        for k, v in container.items():
            if isinstance(v, dict) and v:
                out.update(flatten(v, f"{prefix}{k}."))
            else:
                out[f"{prefix}{k}"] = v
    return out


# ---------------------------------------------------------------------------- the page


def options(group: str) -> list[str]:
    """The shipped options of a config group: its files in bsexp/conf/<group>/."""
    folder = importlib.resources.files(CONF_PACKAGE).joinpath(*group.split("/"))
    return sorted(e.name[: -len(".yaml")] for e in folder.iterdir() if e.name.endswith(".yaml"))


def leading_comment(group: str, option: str) -> tuple[str, list[str]]:
    """A shipped config file's leading comment: its first paragraph, and the example lines
    (indented under the `#`) that follow it."""
    text = importlib.resources.files(CONF_PACKAGE).joinpath(*group.split("/"), f"{option}.yaml").read_text()
    para: list[str] = []
    examples: list[str] = []
    for line in text.splitlines():
        if line.startswith("# @package"):
            continue
        if not line.startswith("#"):
            break
        body = line[1:]
        if body.startswith("   ") and body.strip():  # an example, indented under the comment
            examples.append(body.strip())
        elif not body.strip():
            if para or examples:
                break
        elif examples:
            break
        else:
            para.append(body.strip())
    return " ".join(para), examples


def typed(node: Any) -> type | None:
    """The dataclass a composed node was merged onto (its schema), or None for a plain one."""
    from omegaconf import OmegaConf

    cls = OmegaConf.get_type(node)
    return cls if dataclasses.is_dataclass(cls) else None


@functools.cache
def compose_all() -> tuple[Any, dict[str, dict[str, Any]]]:
    """The default config (with Hydra's node) and {group: {option: the config with that option}},
    composed as the command line composes them."""
    from hydra import compose, initialize_config_module

    importlib.import_module(ENTRY)
    with initialize_config_module(config_module=CONF_PACKAGE, version_base="1.3"):
        base = compose("config", overrides=[], return_hydra_config=True)
        composed = {g: {o: compose("config", overrides=[f"{g}={o}"]) for o in options(g)} for g in GROUPS}
    return base, composed


def schemas() -> tuple[type, dict[str, dict[str, type | None]]]:
    """The top-level schema and {group: {option: its schema}}, read from the composed configs' types
    (whatever module defines them, however the option files reach them)."""
    base, composed = compose_all()
    top = typed(base)
    if top is None:
        raise SystemExit("the composed config is not typed by a schema dataclass")
    return top, {g: {o: typed(cfg[g]) for o, cfg in opts.items()} for g, opts in composed.items()}


def shown_path(source: str | None) -> str:
    """A source file as the reader finds it in the repository (bsexp/config/schema.py)."""
    path = Path(source or "?").resolve()
    for base in (ROOT, *path.parents):
        if path.is_relative_to(base) and (base / "bsexp").is_dir():
            return str(path.relative_to(base))
    return str(path)


def render() -> str:
    from omegaconf import OmegaConf

    base, composed = compose_all()
    choices = dict(base.hydra.runtime.choices)
    top = typed(base)
    if top is None:
        raise SystemExit("the composed config is not typed by a schema dataclass")
    group_schemas = {g: {o: typed(cfg[g]) for o, cfg in opts.items()} for g, opts in composed.items()}
    classes = [top, *(c for opts in group_schemas.values() for c in opts.values() if c)]
    sources = sorted({shown_path(inspect.getsourcefile(c)) for c in classes})

    out = [
        "# Configuration reference",
        "",
        f"Generated from the schemas in {', '.join(f'`{p}`' for p in sources)} and the shipped config",
        "files (`bsexp/conf/`), each time the site is built, by `scripts/config_reference.py`: every key,",
        "its type, its default (as the command line composes it), its bounds (checked before anything",
        "is written) and the comment beside it in the schema. Override any key with `key=value`;",
        "print the composed config of any command with `--cfg job`:",
        "",
        "```bash",
        "python -m bsexp.train batch=accumulation batch.size=1024 batch.micro_size=64 --cfg job",
        "```",
        "",
        "A key the config does not have, a value of the wrong type or one outside its bounds ends the",
        "command with one line naming the key (exit code 2).",
        "",
        "## Groups",
        "",
        "Each run takes one option of each group (`group=option`); the default is in bold.",
        "",
        "| group | options | what it is |",
        "| --- | --- | --- |",
    ]
    for group in GROUPS:
        names = [f"**`{o}`**" if o == choices.get(group) else f"`{o}`" for o in options(group)]
        out.append(f"| `{group}=` | {', '.join(names)} | {cell(comment_for(top, group))} |")
    experiments = options("experiment")
    out.append(
        f"| `experiment=` | {', '.join(f'`{o}`' for o in experiments)} | none by default ([below](#experiment)) |"
    )
    comparisons = options("comparison")
    out.append(
        f"| `comparison=` | {', '.join(f'`{o}`' for o in comparisons)} | none by default: arms tuned alike, "
        f"with `python -m bsexp.tune DIR comparison=NAME` ([below](#comparison)) |"
    )
    launchers = list(options("hydra/launcher"))
    out.append(
        f"| `hydra/launcher=` | Hydra's `basic` (default), `joblib` (the `parallel` extra), "
        f"{', '.join(f'`{o}`' for o in launchers)} (the `slurm` extra) | how a sweep's points are run |"
    )

    top_rows = [r for r in rows_for(top, "", {"": flatten(OmegaConf.to_container(base, resolve=False))})]
    top_rows = [r for r in top_rows if r[0].split(".")[0] not in GROUPS]
    out += [
        "",
        "## Top level",
        "",
        f"The run itself (`{top.__name__}`): seed, length, device, and the sections every run has.",
        "",
        *table(top_rows),
    ]

    for group in GROUPS:
        by_schema: dict[Any, list[str]] = {}
        for option, cls in group_schemas[group].items():
            by_schema.setdefault(cls or option, []).append(option)
        out += ["", f"## `{group}=`", ""]
        for cls, opts in by_schema.items():
            cls = cls if isinstance(cls, type) else None
            title = ", ".join(f"`{group}={o}`" for o in opts)
            out += [f"### {title}", ""]
            if cls is None:
                out += ["(a config file without a schema: its keys are those the file sets)", ""]
                continue
            doc = inspect.getdoc(cls) or ""
            if doc and not doc.startswith(f"{cls.__name__}("):
                out += [" ".join(doc.split()), ""]
            for option in opts:
                intro, examples = leading_comment(group, option)
                if intro:
                    out += [f"`{group}={option}`: {intro}", ""]
                if examples:
                    out += ["```bash", *examples, "```", ""]
            values = {o: flatten(OmegaConf.to_container(composed[group][o][group], resolve=False)) for o in opts}
            out += [f"Schema `{cls.__name__}`.", "", *table(rows_for(cls, f"{group}.", values)), ""]

    out += [
        "## `experiment=`",
        "",
        "An experiment pins a combination of the groups above and, with `-m`, sweeps it (its",
        "`hydra.sweeper.params`). The first paragraph of each file:",
        "",
        "| option | what it reproduces |",
        "| --- | --- |",
    ]
    for option in experiments:
        out.append(f"| `{option}` | {cell(leading_comment('experiment', option)[0])} |")
    out += [
        "",
        "## `comparison=`",
        "",
        "A comparison declares arms, their search spaces and the objective, ladder, budget and seeds they",
        "are compared by, before any run (`comparison.*` above; run with `python -m bsexp.tune DIR",
        "comparison=NAME`, docs: Comparing arms). The first paragraph of each file:",
        "",
        "| option | what it compares |",
        "| --- | --- |",
    ]
    for option in comparisons:
        out.append(f"| `{option}` | {cell(leading_comment('comparison', option)[0])} |")
    out.append("")
    return "\n".join(out)


def documented_keys(page: str) -> set[str]:
    """The keys a rendered page lists (first column of its tables)."""
    return set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", page, re.M))


if __name__ == "__main__":
    sys.stdout.write(render())
