"""docs/config.md is the configuration models, key for key."""

from __future__ import annotations

from pathlib import Path

import pytest

from floorguard.proxy.config.doc import config_reference

PAGE = Path(__file__).parents[2] / "docs" / "config.md"


def test_the_page_lists_every_key_as_the_models_say():
    """The committed page equals what the models generate: a key added, renamed or
    re-documented without `python scripts/config_reference.py` fails here."""
    assert PAGE.read_text(encoding="utf-8") == config_reference()


def test_every_key_has_a_meaning():
    """No row of the reference is left without a sentence saying what the key does."""
    rows = [line for line in config_reference().splitlines() if line.startswith("| `")]
    assert len(rows) > 100
    undocumented = [row.split("`")[1] for row in rows if row.rstrip().endswith("|  |")]
    assert undocumented == []


def test_the_new_edge_keys_are_listed():
    """The edge's metering keys are on the page with their defaults."""
    page = config_reference()
    for key in ("client_write_timeout_s", "max_connections", "limits.max_buffered_reply_bytes",
                "limits.max_held_reply_bytes", "limits.max_constraint_bytes"):  # fmt: skip
        assert f"| `{key}` |" in page


def test_a_json_configuration_reads_as_its_yaml_would():
    """A configuration written as JSON (YAML's subset: what a tool writing 100,000 tenants
    writes) is read by `json`, without YAML's node graph, to the same data; a YAML flow
    mapping that is not JSON is still YAML; a JSON error is YAML's to report."""
    import json  # noqa: PLC0415  # only this test

    import yaml  # noqa: PLC0415

    from floorguard.proxy.config.yamlfile import parse_yaml  # noqa: PLC0415

    data = {"window_s": 1.5, "contracts": [{"tenant": "t0", "class": "assured", "floor": 2}],
            "store": None, "strict": True}  # fmt: skip
    text = json.dumps(data)
    assert parse_yaml(text) == yaml.safe_load(text) == data
    assert parse_yaml("{window_s: 1.5, strict: yes}") == {"window_s": 1.5, "strict": True}
    with pytest.raises(yaml.YAMLError):
        parse_yaml('{"window_s": [1.5}')


def test_a_large_yaml_configuration_is_parsed_apart_to_the_same_data():
    """A YAML document over the size limit that the fast reader leaves to PyYAML (its date
    does) is parsed in a child process (its parse's peak is the child's) to what this
    process's loader gives: a date and a non-string key come back as such, equal strings
    as one object, and a YAML error is still a YAMLError naming where."""
    import yaml  # noqa: PLC0415

    from floorguard.proxy.config import yamlfile  # noqa: PLC0415

    text = "window_s: 1.5\nsince: 2026-12-06\n7: seven\ncontracts:\n" + "".join(
        f"  - {{tenant: t{i}, class: assured, floor: 2}}\n" for i in range(50)
    )
    asked: list[str] = []
    real = yamlfile._parse_apart

    def watched(what: str):
        asked.append(what)
        return real(what)

    yamlfile._parse_apart = watched
    try:
        apart = yamlfile.parse_yaml(text, apart_over_bytes=100)
        assert apart == yaml.safe_load(text) and asked == [text]  # it went to the child
        first, second = (list(c)[1] for c in apart["contracts"][:2])
        assert first == second == "class" and first is second
        assert yamlfile.parse_yaml(text) == yaml.safe_load(text) and asked == [text]  # small
        with pytest.raises(yaml.YAMLError, match="line 2"):
            yamlfile.parse_yaml("a: 1\nb: [1\n" + "# pad\n" * 40, apart_over_bytes=100)
    finally:
        yamlfile._parse_apart = real
