"""`floorguard emulate`: an OpenAI-compatible backend that serves with the simulator's
continuous-batching model in real time (no GPU, no weights).

Each request needs `max_tokens` output tokens (for chat, `max_completion_tokens` first, as
vLLM reads it; at least `min_tokens`; the emulated model never stops early, as with
`ignore_eos: true`). Its prompt is counted as the guard meters it without a tokenizer
(UTF-8 bytes + 2 per text, a chat message's role among them, + 8 per chat message): that is
the `prompt_tokens` it reports and what a profile's per-prompt-token prefill charges.
`stream_options.include_usage` ends a stream with a usage chunk, as vLLM does. `C` slots
run in the `BatchingBackend`; the rest wait, FIFO or — with `--scheduling-policy priority`
— by vLLM's `(priority, arrival)`, and a running request is never preempted. A streamed
response sends one chunk per token as the batch produces it (the first when prefill ends).
`/metrics` has vLLM-style running/waiting gauges.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from floorguard.core.request import Request
from floorguard.profiles import get_profile
from floorguard.proxy.edge.normalize import BadRequestError, prompt_tokens
from floorguard.proxy.edge.openai_format import (
    completion_body,
    error_body,
    stream_chunk,
    usage_chunk,
)
from floorguard.sim.backend import SimBackend, create_backend

__all__ = ["Emulator", "create_emulator_app"]


@dataclass(eq=False)
class _Job:
    request: Request
    priority: float
    first_token: asyncio.Future[float] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    done: asyncio.Future[float] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    running: bool = False
    cancelled: bool = False


class Emulator:
    def __init__(
        self,
        profile: str,
        slots: int,
        *,
        priority_scheduling: bool = False,
        model: str | None = None,
        seed: int = 0,
        kv_blocks: int | None = None,
        block_tokens: int = 16,
    ) -> None:
        """`kv_blocks`: report a KV cache of that many `block_tokens`-token blocks in
        vLLM's `vllm:cache_config_info`, as vLLM does (the emulator itself never runs out
        of memory: it reports the figure, for a guard's start-up check)."""
        self.model = model or "floorguard-emulated"
        """The name it serves; with `model` given, a request naming another is a 404 (as
        vLLM answers) and `/v1/models` lists it; without, any name is served (the name in
        replies is this one) and `/v1/models` lists none."""
        self.check_model = model is not None
        self.slots = slots
        self.priority_scheduling = priority_scheduling
        service = get_profile(profile)
        self._backend: SimBackend = create_backend(service, slots, np.random.default_rng(seed))
        self._step_s = service.step_s(1)
        """How often a stream checks for new tokens: one decode step."""
        self._t0 = time.monotonic()
        self._waiting: list[tuple[float, int, _Job]] = []
        self._running: dict[Any, _Job] = {}
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.registry = CollectorRegistry()
        Gauge("vllm:num_requests_running", "Requests running", registry=self.registry).set_function(
            lambda: len(self._running)
        )
        Gauge("vllm:num_requests_waiting", "Requests waiting", registry=self.registry).set_function(
            lambda: sum(not j.cancelled for *_, j in self._waiting)
        )
        Gauge(
            "floorguard_backend_slots",
            "The backend's own slot count (a guard checks its slots partition against it)",
            registry=self.registry,
        ).set(slots)
        if kv_blocks is not None:
            Gauge(
                "vllm:cache_config_info",
                "The KV cache's configuration (as vLLM reports it)",
                ["block_size", "num_gpu_blocks"],
                registry=self.registry,
            ).labels(str(block_tokens), str(kv_blocks + 1)).set(1)  # + vLLM's null block
        self.in_flight_max = 0
        """The most requests this backend ever held at once, running or waiting: the
        fleet's SLOTS bound is at most `slots` here."""
        Gauge(
            "floorguard_backend_in_flight_max",
            "High-water mark of requests held at once (running + waiting)",
            registry=self.registry,
        ).set_function(lambda: self.in_flight_max)

    def _now(self) -> float:
        return time.monotonic() - self._t0

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def submit(self, tokens: int, priority: float, prompt_tokens: int = 0) -> _Job:
        seq = next(self._ids)
        job = _Job(Request(seq, "emulated", self._now(), tokens, prompt_tokens), priority)
        key = priority if self.priority_scheduling else 0.0
        heapq.heappush(self._waiting, (key, seq, job))
        held = len(self._running) + sum(not j.cancelled for *_, j in self._waiting)
        self.in_flight_max = max(self.in_flight_max, held)
        self._wake.set()
        return job

    def cancel(self, job: _Job) -> None:
        """The client went away: a waiting job is dropped; a running one runs to its end (a
        real server aborts it; the model keeps the batch as it was)."""
        job.cancelled = True

    def _admit(self, now: float) -> None:
        while self._waiting and len(self._running) < self.slots:
            job = heapq.heappop(self._waiting)[2]
            if job.cancelled:
                continue
            first_at = self._backend.join(job.request, now)
            job.running = True
            self._running[job.request.request_id] = job
            self._resolve_later(job.first_token, first_at)

    def _resolve_later(self, future: asyncio.Future[float], at: float) -> None:
        def resolve() -> None:
            if not future.done():
                future.set_result(at)

        asyncio.get_running_loop().call_later(max(0.0, at - self._now()), resolve)

    async def _loop(self) -> None:
        while True:
            now = self._now()
            for rid in self._backend.complete_due(now):
                job = self._running.pop(rid)
                if not job.done.done():
                    job.done.set_result(now)
            self._admit(now)
            at = self._backend.next_completion_at()
            self._wake.clear()
            timeout = None if at is None else max(0.0, at - self._now())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def _stream_tokens(
        self, job: _Job, response: web.StreamResponse, rid: str, chat: bool
    ) -> None:
        """One SSE chunk per output token, as the model produces them: the first when
        prefill ends, then as the batch advances (checked every decode step), the rest
        at completion; the last chunk carries `finish_reason: length`."""
        tokens = job.request.num_output_tokens
        sent = 0

        async def send_through(count: int) -> None:
            nonlocal sent
            while sent < count:
                sent += 1
                finish = "length" if sent == tokens else None
                chunk = stream_chunk(rid, self.model, chat, " tok", finish, created_at=time.time())
                await response.write(chunk)

        await job.first_token
        await send_through(1)
        while not job.done.done():
            produced = self._backend.tokens_out(job.request.request_id, self._now())
            await send_through(min(produced, tokens - 1))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(job.done), self._step_s)
        await send_through(tokens)

    # -- HTTP -----------------------------------------------------------------------------

    async def handle(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
            # vLLM: for chat, max_completion_tokens wins over the deprecated max_tokens
            cap = (body.get("max_completion_tokens") if chat else None) or body.get("max_tokens")
            tokens = max(int(cap or 16), int(body.get("min_tokens") or 0))
            priority = float(body.get("priority") or 0)
            stream = bool(body.get("stream", False))
            options = body.get("stream_options") or {}
            include_usage = stream and bool(options.get("include_usage", False))
            prompt = prompt_tokens(body, chat=chat)
            if (wrong := self._wrong_model(body)) is not None:
                return wrong
        except BadRequestError as exc:
            return web.json_response(error_body(exc.kind, str(exc)), status=400)
        except (ValueError, TypeError, AttributeError) as exc:
            return web.json_response(error_body("invalid_request", str(exc)), status=400)
        if tokens < 1:
            return web.json_response(
                error_body("invalid_request", "max_tokens must be ≥ 1"), status=400
            )
        job = self.submit(tokens, priority, prompt)
        rid = f"emu-{job.request.request_id}"
        try:
            if not stream:
                await job.done
                return web.json_response(
                    completion_body(
                        rid,
                        self.model,
                        chat,
                        " tok" * tokens,
                        completion_tokens=tokens,
                        prompt_tokens=prompt,
                        created_at=time.time(),
                    )
                )
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await self._stream_tokens(job, response, rid, chat)
            if include_usage:
                await response.write(
                    usage_chunk(
                        rid,
                        self.model,
                        chat,
                        prompt_tokens=prompt,
                        completion_tokens=tokens,
                        created_at=time.time(),
                    )
                )
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancel(job)
            raise

    def _wrong_model(self, body: dict[str, Any]) -> web.Response | None:
        """With a model name: vLLM's 404 for a request naming another (None: served)."""
        if self.check_model and body.get("model") != self.model:
            return web.json_response(
                error_body(
                    "model_not_found", f"The model `{body.get('model')!s:.80}` does not exist."
                ),
                status=404,
            )
        return None

    async def embed(self, request: web.Request) -> web.Response:
        """`/v1/embeddings`: one input's vector after one forward pass over it (a step of
        the service model, in a slot, as vLLM schedules an embedding among its sequences);
        usage reports the input's tokens, none produced."""
        try:
            body = json.loads(await request.read())
            prompt = prompt_tokens(body, chat=False, embedding=True)
            priority = float(body.get("priority") or 0)
            if (wrong := self._wrong_model(body)) is not None:
                return wrong
        except BadRequestError as exc:
            return web.json_response(error_body(exc.kind, str(exc)), status=400)
        except (ValueError, TypeError, AttributeError) as exc:
            return web.json_response(error_body("invalid_request", str(exc)), status=400)
        job = self.submit(1, priority, prompt)
        try:
            await job.done
        except asyncio.CancelledError:
            self.cancel(job)
            raise
        vector = [round(float(x), 6) for x in np.sin(np.arange(8) + prompt)]
        return web.json_response(
            {
                "object": "list",
                "model": self.model,
                "data": [{"object": "embedding", "index": 0, "embedding": vector}],
                "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
            }
        )


def create_emulator_app(emulator: Emulator) -> web.Application:
    app = web.Application()

    async def models(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": emulator.model, "object": "model", "owned_by": "floorguard"}]
                if emulator.check_model
                else [],  # it serves any name: none to list (a guard checks none)
            }
        )

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(emulator.registry), content_type="text/plain")

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def on_startup(_: web.Application) -> None:
        await emulator.start()

    async def on_cleanup(_: web.Application) -> None:
        await emulator.stop()

    async def completions(request: web.Request) -> web.StreamResponse:
        return await emulator.handle(request, chat=False)

    async def chat_completions(request: web.Request) -> web.StreamResponse:
        return await emulator.handle(request, chat=True)

    async def embeddings(request: web.Request) -> web.Response:
        return await emulator.embed(request)

    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
