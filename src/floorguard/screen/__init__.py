"""The static timing screen (SPEC §9) and its evaluation."""

from floorguard.screen.model import (
    AGGREGATIONS,
    AdmissionPolicy,
    ScreenConfig,
    ScreenVerdict,
    aggregate,
    screen,
    service_only,
)

__all__ = [
    "AGGREGATIONS",
    "AdmissionPolicy",
    "ScreenConfig",
    "ScreenVerdict",
    "aggregate",
    "screen",
    "service_only",
]
