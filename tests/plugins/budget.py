"""The suite's time, held to a budget (a pytest plugin, loaded by tests/conftest.py): each test gets its tier's own
limit (pytest-timeout's marker, unless the test sets its own), the run's wall time and each tier's test time are said
at its end against BUDGET_S, and a run that goes past HARD_S stops there and fails, so that a change which blows the
budget is seen in CI's log well before CI's own limit (90 minutes) ends the run with nothing said.

    .venv/bin/pytest tests/unit      # the last lines: "suite time: ..."
"""

import os
import time

import pytest

# a test's own limit, by tier, so that a hang fails in bounded time: several times its slowest test on CI's 2 cores
# (unit: 7 s, and the first to fork a process starts the preloaded server, 5 s of imports; toolkit: the digits recipe;
# the container tier's first test also builds the image, about 5 minutes without a build cache); slowness is the
# budget's to catch
TIMEOUT_S = {"unit": 60, "toolkit": 300, "cloud": 180, "container": 900}
BUDGET_S = 40 * 60  # the whole suite, every tier, on CI's 2 cores (issue 56)
HARD_S = 60 * 60  # past it the run stops and fails: twice CI's margin to its 90 minutes
TIERS = tuple(TIMEOUT_S)


def tier_of(nodeid: str) -> str | None:
    """The tier of a test by its path (tests/<tier>/...)."""
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" and parts[1] in TIERS else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """Every process that collects (each xdist worker too): a test's limit, its tier's unless it sets its own."""
    for item in items:
        if (tier := tier_of(item.nodeid)) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIMEOUT_S[tier]))


class Budget:
    """The run's clock and each tier's test time, in the process that reports (an xdist run's controller)."""

    def __init__(self):
        self.start = time.monotonic()
        self.seconds = dict.fromkeys(TIERS, 0.0)

    def pytest_runtest_logreport(self, report):
        if tier := tier_of(report.nodeid):
            self.seconds[tier] += report.duration
        if (elapsed := time.monotonic() - self.start) > HARD_S:
            pytest.exit(
                f"the suite ran {elapsed:.0f} s, past its hard limit of {HARD_S} s: it stops here", returncode=1
            )

    def pytest_terminal_summary(self, terminalreporter):
        elapsed = time.monotonic() - self.start
        tiers = ", ".join(f"{tier} {seconds:.0f} s" for tier, seconds in self.seconds.items() if seconds)
        verdict = "within" if elapsed <= BUDGET_S else "OVER"
        terminalreporter.write_line(
            f"suite time: {elapsed:.0f} s, {verdict} the budget of {BUDGET_S} s for every tier on 2 cores "
            f"(test time by tier: {tiers}; {os.cpu_count()} cores here)"
        )


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller of an xdist run, or a plain run: not each worker
        config.pluginmanager.register(Budget(), "suite budget")
