from __future__ import annotations

import pytest

from tests.helpers import DATA_DIR


@pytest.fixture
def azure_dir():
    """The real Azure traces in ../shared/data; tests that need them skip without them."""
    if not (DATA_DIR / "AzureLLMInferenceTrace_code.csv").is_file():
        pytest.skip(f"real traces not found at {DATA_DIR} (the shared/ folder beside the repo)")
    return DATA_DIR
