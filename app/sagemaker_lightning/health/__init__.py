"""Whether the job can work, and a hang named when it does not.

preflight.py          checks before the first step: devices, EFA, all-reduce busbw
preflight_verdict.py  the checks' verdict and lines, pure
efa.py                EFA on this host: devices, the aws-ofi-nccl plugin, variables that keep NCCL off EFA
watchdog.py           a collective past training_timeout ends the job in one line naming the ranks: the callback
judge.py              the watchdog's thread: heartbeats, the judgement, the line every rank ends with
heartbeats.py         what a heartbeat says, the line made of them, and the values read from the job's store
signing.py            the watchdog's values signed with a key agreed over the process group, and capped
store_link.py         the watchdog's connection to the job's store: each call given up after its wait
stragglers.py         the host every other host waits for
"""
