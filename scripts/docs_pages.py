"""The docs site's generated pages, written while `mkdocs build` runs (mkdocs-gen-files, mkdocs.yml):

- reference/config.md: the configuration reference, from the schemas (scripts/config_reference.py);
- reference/api/: one page per module of the bsexp package, found by walking the package as it is
  on disk, so that a module moved, split or added needs no edit here or in mkdocs.yml; the section's
  navigation is reference/api/SUMMARY.md (mkdocs-literate-nav).

Nothing is written into docs/ itself: the pages exist only in the build.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "bsexp"
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

from config_reference import render  # noqa: E402


def modules(package: Path) -> list[tuple[str, ...]]:
    """Dotted names (as tuples) of the package's modules: every .py file, packages by their
    __init__, leaving out __main__ and private modules, and the shipped config (bsexp/conf/)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if "conf" in parts[1:] or parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        elif parts[-1].startswith("_"):
            continue
        found.append(parts)
    return found


def main() -> None:
    with mkdocs_gen_files.open("reference/config.md", "w") as page:
        page.write(render())

    nav = mkdocs_gen_files.Nav()
    for parts in modules(PACKAGE):
        is_package = ROOT.joinpath(*parts, "__init__.py").is_file()
        doc = Path(*parts, "index.md") if is_package else Path(*parts[:-1], f"{parts[-1]}.md")
        nav[parts] = doc.as_posix()
        with mkdocs_gen_files.open(Path("reference/api", doc), "w") as page:
            page.write(f"# `{'.'.join(parts)}`\n\n::: {'.'.join(parts)}\n")
    with mkdocs_gen_files.open("reference/api/SUMMARY.md", "w") as summary:
        summary.writelines(nav.build_literate_nav())


main()
