"""An example out-of-process learner for `learner: http` (wire format: docs/http.md).

It admits surplus work while the guard's surplus queue is shorter than the backends' slots
and ranks shorter requests first. It is untrusted by design: whatever it answers, the guard
keeps every assured tenant's floor.

    python examples/learner_service.py --port 9000
"""

from __future__ import annotations

import argparse

from aiohttp import web


async def propose(request: web.Request) -> web.Response:
    summary = await request.json()
    load = summary["load"]
    admit = load["queued_surplus"] < load["slots"]
    return web.json_response(
        {"admit": admit, "proposed_class": None, "priority_hint": summary["max_tokens"]}
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    args = parser.parse_args()
    app = web.Application()
    app.router.add_post("/propose", propose)
    web.run_app(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
