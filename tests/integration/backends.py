"""A misbehaving OpenAI-shaped backend for the attack tests: it records every body the
guard forwards and answers as its `mode` says (a fake upstream; the guard in front of it is
a real `floorguard serve` process)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from floorguard.proxy.edge.openai_format import completion_body, stream_chunk


class ScriptedBackend:
    def __init__(self) -> None:
        self.mode = "ok"
        """ok | stall (stream: one chunk, then silence) | slow-stream (a chunk every 0.2 s
        for 2 s) | error (500 with an internal detail) | redirect | reject (404 for the
        model) | big (a 5 MB reply) | cookie (answers ok with a `Set-Cookie`) | garbage (a 200
        whose body is no completion: HTML for a whole reply, plain text for a stream).
        Whatever the mode, a prompt `huge:N` is answered with N MB (`_huge`)."""
        self.bodies: list[dict[str, Any]] = []
        self.request_ids: list[str | None] = []
        """Each forwarded request's `x-request-id` header."""
        self.objectives: list[str | None] = []
        """… and its `x-gateway-inference-objective`."""
        self.traces: list[tuple[str | None, str | None]] = []
        """… and its `traceparent` and `tracestate`."""
        self.cookies: list[str | None] = []
        """… and its `Cookie` header."""
        self.hits: dict[str, int] = {}
        self.models_delay_s = 0.0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/elsewhere", self._elsewhere)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, _: web.Request) -> web.Response:
        """`/v1/models`, taking `models_delay_s` (a backend slow to list its models)."""
        self.hits["models"] = self.hits.get("models", 0) + 1
        await asyncio.sleep(self.models_delay_s)
        # it serves any name (mode ok): it lists none, as `floorguard emulate` without
        # --model, so a guard checks no name against it
        return web.json_response({"object": "list", "data": []})

    async def _elsewhere(self, _: web.Request) -> web.Response:
        self.hits["elsewhere"] = self.hits.get("elsewhere", 0) + 1
        return web.json_response(
            completion_body("x", "m", False, "redirected", completion_tokens=1, created_at=0.0)
        )

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.bodies.append(body)
        self.request_ids.append(request.headers.get("x-request-id"))
        self.objectives.append(request.headers.get("x-gateway-inference-objective"))
        self.traces.append((request.headers.get("traceparent"), request.headers.get("tracestate")))
        self.cookies.append(request.headers.get("Cookie"))
        answer = self._by_mode(body)
        if answer is not None:
            return answer
        prompt = body.get("prompt")
        if isinstance(prompt, str) and prompt.startswith("huge:"):
            return await self._huge(request, body, int(prompt[5:]))
        if not body.get("stream"):
            answer = web.json_response(
                completion_body("x", "m", False, "ok", completion_tokens=1, created_at=0.0)
            )
            if self.mode == "cookie":
                answer.set_cookie("session", f"of-request-{len(self.bodies)}", path="/")
            return answer
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(stream_chunk("x", "m", False, " tok", created_at=0.0))
        if self.mode == "stall":
            await asyncio.sleep(3600)
        for _ in range(10 if self.mode == "slow-stream" else 1):
            await asyncio.sleep(0.2 if self.mode == "slow-stream" else 0)
            await response.write(stream_chunk("x", "m", False, " tok", created_at=0.0))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _by_mode(self, body: dict[str, Any]) -> web.Response | None:
        """The answer of a mode that does not serve the request (None: one that does)."""
        if self.mode == "error":
            return web.Response(status=500, text="Traceback: secret at 10.1.2.3:8000")
        if self.mode == "reject":  # vLLM's answer to a model it does not serve
            return web.json_response(
                {"error": {"message": "The model `mx` does not exist.", "code": 404}}, status=404
            )
        if self.mode == "redirect":
            raise web.HTTPTemporaryRedirect("/elsewhere")
        if self.mode == "garbage":
            if body.get("stream"):
                return web.Response(text="upstream says hi\n\n", content_type="text/event-stream")
            return web.Response(text="<html>502 Bad Gateway</html>", content_type="text/html")
        if self.mode == "big":
            return web.Response(body=b'{"x": "' + b"a" * 5_000_000 + b'"}')
        return None

    async def _huge(self, request: web.Request, body: dict[str, Any], megabytes: int):
        """A reply of `megabytes` MB (prompt `huge:N`), as fast as the reader takes it —
        what a large `top_logprobs` at a long `max_tokens` makes — streamed or whole."""
        piece = stream_chunk("x", "m", False, " " + "t" * 65_000, created_at=0.0)
        count = megabytes * 1_000_000 // len(piece)
        if not body.get("stream"):
            text = "a" * (megabytes * 1_000_000)
            return web.json_response(
                completion_body("x", "m", False, text, completion_tokens=1, created_at=0.0)
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(count):
            await response.write(piece)
        self.hits["huge_done"] = self.hits.get("huge_done", 0) + 1
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
