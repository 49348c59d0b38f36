"""Instructions per simulated request in the compiled build, counted by callgrind (free of
this machine's noise, unlike wall time): the marquee's `Engine.run` inside
`simulate_once` (300 s of arrivals, 6,468 requests, no trace), collected only inside the
compiled `Engine.run`.

    python scripts/callgrind_sim.py

For the pure build (two trees side by side, in one process) `scripts/ab_core.py
--instructions` counts the same work.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

LOOP = "CPyDef_engine___Engine___run"  # the compiled simulator's event loop


def _work() -> None:
    from floorguard.sim.run import simulate_once  # noqa: PLC0415
    from floorguard.sim.scenarios import marquee  # noqa: PLC0415

    print(simulate_once(marquee(duration_s=300.0), seed=0, record=False).num_requests)


def main() -> None:
    if sys.argv[1:] == ["--work"]:
        _work()
        return
    from floorguard._compiled import running  # noqa: PLC0415

    if not running().startswith("compiled"):
        sys.exit(f"the core running here is {running()}: this counts the compiled build only")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             f"--toggle-collect={LOOP}", sys.executable, __file__, "--work"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        summary = re.search(r"^summary: (\d+)", out.read_text(), re.MULTILINE)
    if summary is None:
        sys.exit("callgrind wrote no summary")
    instructions, requests = int(summary.group(1)), int(run.stdout.split()[-1])
    print(
        f"{instructions:,} instructions in the loop, {requests:,} requests: "
        f"{instructions / requests:,.0f} per request"
    )


if __name__ == "__main__":
    main()
