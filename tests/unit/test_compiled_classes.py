"""What mypyc compiles must not depend on what its build can see (docs/architecture.md).

pip builds the package in an isolated environment without floorguard's runtime
dependencies, so there mypyc sees prometheus-client's or aiohttp's classes as `Any`. A
compiled class that extends one is then laid out as a native class over a base it does not
know, and the process crashes when the base's code touches it: every `floorguard serve`
of such a build died with SIGSEGV registering the metrics collector. A class in a compiled
module may extend only classes mypyc compiles with it, or the standard bases it knows;
anything else must be declared `@mypyc_attr(native_class=False)`, which builds it as an
ordinary Python class in either environment.
"""

from __future__ import annotations

import ast
from pathlib import Path

import floorguard
from floorguard._compiled import COMPILED, source_path

SRC = Path(floorguard.__file__).parent.parent

KNOWN_BASES = {
    ("abc", "ABC"),
    ("enum", "Enum"),
    ("enum", "IntEnum"),
    ("enum", "StrEnum"),
    ("typing", "Generic"),
    ("typing", "NamedTuple"),
    ("typing", "Protocol"),
    *(("builtins", name) for name in ("object", "Exception", "ValueError", "RuntimeError")),
}


def _imports(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """Each name a module binds by import → (the module it comes from, its name there)."""
    names: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = (node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name] = (alias.name, "")
    return names


def _is_interpreted(node: ast.ClassDef) -> bool:
    return any(
        isinstance(d, ast.Call)
        and isinstance(d.func, ast.Name)
        and d.func.id == "mypyc_attr"
        and any(
            k.arg == "native_class" and isinstance(k.value, ast.Constant) and not k.value.value
            for k in d.keywords
        )
        for d in node.decorator_list
    )


def _foreign_bases(module: str, src: Path = SRC) -> list[str]:
    """`Class(base)` for each base of a native class in `module` mypyc does not compile."""
    tree = ast.parse(source_path(src, module).read_text())
    imported = _imports(tree)
    local = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    foreign = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef) or _is_interpreted(node):
            continue
        for base in node.bases:
            root = base.value if isinstance(base, ast.Subscript) else base  # Generic[T]
            if isinstance(root, ast.Name) and root.id in local:
                continue
            if isinstance(root, ast.Name):
                origin = imported.get(root.id, ("builtins", root.id))
            elif isinstance(root, ast.Attribute) and isinstance(root.value, ast.Name):
                origin = (imported.get(root.value.id, (root.value.id, ""))[0], root.attr)
            else:
                origin = ("?", ast.unparse(root))
            if origin[0] not in COMPILED and origin not in KNOWN_BASES:
                foreign.append(f"{module}.{node.name}({ast.unparse(base)})")
    return foreign


def test_a_compiled_class_extends_only_what_is_compiled_with_it():
    assert [f for module in COMPILED for f in _foreign_bases(module)] == []


def test_the_check_finds_a_class_over_a_dependencys_base(tmp_path):
    """The check itself: the collector without its declaration is reported, with it not."""
    metrics = source_path(SRC, "floorguard.proxy.observe.metrics").read_text()
    undeclared = metrics.replace("@mypyc_attr(native_class=False)", "")
    assert undeclared != metrics
    package = tmp_path / "floorguard" / "proxy" / "observe"
    package.mkdir(parents=True)
    (package / "metrics.py").write_text(undeclared)
    assert _foreign_bases("floorguard.proxy.observe.metrics", tmp_path) == [
        "floorguard.proxy.observe.metrics._GuardCollector(Collector)"
    ]


def test_an_editable_reinstall_reuses_a_compiled_core_whose_sources_are_unchanged(tmp_path):
    """setup.py reuses the compiled core an editable install left in `src/` (the README's
    second command after its first: it compiled for five minutes again) only while every
    compiled module is there and its source is the one compiled."""
    import hashlib  # noqa: PLC0415
    import importlib.machinery  # noqa: PLC0415
    import json  # noqa: PLC0415

    from floorguard._compiled import HASHES_FILE, reusable  # noqa: PLC0415

    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    hashes = {}
    for module in COMPILED:
        source = source_path(tmp_path, module)
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(f"# {module}\n")
        source.with_name(source.stem + suffix).write_bytes(b"")
        hashes[module] = hashlib.sha256(source.read_bytes()).hexdigest()
    record = tmp_path / "floorguard" / HASHES_FILE
    record.write_text(json.dumps(hashes))
    assert reusable(tmp_path)
    edited = source_path(tmp_path, COMPILED[0])
    edited.write_text("# changed since it was compiled\n")
    assert not reusable(tmp_path)  # a changed source: compiled again
    edited.write_text(f"# {COMPILED[0]}\n")
    edited.with_name(edited.stem + suffix).unlink()
    assert not reusable(tmp_path)  # one module not compiled: compiled again


def test_no_compiled_module_keeps_a_generator_at_module_level():
    """mypyc evaluates a module-level generator expression eagerly: one kept as a generator
    over `itertools.count()` (fresh request ids) filled the memory at import, and CI's
    compiled run was killed while it collected the tests. One consumed at once by a call
    (`tuple(… for …)`) is harmless; in a function a generator stays lazy."""
    import ast  # noqa: PLC0415

    found = []
    for module in COMPILED:
        tree = ast.parse(source_path(SRC, module).read_text())
        for statement in tree.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            consumed = {
                id(arg)
                for node in ast.walk(statement)
                if isinstance(node, ast.Call)
                for arg in node.args
            }
            found += [
                f"{module}:{node.lineno}"
                for node in ast.walk(statement)
                if isinstance(node, ast.GeneratorExp) and id(node) not in consumed
            ]
    assert found == []
