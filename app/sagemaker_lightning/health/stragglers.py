"""Stragglers: the host every other host waits for, from the arrival times of the collectives each rank recorded
(torch's flight recorder, published in the watchdog's heartbeats: judge.py), for the progress line
(`hosts: slowest algo-2 1.02x the median`: lines.spread) and a warning when one host is much slower than the others.

Data-parallel ranks all take the same time per step: each waits for the last in every collective. So the step time
cannot tell the straggler; the arrival times can. A rank's lateness at a collective is how long after the first rank
it entered it; summed over a window of collectives, the straggler's is the time the others spent waiting for it. Over
a window of `span` seconds, the median host worked span − (its wait) and the slowest span: the ratio reported is the
slowest host's time per step to the median host's own. Hosts' clocks agree to milliseconds (NTP on SageMaker).

    python -c "from sagemaker_lightning.health import stragglers as s; print(s.spread({0: 0.0, 1: 1.0}, 1.5, {0: 'a', 1: 'b'}))"
"""

import statistics
from collections.abc import Mapping

SLOW = 1.25  # a host whose steps take this many times the median host's own time is named in a warning (its
# peers then wait a fifth of each step for it)
WARN_EVERY_S = 300.0  # at most one warning for a host in so many seconds
ARRIVALS = 64  # collectives of each rank's latest in each heartbeat
FEWEST = 16  # collectives every rank recorded, at least, for a spread: a step or two of DDP's is noise


def arrivals(entries: list[dict], since_ns: int) -> dict[str, int]:
    """`pg:seq` → when this rank entered that collective (ns), for its latest ARRIVALS collectives from `since_ns` on
    (0: none yet)."""
    collectives = [e for e in entries if not e.get("is_p2p") and since_ns and e["time_created_ns"] >= since_ns]
    collectives = collectives[-ARRIVALS:]
    return {f"{e['process_group'][0]}:{e['collective_seq_id']}": e["time_created_ns"] for e in collectives}


def lateness(arrived: Mapping[int, Mapping[str, int]]) -> tuple[dict[int, float], float]:
    """Each rank's seconds behind the first, summed over the collectives every rank recorded; and the seconds those
    collectives span."""
    common = set.intersection(*(set(a) for a in arrived.values())) if arrived else set()
    if len(common) < FEWEST:
        return {}, 0.0
    late = dict.fromkeys(arrived, 0.0)
    for key in common:
        first = min(a[key] for a in arrived.values())
        for rank, a in arrived.items():
            late[rank] += (a[key] - first) / 1e9
    first_rank = [arrived[min(arrived)][key] for key in common]
    return late, (max(first_rank) - min(first_rank)) / 1e9


def spread(late: Mapping[int, float], span: float, hosts: Mapping[int, str]) -> tuple[str, float] | None:
    """(the slowest host, its time per step / the median host's own), with two hosts or more."""
    per_host: dict[str, float] = {}
    for rank, seconds in late.items():
        per_host[hosts[rank]] = max(per_host.get(hosts[rank], 0.0), seconds)  # a host: its slowest rank
    if len(per_host) < 2 or span <= 0:
        return None
    slowest = max(per_host, key=per_host.get)
    waited = per_host[slowest] - statistics.median(per_host.values())  # the median host's wait for it
    return slowest, 1 / max(1 - waited / span, 1e-3)


def warning(found: tuple[str, float] | None) -> str | None:
    """The warning for a host at least SLOW times the median, or None."""
    if not found or found[1] < SLOW:
        return None
    return (
        f"warning: host {found[0]} is a straggler: its steps take {found[1]:.1f}x the median host's own time, and "
        "every host waits for it at each collective; look at its data loading, its GPUs (nvidia-smi: clocks, "
        "temperature) or its other processes"
    )
