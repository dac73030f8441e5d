"""Every `python -m bsexp.train` command shown in README.md, docs/ and the generated configuration
reference, read as a shell would read it, and turned into the command lines that compose it with
`--cfg job` (cheap: nothing trains). tests/cli/test_docs_commands.py runs them; so does

    python scripts/docs_commands.py            # list every command and the lines that check it
    python scripts/docs_commands.py --compose  # run JSON jobs from stdin through bsexp.train.main

How a command is read (docs/development.md says the same to the docs' writers):

- in fenced code blocks, and in inline code of the prose (joined across line breaks);
- `python -m bsexp.train`, `python3 -m bsexp.train` or `torchrun [options] -m bsexp.train`; what
  stands before it on the line (an environment assignment such as WANDB_MODE=online) is not part
  of the command;
- a line ending in `\\` continues on the next; an unquoted `#` after a space starts a comment, and
  `;`, `&&`, `|`, `&` end the command;
- `<...>` is a placeholder the reader fills in: it is given the stand-in value PLACEHOLDER;
- `$NAME` / `${NAME}` is expanded from an assignment `NAME=...` earlier in the same code block, and
  `$PWD` to the directory the commands run in; any other variable is an error;
- `-m` / `--multirun` (a sweep): the command-line sweep values are expanded as Hydra's basic sweeper
  expands them, and composed so that every value of every swept key appears in at least one
  composed point (a sweep of a x b values: max(a, b) points, not a x b); an experiment's own
  `hydra.sweeper.params` are checked by bsexp when its sweep starts, before any point trains;
- under torchrun, `distributed=ddp` is added where the command gives no `distributed=`, as bsexp
  adds it for a process torchrun started;
- `resume=...` continues a real run: the checker gives `hydra.run.dir=` (and a `resume=PATH`) the
  directory (and a checkpoint) of a small run it trained itself, and runs the command as written,
  without `--cfg job` (a resume puts the run's own overrides before the command's arguments, and
  Hydra's parser takes no override after `--cfg job`): a finished run says so and exits 0, or,
  given more epochs with checkpoint.allow_mismatch=true, trains them;
- `mkdir -p ...` and `printf ... > ...` lines before a command in the same code block are run first,
  in the directory the commands run in (they write the config files it reads);
- a command whose comment says `exits 2` documents an error: it must exit with code 2;
- a command that already asks for `--cfg`, `--help` or `--info` runs as written.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLACEHOLDER = "PLACEHOLDER"
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})")
_START = re.compile(r"(?:^|(?<=[\s`(]))(python3?|torchrun)\b")
_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_SETUP = re.compile(r"^\s*(mkdir -p |printf )")
_SHOWS = ("--cfg", "-c", "--help", "-h", "--info", "-i", "--hydra-help")


@dataclass
class Command:
    """One documented command: where it is, as written, and what the checker makes of it."""

    where: str  # file:line
    text: str  # as written (continuations joined)
    args: list[str]  # the arguments after `-m bsexp.train`, comment and placeholders resolved
    torchrun: bool = False
    multirun: bool = False
    expect_exit: int = 0
    setup: list[str] = field(default_factory=list)  # shell lines to run first, in the scratch directory

    @property
    def resumes(self) -> bool:
        return any(a.startswith("resume=") and a != "resume=null" for a in self.args)


def documents(root: Path = ROOT, generated: bool = True) -> list[tuple[str, str]]:
    """(name, markdown) of README.md, every page in docs/, and the generated configuration reference."""
    docs = [("README.md", (root / "README.md").read_text())]
    docs += [(str(p.relative_to(root)), p.read_text()) for p in sorted((root / "docs").rglob("*.md"))]
    if generated:
        sys.path.insert(0, str(root / "scripts"))
        from config_reference import render

        docs.append(("reference/config.md (generated)", render()))
    return docs


def _split_comment(text: str) -> tuple[str, str]:
    """The command and its shell comment: an unquoted `#` at the start or after a space."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i], text[i + 1 :].strip()
    return text, ""


def _expand(text: str, variables: dict[str, str], where: str) -> str:
    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in variables:
            raise ValueError(f"{where}: ${name} is not assigned in its code block (nor is it $PWD)")
        return variables[name]

    return _VAR.sub(value, text)


def parse(line: str, where: str, variables: dict[str, str], setup: list[str] | None = None) -> Command | None:
    """The command on one logical line (continuations already joined), or None if it has none."""
    at = line.find("-m bsexp.train")
    if at < 0:
        return None
    starts = list(_START.finditer(line[:at]))
    torchrun = next((m for m in starts if m.group(1) == "torchrun"), None)
    python = starts[-1] if starts and line[starts[-1].end() : at].strip() == "" else None
    launcher = torchrun or python
    if launcher is None:
        return None
    text = _split_comment(line[launcher.start() :])[0].strip()
    # Placeholders first: their words may hold a quote ("<the trunk sweep's directory>").
    rest, comment = _split_comment(re.sub(r"<[^<>]*>", PLACEHOLDER, line[at + len("-m bsexp.train") :]))
    rest = _expand(rest, variables, where)
    lexer = shlex.shlex(rest, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = ""
    args: list[str] = []
    for token in lexer:
        if token and set(token) <= set(";&|"):
            break
        args.append(token)
    multirun = any(a in ("-m", "--multirun") for a in args)
    args = [a for a in args if a not in ("-m", "--multirun")]
    return Command(
        where=where,
        text=text,
        args=args,
        torchrun=torchrun is not None,
        multirun=multirun,
        expect_exit=2 if "exits 2" in comment else 0,
        setup=list(setup or []),
    )


def extract(name: str, markdown: str, scratch: str = "$PWD") -> list[Command]:
    """Every command of one markdown document, in code blocks and in inline code."""
    commands: list[Command] = []
    lines = markdown.splitlines()
    prose: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if not opened:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        fence, indent = opened.group(2), len(opened.group(1))
        i += 1
        variables = {"PWD": scratch}
        setup: list[str] = []
        logical, first = "", None
        while i < len(lines) and not (
            lines[i].strip().startswith(fence) and lines[i].strip() == fence[0] * len(lines[i].strip())
        ):
            raw = lines[i][indent:] if lines[i][:indent].isspace() else lines[i]
            first = first or i + 1
            if raw.rstrip().endswith("\\"):
                logical += raw.rstrip()[:-1] + " "
                i += 1
                continue
            logical += raw
            where = f"{name}:{first}"
            command = parse(logical, where, variables, setup)
            if command is not None:
                commands.append(command)
            elif _SETUP.match(logical):
                setup.append(_expand(logical.strip(), variables, where))
            elif (assigned := _ASSIGN.match(logical)) and "bsexp.train" not in logical:
                words = shlex.split(assigned.group(2)) if assigned.group(2).strip() else [""]
                variables[assigned.group(1)] = " ".join(words)
            logical, first = "", None
            i += 1
        i += 1  # the closing fence
    # Inline code in the prose, a paragraph at a time (a code span may wrap onto the next line).
    paragraph: list[tuple[int, str]] = []
    for number, text in [*prose, (0, "")]:
        if text.strip():
            paragraph.append((number, text))
            continue
        if paragraph:
            joined = " ".join(t.strip() for _, t in paragraph)
            for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", joined):
                if "-m bsexp.train" in span:
                    line = next((n for n, t in paragraph if span.split()[0] in t), paragraph[0][0])
                    command = parse(span, f"{name}:{line}", {"PWD": scratch})
                    if command is not None:
                        commands.append(command)
        paragraph = []
    return commands


def sweep_points(args: list[str]) -> list[list[str]]:
    """The points a multirun's command-line sweep composes: every value of every swept key in at
    least one point (max over the keys of their number of values), each as Hydra will run it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = OverridesParser.create().parse_overrides(args)
    dims = []
    for arg, override in zip(args, overrides):
        if override.is_sweep_override():
            key = override.get_key_element()
            dims.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            dims.append([arg])
    count = max(len(values) for values in dims) if dims else 1
    points: list[list[str]] = []
    for n in range(count):
        point = [values[n % len(values)] for values in dims]
        if point not in points:
            points.append(point)
    return points


def command_lines(
    command: Command,
    run_dir: str | None = None,
    checkpoint: str | None = None,
    cwd: str = "$PWD",
    sweep_dir: str | None = None,
) -> list[list[str]]:
    """The argument lists (after `python -m bsexp.train`) that check one documented command, run
    in `cwd`; `run_dir` and `checkpoint`: a finished run, for a command that resumes one;
    `sweep_dir`: a finished sweep, for a command that continues one (`-m resume=auto`), run as it
    is written, -m and all."""
    args = [a.replace("$PWD", cwd) for a in command.args]
    if command.resumes and command.multirun:
        if sweep_dir is None:
            raise ValueError(f"{command.where}: continuing a sweep needs a sweep to continue")
        return [["-m", *(f"hydra.sweep.dir={sweep_dir}" if a.startswith("hydra.sweep.dir=") else a for a in args)]]
    if command.torchrun and not any(a.lstrip("+~").split("=")[0] == "distributed" for a in args):
        args.append("distributed=ddp")
    if command.resumes:
        if run_dir is None:
            raise ValueError(f"{command.where}: a resume needs a run to continue")
        args = [f"hydra.run.dir={run_dir}" if a.startswith("hydra.run.dir=") else a for a in args]
        args = [
            f"resume={checkpoint}" if a.startswith("resume=") and a not in ("resume=auto", "resume=null") else a
            for a in args
        ]
    shows = command.resumes or any(a.split("=")[0] in _SHOWS for a in args)
    points = sweep_points(args) if command.multirun else [args]
    # `--cfg job` first: a resume appends overrides of its own after the command's arguments, and
    # Hydra's parser takes no override after a flag.
    return [point if shows else ["--cfg", "job", *point] for point in points]


def compose_many(jobs: list[dict]) -> list[dict]:
    """Run `python -m bsexp.train ARGS` for each job ({"cwd": ..., "args": [...]}) through the CLI's
    own entry point, `bsexp.train.main`, in this one process: its exit code and the end of its
    stderr. A command line costs ~0.05 s here against ~0.3 s in a process of its own (Python and
    Hydra start once); a caller that finds a failure confirms it in a fresh process."""
    import contextlib
    import io
    import os

    from hydra.core.global_hydra import GlobalHydra

    import bsexp.train.cli as entry

    results = []
    home = os.getcwd()
    for job in jobs:
        out, err = io.StringIO(), io.StringIO()
        code = 0
        os.chdir(job["cwd"])
        sys.argv = ["bsexp.train", *job["args"]]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                entry.main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException as exc:  # noqa: B036 (a crash of one command is its result, not the run's)
                code = 1
                print(f"{type(exc).__name__}: {exc}", file=err)
            finally:
                GlobalHydra.instance().clear()
                os.chdir(home)
        results.append({"code": code, "stderr": err.getvalue()[-3000:]})
    return results


def main() -> None:
    if sys.argv[1:] == ["--compose"]:  # jobs as JSON on stdin, results as JSON on stdout
        import json

        jobs = json.load(sys.stdin)
        results = compose_many(jobs)
        sys.stdout = sys.__stdout__
        print(json.dumps(results))
        return
    total = 0
    for name, markdown in documents():
        for command in extract(name, markdown):
            total += 1
            lines = command_lines(command, run_dir="<a run>", checkpoint="<its checkpoint>")
            print(f"{command.where}: {command.text}")
            for args in lines:
                print(f"    python -m bsexp.train {shlex.join(args)}" + (" (exits 2)" if command.expect_exit else ""))
    print(f"{total} commands")


if __name__ == "__main__":
    main()
