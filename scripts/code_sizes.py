"""Module and function size figures for a source tree (a redesign's before and after).

    python scripts/code_sizes.py [src/floorguard]

Lines are physical lines (a function: its `def` to its last line, decorators excluded).
"""

from __future__ import annotations

import ast
import statistics
import sys
from pathlib import Path


def _quantile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(root: str = "src/floorguard") -> None:
    base = Path(root)
    modules: dict[str, int] = {}
    functions: list[tuple[int, str]] = []
    for path in sorted(base.rglob("*.py")):
        text = path.read_text()
        name = str(path.relative_to(base.parent))
        modules[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                functions.append((node.end_lineno - node.lineno + 1, f"{name}:{node.name}"))
    sizes = list(modules.values())
    lengths = [n for n, _ in functions]
    print(f"modules: {len(sizes)}, lines {sum(sizes)}")
    print(
        f"  module lines: median {statistics.median(sizes):g}, p90 {_quantile(sizes, 0.9)}, "
        f"max {max(sizes)} ({max(modules, key=modules.__getitem__)})"
    )
    print(
        f"functions: {len(lengths)}; lines median {statistics.median(lengths):g}, "
        f"p90 {_quantile(lengths, 0.9)}, max {max(lengths)}"
    )
    print("ten longest functions:")
    for n, where in sorted(functions, reverse=True)[:10]:
        print(f"  {n:4d}  {where}")
    print("five longest modules:")
    for name, n in sorted(modules.items(), key=lambda kv: -kv[1])[:5]:
        print(f"  {n:4d}  {name}")


if __name__ == "__main__":
    main(*sys.argv[1:])
