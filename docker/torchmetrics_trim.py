"""Take scipy.signal out of `import torchmetrics` in the image: a second of every job's start-up, in every process.

torchmetrics 1.9.0 imports scipy.signal whenever scipy is installed (the toolkit, sagemaker-training, requires it;
AWS's DLCs have it), only to add `scipy.signal.hamming` back for SRMRpy, which torchmetrics itself never imports
(Lightning-AI/torchmetrics#3457, open). Lightning imports torchmetrics to read its version, so every process that
imports Lightning paid it (about a second of a job's imports on 2 Xeon cores: docs/performance.md). This step turns
the shim's condition off in the three modules that hold it; nothing else in torchmetrics changes, and scipy stays.
Idempotent (the dlc flavors' app stage runs again over an image that has it). A torchmetrics without the shim fails
the build here in one line: the step is then deleted.

    RUN python3 /tmp/torchmetrics_trim.py   # in the image's environment, after torchmetrics is installed (Dockerfile)
"""

import compileall
import importlib.util
import os
import sys

SHIMS = {  # module → the line that guards its import of scipy.signal, as torchmetrics 1.9.0 writes it
    "__init__.py": 'if package_available("scipy"):\n',
    "audio/__init__.py": "if _SCIPI_AVAILABLE:\n",
    "functional/audio/__init__.py": "if _SCIPI_AVAILABLE:\n",
}
OFF = "if False:  # scipy.signal's shim for SRMRpy, off in this image (docker/torchmetrics_trim.py)\n"


def main() -> int:
    spec = importlib.util.find_spec("torchmetrics")  # found, not imported
    if spec is None:
        print("error: torchmetrics is not installed: run docker/torchmetrics_trim.py after the step that installs it",
              file=sys.stderr)  # fmt: skip
        return 1
    root = spec.submodule_search_locations[0]
    for name, guard in SHIMS.items():
        path = os.path.join(root, name)
        with open(path) as f:
            lines = f.readlines()
        if OFF in lines:
            continue
        if lines.count(guard) != 1:
            print(f"error: {path} has no scipy.signal shim guarded by {guard.strip()!r}: delete the step that runs "
                  "docker/torchmetrics_trim.py", file=sys.stderr)  # fmt: skip
            return 1
        lines[lines.index(guard)] = OFF
        with open(path, "w") as f:
            f.writelines(lines)
        compileall.compile_file(path, quiet=1)  # jobs write no bytecode (PYTHONDONTWRITEBYTECODE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
