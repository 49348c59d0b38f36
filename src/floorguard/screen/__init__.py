"""The static timing screens (docs/design.md §9) and their evaluation."""

from floorguard.screen.model import (
    AGGREGATIONS,
    DEFAULT_MODEL,
    AdmissionPolicy,
    ScreenConfig,
    ScreenModel,
    ScreenVerdict,
    aggregate,
    screen,
    service_only,
)

__all__ = [
    "AGGREGATIONS",
    "DEFAULT_MODEL",
    "AdmissionPolicy",
    "ScreenConfig",
    "ScreenModel",
    "ScreenVerdict",
    "aggregate",
    "screen",
    "service_only",
]
