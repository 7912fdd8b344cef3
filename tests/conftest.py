"""Shared test configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
FIXTURES = SHARED / "conformance" / "ipld-codec-fixtures"


@pytest.fixture(scope="session")
def ipld_fixtures() -> Path:
    if not FIXTURES.is_dir():
        pytest.skip(f"IPLD codec fixtures not found at {FIXTURES}")
    return FIXTURES
