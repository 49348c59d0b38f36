"""Usage from the backend's replies (docs/design.md §17): a JSON reply's `usage`, and a stream's
usage event read on its way — taken out of the client's stream where the guard, not the
client, asked for it — however the stream is cut into chunks."""

from __future__ import annotations

import itertools

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from floorguard.proxy.edge.normalize import EdgeLimits, normalize
from floorguard.proxy.edge.openai_format import stream_chunk, usage_chunk
from floorguard.proxy.observe.usage import MalformedReplyError, Usage, UsageTap, is_sse, reply_usage

EVENTS = [
    stream_chunk("r", "m", True, w, created_at=0.0) for w in ("one", " two", ' "usage" three')
]
USAGE = usage_chunk("r", "m", True, prompt_tokens=7, completion_tokens=3, created_at=0.0)
DONE = b"data: [DONE]\n\n"
STREAM = b"".join(EVENTS) + USAGE + DONE


def _through(tap: UsageTap, chunks: list[bytes]) -> bytes:
    return b"".join(tap.feed(c) for c in chunks) + tap.flush()


def test_a_json_reply_gives_its_usage_and_a_bad_one_none():
    def reply(usage: object) -> bytes:
        return orjson.dumps({"choices": [], "usage": usage})

    assert reply_usage(reply({"prompt_tokens": 4, "completion_tokens": 9})) == Usage(4, 9)
    assert reply_usage(b'{"choices": []}') is None
    for bad in ({"prompt_tokens": -1, "completion_tokens": 2},
                {"prompt_tokens": 1.5, "completion_tokens": 2}, None):  # fmt: skip
        assert reply_usage(reply(bad)) is None


@pytest.mark.parametrize(
    "body", [b"not json", b'["usage"]', b"{}", b'{"choices": "x"}', b"<html>502</html>"]
)
def test_a_reply_that_is_no_completion_is_malformed(body):
    """A 200 whose body is not a JSON object with a `choices` list is no reply to relay."""
    with pytest.raises(MalformedReplyError):
        reply_usage(body)


def test_a_stream_must_open_as_server_sent_events():
    assert is_sse(b"data: {}\n\n") and is_sse(b"\n: keep-alive\n\n") and is_sse(b"event: x\n")
    assert not is_sse(b"<html>") and not is_sse(b"upstream says hi\n\n") and not is_sse(b"")


@given(cuts=st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_however_the_stream_is_cut_the_usage_is_read_and_stripped_only_if_unasked(cuts):
    bounds = sorted({0, len(STREAM), *cuts})
    chunks = [STREAM[a:b] for a, b in itertools.pairwise(bounds)]
    stripped = UsageTap(strip=True)
    assert _through(stripped, chunks) == b"".join(EVENTS) + DONE
    assert stripped.usage == Usage(7, 3)
    kept = UsageTap(strip=False)
    assert _through(kept, chunks) == STREAM
    assert kept.usage == Usage(7, 3)


def test_whole_events_without_usage_pass_as_they_came():
    tap = UsageTap(strip=True)
    assert tap.feed(EVENTS[0]) is EVENTS[0]
    assert tap.feed(b"data: {") == b""  # half an event waits for its end
    assert tap.feed(b'"x": 1}\n\n') == b'data: {"x": 1}\n\n'
    assert tap.flush() == b"" and tap.usage is None


def test_a_last_event_without_its_blank_line_still_counts():
    tap = UsageTap(strip=False)
    assert _through(tap, [b"".join(EVENTS), USAGE[:-2]]) == b"".join(EVENTS) + USAGE[:-2]
    assert tap.usage == Usage(7, 3)


def test_every_stream_asks_the_backend_for_its_usage():
    limits = EdgeLimits()
    ask = {"model": "m", "prompt": "hi", "max_tokens": 4, "stream": True}
    plain = normalize(orjson.dumps(ask), chat=False, limits=limits)
    assert orjson.loads(plain.body)["stream_options"] == {"include_usage": True}
    assert not plain.usage_asked
    asked = {**ask, "stream_options": {"include_usage": True, "continuous_usage_stats": False}}
    work = normalize(orjson.dumps(asked), chat=False, limits=limits)
    assert work.usage_asked
    assert orjson.loads(work.body)["stream_options"]["continuous_usage_stats"] is False
    whole = normalize(orjson.dumps({**ask, "stream": False}), chat=False, limits=limits)
    assert "stream_options" not in orjson.loads(whole.body)


def test_the_tap_counts_whole_events_read_for_the_estimate():
    """Each whole event read counts once, however the chunks split them (the estimate of a
    stream cut before its usage: one completion token an event)."""
    for cut in range(1, len(STREAM)):
        tap = UsageTap(strip=True)
        _through(tap, [STREAM[:cut], STREAM[cut:]])
        assert tap.events == len(EVENTS) + 2  # the tokens, the usage event and [DONE]
    tap = UsageTap(strip=True)
    tap.feed(b"".join(EVENTS[:2]) + EVENTS[2][:9])  # cut mid-event: two whole ones read
    assert (tap.events, tap.usage, tap.ended) == (2, None, False)
