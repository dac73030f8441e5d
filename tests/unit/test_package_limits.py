"""The package's limits, held by a test rather than by convention: no module of bsexp/ over 500
lines, no function over 60 (from its first decorator to its last line), no class over 15 methods
(docs/development.md). Ruff's nearest rules count statements (PLR0915) or public methods
(PLR0904), not lines and methods, so the limits are read from the syntax tree here."""

import ast
from pathlib import Path

from conftest import ROOT

MODULE_LINES, FUNCTION_LINES, CLASS_METHODS = 500, 60, 15


def over_limits(package: Path) -> tuple[list[str], int]:
    """What in `package` is over a limit (where, what, the limit), and how many functions were read."""
    over, functions = [], 0
    for path in sorted(package.rglob("*.py")):
        source, name = path.read_text(), str(path.relative_to(package.parent))
        if (lines := len(source.splitlines())) > MODULE_LINES:
            over.append(f"{name}: {lines} lines (at most {MODULE_LINES})")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions += 1
                lines = node.end_lineno - min([node.lineno, *(d.lineno for d in node.decorator_list)]) + 1
                if lines > FUNCTION_LINES:
                    over.append(f"{name}:{node.lineno} {node.name}: {lines} lines (at most {FUNCTION_LINES})")
            elif isinstance(node, ast.ClassDef):
                methods = sum(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) for b in node.body)
                if methods > CLASS_METHODS:
                    over.append(f"{name}:{node.lineno} {node.name}: {methods} methods (at most {CLASS_METHODS})")
    return over, functions


def test_no_module_function_or_class_of_the_package_is_over_its_limit():
    over, functions = over_limits(ROOT / "bsexp")
    assert functions > 500  # the whole package was read
    assert not over, "over the package's limits:\n" + "\n".join(over)


def test_each_limit_is_found_one_past_it(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES - 3))
    (package / "at.py").write_text(  # 60 lines with its decorator, 15 methods: within
        f"@staticmethod\ndef f():\n{body}\n    return 0\n\n\nclass A:\n"
        + "".join(f"    def m{i}(self):\n        pass\n" for i in range(CLASS_METHODS))
    )
    (package / "past.py").write_text(  # 61 lines with its decorator, 16 methods, 501 lines: over
        f"@staticmethod\n@staticmethod\ndef f():\n{body}\n    return 0\n\n\nclass A:\n"
        + "".join(f"    def m{i}(self):\n        pass\n" for i in range(CLASS_METHODS + 1))
        + "\n" * (MODULE_LINES - 95)
    )
    assert len((package / "past.py").read_text().splitlines()) == MODULE_LINES + 1
    over, _ = over_limits(package)
    assert over == [
        "pkg/past.py: 501 lines (at most 500)",
        "pkg/past.py:3 f: 61 lines (at most 60)",
        "pkg/past.py:64 A: 16 methods (at most 15)",
    ]
