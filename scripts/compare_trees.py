"""Run one `floorguard … --json` command under two source trees, alternately, and print the
chosen figures side by side (the machine is noisy: only a side-by-side run compares).

    python scripts/compare_trees.py OLD_SRC NEW_SRC --rounds 5 \\
        --field sim_requests_per_s --field decision_us -- bench sim --json --duration-s 300

Each tree runs as `PYTHONPATH=TREE python -m floorguard.cli ARGS` with this interpreter
(a tree checked out with `git worktree add` works: its dependencies are this venv's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys


def _run(tree: str, args: list[str]) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run(
        [sys.executable, "-m", "floorguard.cli", *args],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out[out.index("{") :])


def _get(data: dict[str, object], dotted: str) -> float:
    value: object = data
    for part in dotted.split("."):
        value = value[part]  # type: ignore[index]
    return float(value)  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--field", action="append", required=True)
    argv = sys.argv[1:]
    if "--" not in argv:
        parser.error("give the floorguard command after --")
    cut = argv.index("--")
    ns, args = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    seen: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    for round_ in range(ns.rounds):
        for side in ("old", "new") if round_ % 2 == 0 else ("new", "old"):
            data = _run(getattr(ns, side), args)
            for field in ns.field:
                seen[side].setdefault(field, []).append(_get(data, field))
    print(f"{' '.join(args)}: {ns.rounds} rounds, alternating")
    for field in ns.field:
        old, new = seen["old"][field], seen["new"][field]
        mo, mn = statistics.median(old), statistics.median(new)
        print(
            f"  {field}: old median {mo:.4g} ({min(old):.4g}–{max(old):.4g}), "
            f"new median {mn:.4g} ({min(new):.4g}–{max(new):.4g}), new/old {mn / mo:.3f}"
        )


if __name__ == "__main__":
    main()
