"""The compiled core (issue 30): the pure decision core, the simulator's hot loop and the HTTP
guard's request path built with mypyc from the same Python sources, where a C compiler
exists.

`pip install .` (and `pip install -e .`) compiles `floorguard._compiled.COMPILED`; where it
cannot — no C compiler, no Python headers, a type error mypyc refuses, or
`FLOORGUARD_PURE=1` set for the build — it says why and installs the pure-Python package,
which behaves the same. Beside the compiled modules it writes `_compiled.json`, the sha256
of each source it compiled: at import, `floorguard._compiled` runs the pure sources instead
when any of them has changed since (an editable install whose compiled modules lie beside
their sources never hides a developer's edit). `floorguard --version` says which runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent
sys.path.insert(0, str(ROOT / "src" / "floorguard"))
from _compiled import COMPILED, HASHES_FILE, reusable, source_path  # noqa: E402

sys.path.pop(0)


def _say(message: str) -> None:
    print(f"floorguard: {message}", file=sys.stderr)


def _sources() -> list[str]:
    return [str(source_path(ROOT / "src", module).relative_to(ROOT)) for module in COMPILED]


def _mypyc_extensions() -> list:
    """mypyc's extension modules, or none (pure) with the reason said."""
    if os.environ.get("FLOORGUARD_PURE") == "1":
        _say("FLOORGUARD_PURE=1: installing the pure-Python core")
        return []
    if "editable_wheel" in sys.argv and reusable(ROOT / "src"):
        _say(
            "the core compiled in src/ matches its sources: reused, not compiled again "
            "(delete src/floorguard/_compiled.json to compile it anew)"
        )
        return []
    compiler = os.environ.get("CC", "cc").split()[0]
    if shutil.which(compiler) is None:
        _say(f"no C compiler ({compiler}): installing the pure-Python core")
        return []
    try:
        from mypyc.build import mypycify  # noqa: PLC0415  (a build without it stays pure)
    except ImportError:
        _say("mypyc is not installed: installing the pure-Python core")
        return []
    # No config file: the project's strict mypy settings are for `mypy` itself (CI runs it);
    # the build env has no numpy or stubs, so what it cannot see is Any, not an error.
    options = ["--config-file", "", "--ignore-missing-imports", "--python-version", "3.11"]
    try:
        return mypycify([*options, *_sources()], opt_level="3", debug_level="0")
    except (Exception, SystemExit) as exc:  # a type error mypyc refuses exits
        _say(f"mypyc could not compile the core ({exc!r}): installing the pure-Python core")
        return []


class OptionalBuildExt(build_ext):
    """Compile the core where it can; anything that fails leaves the pure package whole."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # a missing header, a compiler error
            _say(f"compiling the core failed ({exc}): installing the pure-Python core")
            for built in self.get_outputs():
                Path(built).unlink(missing_ok=True)
            return
        if self.extensions:
            self._write_hashes()

    def _hashes_path(self) -> Path:
        """`_compiled.json` in the package folder the extensions are built into (the source
        tree for an editable install, the build folder for a wheel)."""
        target = Path(self.get_ext_fullpath(COMPILED[0])).parent
        while target.name != "floorguard":
            target = target.parent
        return target / HASHES_FILE

    def _write_hashes(self) -> None:
        hashes = {
            module: hashlib.sha256(source_path(ROOT / "src", module).read_bytes()).hexdigest()
            for module in COMPILED
        }
        self._hashes_path().write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")
        _say(f"compiled {len(COMPILED)} modules with mypyc")

    def get_outputs(self) -> list[str]:
        outputs = super().get_outputs()
        if self.extensions:
            outputs.append(str(self._hashes_path()))
        return outputs


setup(ext_modules=_mypyc_extensions(), cmdclass={"build_ext": OptionalBuildExt})
