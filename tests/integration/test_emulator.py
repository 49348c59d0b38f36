"""The emulated backend over real loopback HTTP: streams one chunk per token as the batch
produces it, and serves its waiting queue with vLLM's priority semantics (no preemption)."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import openai

from floorguard.rig.emulator import Emulator, create_emulator_app


async def _stream(url, tokens):
    """Arrival time of each SSE token chunk, and the finish reasons."""
    times, finishes = [], []
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url + "/v1/completions",
            json={"model": "m", "prompt": "x", "max_tokens": tokens, "stream": True},
        ) as r,
    ):
        async for line in r.content:
            if line.startswith(b"data: {"):
                times.append(time.monotonic())
                finishes.append(json.loads(line[6:])["choices"][0]["finish_reason"])
    return times, finishes


def test_a_stream_sends_each_token_as_it_is_produced(live):
    url, _ = live.serve(lambda: create_emulator_app(Emulator("v100-moe", 4)))
    times, finishes = live.run(_stream(url, 40))
    assert len(times) == 40
    assert finishes[-1] == "length" and not any(finishes[:-1])
    span = times[-1] - times[0]
    assert span > 0.3  # 39 decode steps of ≈ 15 ms
    # evenly paced, not a burst at the end: the middle token arrives mid-way
    assert 0.3 < (times[20] - times[0]) / span < 0.7


async def _finish_order(url, priorities):
    """Start a long request on the one slot, then queue one per priority; return the order
    in which the queued ones finish."""
    order = []

    async def one(priority, tokens):
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                url + "/v1/completions",
                json={"model": "m", "prompt": "x", "max_tokens": tokens, "priority": priority},
            ) as r,
        ):
            await r.read()
            order.append(priority)

    running = asyncio.create_task(one(99, 30))
    await asyncio.sleep(0.1)
    queued = []
    for priority in priorities:
        queued.append(asyncio.create_task(one(priority, 2)))
        await asyncio.sleep(0.02)
    await asyncio.gather(running, *queued)
    return order


def test_priority_scheduling_orders_the_waiting_queue_without_preemption(live):
    url, _ = live.serve(
        lambda: create_emulator_app(Emulator("v100-moe", 1, priority_scheduling=True))
    )
    assert live.run(_finish_order(url, [5, 1, 3])) == [99, 1, 3, 5]


def test_fcfs_ignores_priority(live):
    url, _ = live.serve(lambda: create_emulator_app(Emulator("v100-moe", 1)))
    assert live.run(_finish_order(url, [5, 1, 3])) == [99, 5, 1, 3]


def test_the_emulator_reads_the_fields_vllm_reads(live):
    """The official client against the emulator: chat's `max_completion_tokens` is the cap,
    `prompt_tokens` is the prompt's count (the guard's byte bound: 5 + 2 per text, the role
    4 + 2, + 8 per message, + 8 for the template), and `include_usage` ends a stream with a
    usage chunk that has no choices."""
    url, _ = live.serve(lambda: create_emulator_app(Emulator("v100-moe", 4)))
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    messages = [{"role": "user", "content": "hello"}]
    chat = client.chat.completions.create(
        model="m", messages=messages, max_completion_tokens=5, max_tokens=40
    )
    assert chat.usage.completion_tokens == 5 and chat.choices[0].message.content.count("tok") == 5
    assert chat.usage.prompt_tokens == 5 + 2 + (4 + 2) + 8 + 8
    chunks = list(
        client.completions.create(
            model="m",
            prompt="x",
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert [c.choices[0].text for c in chunks[:-1]] == [" tok"] * 3
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3
    assert chunks[-1].usage.prompt_tokens == 1 + 2


def test_with_a_model_name_the_emulator_answers_404_for_another_as_vllm_does(live):
    """`--model NAME`: a request naming another model is a 404 `model_not_found`, and
    /v1/models lists NAME; a prompt it cannot count is a 400. Without a name, any model is
    served, and it lists none."""
    named, _ = live.serve(lambda: create_emulator_app(Emulator("v100-moe", 4, model="llama")))
    client = openai.OpenAI(base_url=named + "/v1", api_key="x", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["llama"]
    assert client.completions.create(model="llama", prompt="x", max_tokens=2).usage
    try:
        client.completions.create(model="qwen", prompt="x", max_tokens=2)
        raise AssertionError("a model it does not serve was served")
    except openai.NotFoundError as exc:
        assert exc.body["code"] == "model_not_found"
    try:
        client.completions.create(model="llama", prompt=[{"not": "a prompt"}], max_tokens=2)
        raise AssertionError("an uncountable prompt was served")
    except openai.BadRequestError as exc:
        assert exc.status_code == 400
    anyname, _ = live.serve(lambda: create_emulator_app(Emulator("v100-moe", 4)))
    client = openai.OpenAI(base_url=anyname + "/v1", api_key="x", max_retries=0)
    assert client.completions.create(model="whatever", prompt="x", max_tokens=2).usage
    assert client.models.list().data == []  # it serves any name: it lists none
