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


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """One local Spark session for the whole test run: starting the JVM takes ~10 s, so the
    Spark data source tests and the testbed report tests share it."""
    import os
    import sys

    # Spark's Python workers must run the interpreter (and so the packages) of this venv.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("pulsarcast-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
