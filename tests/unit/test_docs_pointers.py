"""Every pointer to the documentation that bsexp's source gives — in the messages it prints, its
docstrings, comments and shipped configs — names a page and a heading that exist: `docs: <page
title>` (optionally `, "<heading>"`), `README: <heading>`, and `docs/<page>.md` (optionally
`#<anchor>`, resolved to a heading as MkDocs' table of contents names it). On 3ea6d43 a start-up
message pointed to "README: The gradient noise scale", a section the README no longer had."""

from __future__ import annotations

import ast
import re
import unicodedata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SOURCES = sorted([*(ROOT / "bsexp").rglob("*.py"), *(ROOT / "bsexp" / "conf").rglob("*.yaml")])

# The three forms; a page title or heading runs to the end of its sentence, clause or line.
TITLED = re.compile(r"\b(docs|README): ([^\n;)]+)")
PATHED = re.compile(r"\bdocs/([\w./-]+\.md)(?:#([\w-]+))?")
HEADING = re.compile(r'^, "([^"]+)"')


def slugify(text: str) -> str:
    """A heading's anchor as MkDocs writes it (Python-Markdown's toc extension, which mkdocs.yml
    uses with its default slugify): markup dropped, accents folded to ASCII, what is not a word
    character, space or hyphen removed, lower case, runs of spaces and hyphens one hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).replace("`", "").replace("*", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def headings(page: Path) -> list[str]:
    """The page's headings as a reader sees them (markup dropped), outside code blocks."""
    found, fenced = [], False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+?)\s*#*$", line)):
            found.append(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m[1]).replace("`", "").replace("*", ""))
    return found


def nav_titles(nav) -> dict[str, str]:
    """mkdocs.yml's navigation: each title it gives a page, and the page."""
    titles: dict[str, str] = {}
    for entry in nav:
        if isinstance(entry, dict):
            for title, target in entry.items():
                if isinstance(target, str) and target.endswith(".md"):
                    titles[title] = target
                elif isinstance(target, list):
                    titles |= nav_titles(target)
    return titles


def page_titles() -> dict[str, Path]:
    """Every title a page goes by: its navigation title and its first heading."""
    titles = {t: DOCS / p for t, p in nav_titles(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]).items()}
    for page in DOCS.rglob("*.md"):
        if found := headings(page):
            titles.setdefault(found[0], page)
    return titles


def pointers() -> list[tuple[str, str]]:
    """(file:line, the line from the pointer on) of every pointer in the package's source."""
    found = []
    for path in SOURCES:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            matches = [*TITLED.finditer(line), *PATHED.finditer(line)]
            found += [(f"{path.relative_to(ROOT)}:{number}", line[m.start() :]) for m in matches]
    return found


def resolve(text: str, titles: dict[str, Path]) -> str | None:
    """Why the pointer at the start of `text` names nothing, or None where it names a page and
    heading that exist."""
    if m := PATHED.match(text):
        page = DOCS / m[1]
        if not page.is_file():
            return f"no page docs/{m[1]}"
        anchors = {slugify(h) for h in headings(page)}
        return None if m[2] is None or m[2] in anchors else f"no heading of docs/{m[1]} has the anchor #{m[2]}"
    where, rest = text.split(": ", 1)
    if where == "README":
        known = {h: ROOT / "README.md" for h in headings(ROOT / "README.md")}
    else:
        known = titles
    # The longest title the text starts with, ending where the sentence or clause does.
    named = [t for t in known if re.match(re.escape(t) + r"(?=$|[,.;:)\"'])", rest)]
    if not named:
        return f"no {'README heading' if where == 'README' else 'docs page'} is titled as {rest!r} begins"
    title = max(named, key=len)
    if where != "README" and (h := HEADING.match(rest[len(title) :])):
        if h[1] not in headings(known[title]):
            return f"{known[title].relative_to(ROOT)} has no heading {h[1]!r}"
    return None


def test_mkdocs_slugify_is_the_one_this_test_uses():
    toc = pytest.importorskip("markdown.extensions.toc")  # the docs extra; CI installs it beside dev
    for page in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        for heading in headings(page):
            assert slugify(heading) == toc.slugify(heading, "-"), heading


def test_every_pointer_to_the_docs_names_a_page_and_heading_that_exist():
    titles = page_titles()
    found = pointers()
    # The scan finds them: the message build.py prints with the noise scale, a docstring's, a config's.
    files = {where.split(":")[0] for where, _ in found}
    assert {"bsexp/engine/build.py", "bsexp/train/cli.py", "bsexp/batch/scaling.py"} <= files, files
    broken = [f"{where}: {text[:80]!r}: {why}" for where, text in found if (why := resolve(text, titles))]
    assert not broken, "\n".join(broken)


def test_the_check_finds_a_pointer_to_a_heading_that_is_gone():
    titles = page_titles()
    assert resolve("README: The gradient noise scale)", titles) is not None  # 3ea6d43's start-up message
    assert resolve('docs: The noise scale and the critical batch, "BatchNorm")', titles) is None
    assert resolve('docs: The noise scale and the critical batch, "Batch norm")', titles) is not None
    assert resolve("docs/results/experiments.md#the-regularisers-a-batch-size-moves)", titles) is None
    assert resolve("docs/results/experiments.md#the-regularisers", titles) is not None
    assert resolve("docs/results/nowhere.md", titles) is not None


def test_the_printed_messages_carry_pointers_too():
    """The pointers in strings the package prints (not docstrings) are among those checked."""
    printed = []
    for path in (ROOT / "bsexp").rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        printed += [
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            if TITLED.search(node.value) or PATHED.search(node.value)
        ]
    titles = page_titles()
    assert len(printed) >= 2, printed  # build.py's and batch/scaling.py's, at least
    for message in printed:
        for m in [*TITLED.finditer(message), *PATHED.finditer(message)]:
            assert resolve(message[m.start() :], titles) is None, message
