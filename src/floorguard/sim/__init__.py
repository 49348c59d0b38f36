"""The discrete-event simulator: it drives the same guard core the HTTP proxy runs."""

from floorguard.sim.run import SimRun, simulate_once
from floorguard.sim.scenarios import SCENARIOS, Scenario, create_scenario, marquee

__all__ = ["SCENARIOS", "Scenario", "SimRun", "create_scenario", "marquee", "simulate_once"]
