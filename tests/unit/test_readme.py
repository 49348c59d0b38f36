from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_quickstart_has_exactly_two_commands():
    """The Quickstart block holds two set-up commands: the main job and the tests."""
    text = README.read_text()
    block = re.search(r"## Quickstart.*?```bash\n(.*?)```", text, re.S).group(1)
    commands = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2
    assert "floorguard demo" in commands[0] and "pytest" in commands[1]


def test_readme_library_example_runs():
    """The README's Python example executes as written."""
    text = README.read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
