"""The experiment catalogue: docs/design.md §10's E1–E16 and E19 (the screen's E17, E18, E20 for
docs/design.md §15's fair surplus, E21, E22 for docs/design.md §16's memory and E23 for §19's
first tokens) as
declarative grids, one module per experiment or close group — each with its grid,
caption and reading.

Where the published setup (docs/design.md §11) leaves a parameter open, the choice is made here
and stated in the caption.
Readings are generated from the measured numbers, never written in advance.
"""

from __future__ import annotations

from floorguard.experiments.catalogue._common import data_dir
from floorguard.experiments.catalogue.e1_e2 import E1, E2
from floorguard.experiments.catalogue.e3_e4 import E3, E4
from floorguard.experiments.catalogue.e5_e6 import E5, E6
from floorguard.experiments.catalogue.e7_e9 import E7, E8, E9
from floorguard.experiments.catalogue.e10 import E10
from floorguard.experiments.catalogue.e11 import E11
from floorguard.experiments.catalogue.e12 import _e12
from floorguard.experiments.catalogue.e13_e14 import E13, E14
from floorguard.experiments.catalogue.e15 import E15
from floorguard.experiments.catalogue.e16 import E16
from floorguard.experiments.catalogue.e17_e18 import E17, E18
from floorguard.experiments.catalogue.e19 import E19
from floorguard.experiments.catalogue.e20 import E20
from floorguard.experiments.catalogue.e21 import E21
from floorguard.experiments.catalogue.e22 import E22
from floorguard.experiments.catalogue.e23 import E23
from floorguard.experiments.spec import Experiment

__all__ = ["catalogue", "data_dir"]


def catalogue(burstgpt: str | None = None) -> dict[str, Experiment]:
    experiments = [
        E1,
        E2,
        E3,
        E4,
        E5,
        E6,
        E7,
        E8,
        E9,
        E10,
        E11,
        _e12(burstgpt),
        E13,
        E14,
        E15,
        E16,
        E17,
        E18,
        E19,
        E20,
        E21,
        E22,
        E23,
    ]
    return {e.id: e for e in experiments}
