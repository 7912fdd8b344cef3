"""Hypothesis settings of the fuzz tests: a few seconds in the suite, as long as you like by
hand.

``PULSARCAST_FUZZ_EXAMPLES`` sets the examples per test (default 300); for a long run::

    PULSARCAST_FUZZ_EXAMPLES=50000 pytest tests/fuzz -q

(see "Fuzzing" in ``docs/operations.md``). Hypothesis keeps the failing examples it finds in
``.hypothesis/`` and replays them first next time.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

EXAMPLES = int(os.environ.get("PULSARCAST_FUZZ_EXAMPLES", "300"))

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # a shared 2-core machine makes per-example timings meaningless
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.function_scoped_fixture],
)
"""Decorate every fuzz test with this."""
