"""The discrete-event simulator: it drives the same guard core the HTTP proxy runs."""

from floorguard.sim.profiles import PROFILES, ServiceProfile, get_profile
from floorguard.sim.run import SimRun, simulate_once
from floorguard.sim.scenarios import SCENARIOS, Scenario, create_scenario, marquee

__all__ = [
    "PROFILES",
    "SCENARIOS",
    "Scenario",
    "ServiceProfile",
    "SimRun",
    "create_scenario",
    "get_profile",
    "marquee",
    "simulate_once",
]
