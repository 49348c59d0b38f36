"""The CLI and `serve` run as the shipped Deployment runs them — a read-only
root file system and a home that does not exist (`readOnlyRootFilesystem: true`, no
writable /tmp). Nothing imported at start may need a writable directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.integration.processes import emulate, listening, stop, watch

READ_ONLY = r"""
for m in $(awk '{print $2}' /proc/self/mounts | grep -Ev '^/(proc|sys|dev)' | sort -u); do
  mount --bind "$m" "$m" 2>/dev/null || true
  mount -o remount,bind,ro "$m" || exit 97
done
touch /tmp/floorguard-ro-probe 2>/dev/null && exit 98
exec env HOME=/nonexistent "$@"
"""
"""Every mount of this private namespace made read-only, then the command (exit 97/98: the
namespace could not be made read-only)."""


def _read_only(*command: str) -> list[str]:
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", READ_ONLY, "sh",
            *command]  # fmt: skip


def _can_unshare() -> bool:
    try:
        done = subprocess.run(_read_only("true"), check=False, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


needs_namespaces = pytest.mark.skipif(
    not (os.geteuid() == 0 and _can_unshare()),
    reason="needs root and mount namespaces (unshare) to make the file system read-only",
)


def test_starting_the_cli_imports_no_matplotlib():
    """The CLI with every subcommand, and the guard's server, load without matplotlib
    (which needs a writable cache directory); figures import it when they draw. Nor does
    the guard's server, or the fleet simulator, import scipy: both are the `eval` extra,
    which a guard's install leaves out."""
    code = (
        "import sys, floorguard.cli, floorguard.proxy.process.serve, floorguard.datacenter; "
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported at start'; "
        "assert 'scipy' not in sys.modules, 'scipy imported by serve'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_command_that_needs_the_eval_extra_says_so_without_it(tmp_path: Path):
    """Without scipy and matplotlib (the `eval` extra), `experiment run` is a clear error
    naming the extra, not a traceback; `serve --check` needs neither."""
    code = (
        "import sys; sys.modules['scipy'] = sys.modules['matplotlib'] = None; "
        "from floorguard.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "experiment", "run", "E1", "--quick", "--out",
         str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "pip install 'floorguard[eval]'" in done.stderr and "Traceback" not in done.stderr
    example = Path(__file__).parents[2] / "examples" / "guard.yaml"
    checked = subprocess.run(
        [sys.executable, "-c", code, "serve", "--check", "--config", str(example)],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "FLOORGUARD_JWT_SECRET": "x" * 40},
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr[-2000:]


@needs_namespaces
def test_the_cli_and_serve_run_on_a_read_only_root(tmp_path: Path):
    """`floorguard --version` prints its version, and `floorguard serve` answers /healthz
    and stops cleanly on SIGTERM, with every mount read-only and no home."""
    done = subprocess.run(
        _read_only(sys.executable, "-m", "floorguard", "--version"),
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("floorguard ")
    emulator_url, emulator = emulate()
    config = tmp_path / "guard.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "port": 0,
                "contracts": [
                    {"tenant": "acme", "class": "assured", "floor": 4, "deadline_ms": 1820}
                ],
                "backends": [{"url": emulator_url, "slots": 4}],
                "identity": {
                    "mode": "header",
                    "header": "X-Tenant",
                    "trusted_upstreams": ["127.0.0.1/32"],
                },
            }
        )
    )
    server = watch(
        subprocess.Popen(
            _read_only(sys.executable, "-m", "floorguard", "serve", "--config", str(config)),
            stdout=subprocess.PIPE,
        )
    )
    try:
        url = listening(server)[0]
        with urllib.request.urlopen(f"{url}/healthz", timeout=10) as r:
            assert r.status == 200
        server.send_signal(signal.SIGTERM)  # sh and env exec'd: this is the guard itself
        assert server.wait(30) == 0
    finally:
        stop(server, emulator)


@needs_namespaces
def test_the_demo_on_a_read_only_root_says_where_its_figure_could_not_go():
    """`floorguard demo` where nothing is writable (the PNG's directory, matplotlib's cache,
    no home, no temporary directory): it runs, prints its table, and says the figure was
    not written and how to write it — where it used to end in matplotlib's traceback."""
    done = subprocess.run(
        _read_only(sys.executable, "-m", "floorguard", "demo", "--duration-s", "2"),
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "floor-entitled attainment" in done.stdout  # its table
    assert "the figure was not written" in done.stdout and "--png PATH" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
