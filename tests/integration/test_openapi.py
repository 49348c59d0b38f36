"""docs/openapi.yaml against the running guard, with schemathesis: generated requests —
valid and deliberately invalid bodies, on every documented path — never get a 5xx, and
every response matches its documented status codes and content types."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, status_code_conformance

from tests.integration.live import guard_config, token

STATUSES: Counter[tuple[str, int]] = Counter()
SCHEMA = schemathesis.openapi.from_path(Path(__file__).parents[2] / "docs" / "openapi.yaml")


@pytest.fixture(scope="module")
def guard_url(live):
    config = guard_config(live.emulator(slots=8), floor=10_000, slots=8)
    limits = config.limits.model_copy(update={"max_tokens": 8})  # short emulated requests
    config = config.model_copy(update={"limits": limits})
    return live.guard(config)[0]


@SCHEMA.parametrize()
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_no_input_makes_the_guard_answer_5xx(case, guard_url):
    response = case.call_and_validate(
        base_url=guard_url,
        headers={"Authorization": f"Bearer {token('acme')}"},
        checks=[not_a_server_error, status_code_conformance, content_type_conformance],
    )
    STATUSES[case.path, response.status_code] += 1


def test_the_generated_requests_reached_both_service_and_refusal():
    """Runs after the schemathesis test: it sent valid and invalid bodies alike."""
    for endpoint in ("/v1/completions", "/v1/embeddings"):
        statuses = {status for (path, status) in STATUSES if path == endpoint}
        assert 200 in statuses and statuses & {400, 413}, STATUSES
