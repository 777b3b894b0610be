"""Where a test run's time went: per tier and per file, from the JUnit XML pytest writes (`--junitxml`), against an
earlier run's when given, with the machine it ran on. CI writes one at every run (.ci/run) and prints this table.

    .venv/bin/pytest --junitxml=run.xml ...; .venv/bin/python scripts/suite_time.py run.xml [before.xml] [--files 25]
"""

import argparse
import collections
import os
import sys
import xml.etree.ElementTree as ET

import machine

TIERS = ("unit", "toolkit", "cloud", "container")  # tests/<tier>/, as tests/conftest.py has them


def durations(path: str) -> dict[str, float]:
    """Seconds of each test file (setup, call and teardown of its tests: pytest's testcase time), by its path."""
    files = collections.Counter()
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        name = "/".join(module[: next((i for i, p in enumerate(module) if p.startswith("test_")), len(module)) + 1])
        files[f"{name}.py"] += float(case.get("time") or 0)
    return dict(files)


def tier(file: str) -> str:
    parts = file.split("/")
    return parts[1] if len(parts) > 1 and parts[1] in TIERS else "?"


def table(now: dict[str, float], before: dict[str, float] | None, files: int) -> list[str]:
    """Rows: each tier's seconds (and before, and the change), then the `files` files that took longest."""
    by_tier = collections.Counter({t: 0.0 for t in TIERS})
    then_tier = collections.Counter({t: 0.0 for t in TIERS})
    for name, seconds in now.items():
        by_tier[tier(name)] += seconds
    for name, seconds in (before or {}).items():
        then_tier[tier(name)] += seconds

    def row(label: str, seconds: float, then: float | None) -> str:
        change = "" if then is None else f"{then:9.0f} {seconds - then:+8.0f}"
        return f"{label:<62} {seconds:8.0f} {change}"

    head = f"{'':<62} {'seconds':>8}" + ("" if before is None else f" {'before':>9} {'change':>8}")
    rows = [head]
    rows += [row(f"tier {t}", by_tier[t], then_tier[t] if before else None) for t in TIERS]
    rows.append(row("all tests", sum(now.values()), sum(before.values()) if before else None))
    rows.append("")
    for name in sorted(now, key=now.get, reverse=True)[:files]:
        rows.append(row(name, now[name], (before or {}).get(name, 0.0) if before is not None else None))
    if before:
        gone = sorted(set(before) - set(now), key=before.get, reverse=True)[:5]
        rows += [row(f"{name} (gone)", 0.0, before[name]) for name in gone]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", help="pytest's --junitxml of the run")
    parser.add_argument("before", nargs="?", help="an earlier run's, to compare with")
    parser.add_argument("--files", type=int, default=25, help="the slowest files to list")
    args = parser.parse_args()
    now = durations(args.junit)
    before = durations(args.before) if args.before else None
    tests = sum(1 for _ in ET.parse(args.junit).getroot().iter("testcase"))
    print(f"test time by tier and file ({tests} tests; {machine.cpu()}, {os.cpu_count()} cores)")
    print("\n".join(table(now, before, args.files)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
