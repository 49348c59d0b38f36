"""docs/quickstart.md, run as written: its `sh` blocks and its `python` block, in order, as
one bash script in an empty directory (the emulated backend standing in for vLLM, free
ports for 8001 and 8080). A newcomer following the page reaches guarded SDK calls with
the guard's own API key, and the decision log verifies."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from floorguard.rig.net import free_ports

PAGE = Path(__file__).parents[2] / "docs" / "quickstart.md"


def _script() -> str:
    """The page's `sh` and `python` blocks in order, as one bash script."""
    parts = ["set -e", "trap 'kill $(jobs -p) 2> /dev/null || true' EXIT"]
    for kind, body in re.findall(r"```(sh|python)\n(.*?)```", PAGE.read_text(), re.S):
        parts.append(body if kind == "sh" else f"python3 - <<'PY'\n{body}PY")
    return "\n".join(parts)


def test_the_quickstart_runs_as_written(tmp_path):
    backend, guard = free_ports(2)
    script = _script().replace("8001", str(backend)).replace("8080", str(guard))
    assert script.count("floorguard ") >= 6  # emulate, init, keys, check, serve, verify
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["timeout", "180", "bash", "-c", script],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert "config OK: 2 tenant(s), 1 backend(s)" in said
    assert "entitled 1\n tok tok tok tok tok tok tok tok" in said  # the SDK's call
    assert "OK: AF, DR, ORDER, SLOTS, MEMORY, TERMINAL hold" in said
    assert "Traceback" not in said + (tmp_path / "guard.log").read_text()
