"""A wheel made in a test: a package a project ships in its own source directory, or one a warm pool keeps."""

import base64
import hashlib
import os
import zipfile


def write_wheel(directory: str, name: str, version: str, source: str) -> str:
    """A pure-Python wheel holding one module, `name`.py: a package a project ships in its own source directory."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": source.encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: sagemaker-lightning-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    digest = {k: base64.urlsafe_b64encode(hashlib.sha256(v).digest()).rstrip(b"=").decode() for k, v in files.items()}
    record = "".join(f"{k},sha256={digest[k]},{len(v)}\n" for k, v in files.items()) + f"{info}/RECORD,,\n"
    path = os.path.join(directory, f"{name}-{version}-py3-none-any.whl")
    os.makedirs(directory, exist_ok=True)
    with zipfile.ZipFile(path, "w") as wheel:
        for k, v in {**files, f"{info}/RECORD": record.encode()}.items():
            wheel.writestr(k, v)
    return path
