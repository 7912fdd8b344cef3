"""The vector files are exactly what the generator writes from the code as it is now: a
change of the wire format shows up here (regenerate with ``python -m
tests.conformance.generate`` once the change is meant, and review the diff)."""

from __future__ import annotations

import pytest

from .generate import FILES, HERE, build_all


def test_the_generator_is_deterministic() -> None:
    assert build_all() == build_all()


@pytest.mark.parametrize("name", FILES)
def test_the_files_are_up_to_date(name: str) -> None:
    assert build_all()[name] == (HERE / name).read_text(), (
        f"{name} differs from what tests/conformance/generate.py writes")


def test_the_files_stay_small() -> None:
    assert sum((HERE / name).stat().st_size for name in FILES) < 80_000
