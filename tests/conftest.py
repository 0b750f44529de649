"""Hypothesis runs derandomized by default, so that CI is repeatable: the same examples every run.

Explore with fresh random examples locally: HYPOTHESIS_PROFILE=explore python -m pytest -q
(a failure found that way goes into the test as an explicit @example).
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
