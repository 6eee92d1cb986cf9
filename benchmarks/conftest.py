"""Hooks of the benchmarks: a comparison with no history fails instead of warning.

See ``ratio_timing.require_history``.
"""

from __future__ import annotations

import pytest
from ratio_timing import require_history


def pytest_configure(config: pytest.Config) -> None:
    require_history(config)
