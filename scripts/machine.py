"""The CPU the benchmark scripts report their figures on.

python -c "import machine; print(machine.cpu())"   # from scripts/
"""

import os
import platform


def cpu() -> str:
    """The CPU's model name (/proc/cpuinfo), or the architecture where there is none."""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()
