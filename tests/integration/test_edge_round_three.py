"""Issue 47's attacks against a real `floorguard serve` on loopback: prompt the meter did
not see (a chat role, a suffix beside token ids), bills that vanished, the ends of a drain,
a backend's garbage reply, and the lows of the admin API, tracing and headers. After each
the decision log verifies (`guard_process`)."""

from __future__ import annotations

import pytest

from tests.integration.test_attacks import guard_process

pytest_plugins = ["tests.integration.test_attacks"]  # its `scripted` backend fixture

CHAT = "/v1/chat/completions"


@pytest.mark.parametrize(
    ("body", "path", "code"),
    [
        ({"messages": [{"role": "r" * 20_000, "content": "hi"}]}, CHAT, "invalid_role"),
        ({"messages": [{"role": "r" * 20_000, "content": "x"}] * 40}, CHAT, "invalid_role"),
        ({"messages": [{"role": "user", "content": "hi", "name": "n" * 20_000}]}, CHAT,
         "prompt_too_long"),
        ({"prompt": [1, 2, 3], "suffix": "s" * 20_000}, "/v1/completions", "prompt_too_long"),
    ],
    ids=["huge-role", "forty-roles", "huge-name", "suffix-beside-ids"],
)  # fmt: skip
def test_prompt_hidden_where_the_meter_did_not_look_is_refused(tmp_path, scripted, body, path,
                                                               code):  # fmt: skip
    """A 20,000-byte role was metered as 19 tokens and forty of them as 448 (vLLM renders
    ≈ 800,000); a token-id prompt's 20,000-byte suffix as 3. Each is refused before the
    backend (a role outside `limits.chat_roles`, or a prompt counted past
    `max_prompt_tokens` = 4,096 here), and the assured tenant is served after."""
    backend, url = scripted
    backend.mode, before = "ok", len(backend.bodies)
    with guard_process(tmp_path, [url], limits={"max_prompt_tokens": 4096}) as guard:
        status, payload, _, _ = guard.post({"model": "m", "max_tokens": 4, **body}, "free", path)
        assert (status, payload["error"]["code"]) == (400, code)
        assert len(backend.bodies) == before
        status, _, headers, _ = guard.post(
            {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
            path=CHAT,
        )
        assert (status, headers["x-floorguard-decision"]) == (200, "entitled")
