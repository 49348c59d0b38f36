"""The guard's API keys (docs/http.md, The guard's own API keys) on a real `floorguard
serve`, with the official `openai` SDK: a tenant issued a key by `floorguard keys create` is
served; revoked by `floorguard keys revoke`, it is refused within a second or two by the
same running process (no restart, no signal); a JWT still works beside it; another
deployment's key and a key in the URL are refused with a JSON error; the decision log
verifies afterwards (`guard_process`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import openai
import orjson

from tests.integration.live import token
from tests.integration.test_attacks import guard_process

pytest_plugins = ["tests.integration.test_attacks"]  # its `emulator` backend fixture


def _keys(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "floorguard", "keys", *args, "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def _complete(guard, api_key: str) -> int:
    with openai.OpenAI(base_url=guard.url + "/v1", api_key=api_key, max_retries=0) as client:
        try:
            client.completions.create(model="m", prompt="hi", max_tokens=4)
            return 200
        except openai.APIStatusError as refused:
            return refused.status_code


def test_a_key_serves_its_tenant_until_it_is_revoked_without_a_restart(tmp_path, emulator):
    keys = tmp_path / "keys.json"
    issued = json.loads(_keys("create", "acme", "--file", str(keys)))
    elsewhere = json.loads(_keys("create", "acme", "--file", str(tmp_path / "other.json")))
    assert issued["key"] not in keys.read_text()
    with guard_process(tmp_path, [emulator], identity={"api_keys_file": str(keys)}) as guard:
        assert _complete(guard, issued["key"]) == 200
        assert _complete(guard, token("acme")) == 200  # a JWT beside the keys
        assert _complete(guard, elsewhere["key"]) == 401
        in_url = urllib.request.Request(
            guard.url + "/v1/completions?api_key=" + issued["key"],
            data=orjson.dumps({"model": "m", "prompt": "hi", "max_tokens": 4}),
            headers={"Content-Type": "application/json"},
        )
        try:
            urllib.request.urlopen(in_url, timeout=10)
            raise AssertionError("a key in the URL was accepted")
        except urllib.error.HTTPError as answer:
            assert answer.code == 400
            assert orjson.loads(answer.read())["error"]["code"] == "credentials_in_url"
        _keys("revoke", issued["id"], "--file", str(keys))
        deadline = time.monotonic() + 5
        while (status := _complete(guard, issued["key"])) == 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert status == 401
        assert _complete(guard, token("acme")) == 200
    listed = json.loads(_keys("list", "--file", str(keys)))
    assert [(k["id"], k["revoked_at"] is not None) for k in listed] == [(issued["id"], True)]
    assert all("sha256" not in k for k in listed)
