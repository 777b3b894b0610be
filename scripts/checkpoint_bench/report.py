"""The checkpoint benchmark's figures as text: each measurement's fastest and median run, rates, ratios, aligned
tables. Pure functions, no torch.

    python -c "import sys; sys.path.insert(0, 'scripts'); from checkpoint_bench import report; print(report.spread([3, 1, 2]))"
"""

import math
import statistics

MB = 1e6  # rates in MB/s (decimal), as S3's and the issue's figures are


def spread(values) -> tuple[float, float]:
    """(fastest, median) of the runs that have a figure (NaN: none, such as a write whose time is not seen)."""
    seen = [v for v in values if not math.isnan(v)]
    return (min(seen), statistics.median(seen)) if seen else (math.nan, math.nan)


def seconds(values) -> str:
    """'fastest/median' seconds, 3 decimals; '-' where no run has a figure."""
    low, mid = spread(values)
    return "-" if math.isnan(low) else f"{low:.3f}/{mid:.3f}"


def rate(nbytes: int, s: float) -> float:
    """MB/s of `nbytes` moved in `s` seconds."""
    return nbytes / MB / s if s > 0 else math.nan


def ratio(value: float, reference: float) -> str:
    """value/reference to 2 decimals followed by 'x'; '-' where either is missing."""
    if math.isnan(value) or math.isnan(reference) or reference == 0:
        return "-"
    return f"{value / reference:.2f}x"


def table(header: list[str], rows: list[list[str]]) -> str:
    """Rows under a header, columns padded to their widest cell: the first left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: list[str]) -> str:
        cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        return "  ".join(cells).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def summary(figures: dict[str, float]) -> str:
    """The last line, machine-readable: `bench-checkpoint: key=value ...`, 3 significant decimals, NaN as nan."""
    return "bench-checkpoint: " + " ".join(f"{key}={value:.3f}" for key, value in figures.items())


def verdict(name: str, value: float, unit: str, at_most: float | None = None, at_least: float | None = None) -> str:
    """A target's line: `target: NAME VALUE UNIT (at most/least BOUND): PASS` or FAIL (or `-`: not measured)."""
    bound = f"at most {at_most:g}" if at_most is not None else f"at least {at_least:g}"
    if math.isnan(value):
        return f"target: {name} - ({bound}): not measured"
    held = value <= at_most if at_most is not None else value >= at_least
    return f"target: {name} {value:.2f}{unit} ({bound}): {'PASS' if held else 'FAIL'}"
