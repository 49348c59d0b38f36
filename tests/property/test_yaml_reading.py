"""The configuration's fast YAML reader (`yaml_rs`, YAML 1.2) is used only where it reads
what PyYAML's safe loader (YAML 1.1, the reference) reads: over generated documents full of
the forms on which the two disagree, whatever the fast path answers is PyYAML's answer, of
the same types, and it never accepts a document PyYAML refuses."""

from __future__ import annotations

import math
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from floorguard.proxy.config import yamlfile

# scalars written plain on which YAML 1.1 and 1.2 (or the two libraries) may disagree
_TOKENS = (
    "yes", "No", "on", "OFF", "y", "n", "true", "True", "FALSE", "null", "Null", "~", "",
    "0755", "09", "00", "0", "-0", "+12", "0o17", "0x1F", "0b101", "0x_1F", "1_000",
    "1__0", "1.0e3", "1.0e+3", "1e3", ".5", "-.5", "+.5", "1.", "-1.5", ".inf", "-.inf",
    ".NaN", ".nan", "-.nan", "1:30", "12:30:00", "1:30.5", "190:20:30.15", "2026-12-06",
    "2001-12-14t21:59:43.10-05:00", "=", "<<", "t0", "a b", "http://127.0.0.1:9",
    "99999999999999999999", "1.5.5", "0.", "00.5", "+0", "- x", "a:b", "a #c", "'q'",
)  # fmt: skip
_ALPHABET = "0123456789.eE+-_:oxbyYnNtTrufalsFLSE~ a#'\""


def _scalar_text() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(_TOKENS), st.text(_ALPHABET, max_size=8))


@st.composite
def _plain(draw: Any, depth: int = 0) -> str:
    """A YAML fragment: a scalar, plain, quoted or as a block scalar; or a flow collection."""
    text = draw(_scalar_text())
    style = draw(st.sampled_from(("plain", "plain", "single", "double", "block", "flow")))
    if style == "single":
        return "'" + text.replace("'", "''") + "'"
    if style == "double":
        return '"' + text.replace('"', "") + '"'
    if style == "block":
        return draw(st.sampled_from(("|", ">", "|-", ">+"))) + "\n    " + text
    if style == "flow" and depth < 2:
        items = draw(st.lists(_plain(depth + 1), max_size=3))
        if draw(st.booleans()):
            return "[" + ", ".join(items) + "]"
        keys = draw(st.lists(_scalar_text(), max_size=3))
        return "{" + ", ".join(f"{k}: {v}" for k, v in zip(keys, items, strict=False)) + "}"
    return text


@st.composite
def _documents(draw: Any) -> str:
    lines = []
    for _ in range(draw(st.integers(1, 6))):
        key = draw(_scalar_text())
        if draw(st.booleans()):
            lines.append(f"{key}: {draw(_plain())}")
        else:
            items = draw(st.lists(_plain(), min_size=1, max_size=3))
            lines.append(f"{key}:\n" + "".join(f"  - {item}\n" for item in items))
    head = draw(st.sampled_from(("", "---\n", "--- ", "# c\n")))
    return head + "\n".join(lines) + draw(st.sampled_from(("", "\n", "\n...\n", "\n---\nb: 1")))


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (True is not 1; NaN is NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def _pyyaml(text: str) -> tuple[bool, Any]:
    try:
        return True, yaml.load(text, Loader=yamlfile._SAFE_LOADER)
    except yaml.YAMLError:
        return False, None


def _agrees(text: str) -> bool:
    fast = yamlfile._read_fast(text)
    if fast is yamlfile._UNREAD:
        return True
    ok, reference = _pyyaml(text)
    return ok and _same(fast, reference)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_documents())
@example("a: -.5\nb: 0755\nc: 1.0e3")
def test_the_fast_reader_reads_what_pyyaml_reads(text: str) -> None:
    """A generated document: the fast path leaves it to PyYAML or reads PyYAML's data."""
    assert _agrees(text), text


@settings(max_examples=1500, deadline=None)
@given(st.text("ab01:- \n[]{},'\"#|>.?", max_size=40))
def test_the_fast_reader_accepts_nothing_pyyaml_refuses(text: str) -> None:
    """Text of YAML's indicators at random: never read where PyYAML refuses or differs."""
    assert _agrees(text), text


@pytest.mark.parametrize(
    "text",
    ["a: yes", "a: 0755", "a: 1:30", "a: 1.0e3", "a: 0o17", "a: -.5", "a: 2026-12-06",
     "b: &m {x: 1}\nc:\n  <<: *m", "a: !foo 1", "? [1, 2]\n: x", "a: 1\n---\nb: 2",
     "\ufeffa: 1", "a: {b: 1, b: 2}", 'a: ""', "a: _1", "{:0}", "[a:]",
     '{"a":0755}'],
)  # fmt: skip
def test_each_known_disagreement_is_left_to_pyyaml(text: str) -> None:
    """Every form found to read differently (YAML 1.1 against 1.2, or the two libraries)
    is PyYAML's to read, and parse_yaml answers PyYAML's data or error."""
    assert yamlfile._read_fast(text) is yamlfile._UNREAD
    ok, reference = _pyyaml(text)
    if ok:
        assert _same(yamlfile.parse_yaml(text), reference)
    else:
        with pytest.raises(yaml.YAMLError):
            yamlfile.parse_yaml(text)


def test_a_large_plain_configuration_takes_the_fast_path() -> None:
    """What a tool writes for many tenants (`yaml.dump`'s block style) is read fast, to
    PyYAML's data."""
    data = {"window_s": 10.0, "backends": [{"url": "http://127.0.0.1:9", "slots": 4}],
            "contracts": [{"tenant": f"t{i}", "class": "assured", "floor": 1,
                           "deadline_ms": 5000} for i in range(200)]}  # fmt: skip
    text = yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper))
    fast = yamlfile._read_fast(text)
    assert fast is not yamlfile._UNREAD and fast == data and _same(fast, _pyyaml(text)[1])
