"""The warm pool's cache: the folder a warm pool's instance keeps from one job to the next (paths.warm_pool_cache;
SageMaker mounts it in every job that asks for a warm pool: scripts/run_sagemaker.py --keep-alive). PID 1 points the
job's caches into it, so that the next job on the instance finds what this one fetched, built and compiled:
  - pip's and uv's caches (PIP_CACHE_DIR, UV_CACHE_DIR), for whatever the job installs;
  - the job's requirements.txt, installed by PID 1 before the toolkit (which then finds it installed): the first job
    with a requirements.txt keeps the wheels it installed under wheels/<key>; a later one installs them from there
    without asking any package index, so it needs no network. The key (sources) covers the file and every file it
    pulls in with -r/-c, recursively, each found as pip finds it (relative to the file naming it; one named by URL
    by its URL only), with ${VARIABLES} expanded as pip expands them; the index settings pip reads from the
    environment (INDEX_VARIABLES) and its configuration files (CONFIG_FILES, PIP_CONFIG_FILE's); the Python and what
    the image has installed. A change to any of them fills a folder of its own;
  - torch.compile's caches: Inductor's (TORCHINDUCTOR_CACHE_DIR) and Triton's (TRITON_CACHE_DIR);
  - a streaming data set's chunks (LITDATA_CACHE_DIR, which the launch plan passes on to litdata).
Where the folder is missing (a job without a warm pool) or cannot be written, one line says so and the job goes on
with caches of its own, as before. Variables the job sets itself win. No torch: PID 1 runs this.

The folder is shared by every job that runs on the warm pool's instance, and what it holds runs: pip's and uv's
caches, the kept wheels, Inductor's and Triton's kernels. So jobs sharing a warm pool share code: any of them can
change what a later one installs or runs (README, Security). The key is no secret (it is computed from the files).
What this module checks: a requirements file that pins hashes (--hash=sha256:..., pip's hash-checking mode) is
installed offline from the job's own files, so pip checks every kept wheel against the file's hashes and refuses
another (the job then installs from the index, as the first did, into an emptied folder); and such a file's wheels
are kept only where each is the very file whose hash pip recorded when it installed it (its --report), so a wheel
built from a pinned source archive, which could never match, is not kept. A file without hashes trusts the folder.

    SAGEMAKER_BASE_DIR=/tmp/ml python -c "from sagemaker_lightning.boot import warmpool; print(warmpool.variables('/c'))"
"""

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import urllib.parse

from sagemaker_lightning.launch import hyperparameters, paths

CACHES = {  # the variable that points a cache somewhere → its folder in the warm-pool cache
    "PIP_CACHE_DIR": "pip",  # pip's downloads and the wheels it built (the toolkit's, SDK 3.x's, the job's own)
    "UV_CACHE_DIR": "uv",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",  # torch.compile: Inductor's kernels and graphs (its default: /tmp)
    "TRITON_CACHE_DIR": "triton",  # GPU kernels Triton compiled (its default: ~/.triton)
    "LITDATA_CACHE_DIR": "streaming",  # a streaming data set's chunks (streaming.py; else paths.streaming_cache_dir)
}
WHEELS = "wheels"  # requirements.txt's wheels, a folder per key
COMPLETE = ".complete"  # in a key's folder once every wheel the install needed is there
INDEX_VARIABLES = (  # where pip looks for packages, set in the environment (pip's PIP_<OPTION>)
    "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_TRUSTED_HOST", "PIP_NO_INDEX", "PIP_CONFIG_FILE",
)  # fmt: skip
CONFIG_FILES = (  # pip's configuration files on Linux: global, user, site (besides PIP_CONFIG_FILE's)
    "/etc/xdg/pip/pip.conf", "/etc/pip.conf", "~/.pip/pip.conf", "~/.config/pip/pip.conf", f"{sys.prefix}/pip.conf",
)  # fmt: skip
INCLUDE = re.compile(r"^(?:-r|--requirement|-c|--constraint)(?:=|\s+|(?<=^-r)|(?<=^-c))(\S+)")  # -r FILE, -cFILE, ...
SCHEME = re.compile(r"^\w+(\+\w+)?://")  # a URL, as pip's SCHEME_RE
HASH = re.compile(r"--hash[=\s]")  # a pinned hash: pip's hash-checking mode


def variables(cache: str) -> dict[str, str]:
    return {name: os.path.join(cache, folder) for name, folder in CACHES.items()}


def unusable(cache: str) -> str | None:
    """Why `cache` cannot hold the caches, or None once its folders exist."""
    if not os.path.isdir(cache):
        return "is missing (SageMaker mounts it in jobs that ask for a warm pool: run_sagemaker.py --keep-alive)"
    try:
        for folder in (*CACHES.values(), WHEELS):
            os.makedirs(os.path.join(cache, folder), exist_ok=True)
        with tempfile.TemporaryFile(dir=cache):
            pass
    except OSError as e:
        return f"cannot be written ({e.strerror or e})"
    return None


def apply(env: dict) -> tuple[str | None, str]:
    """Points the caches of `env` (the environment the toolkit gets) into the warm-pool cache, unless it cannot hold
    them; returns the cache (None then) and the line to print."""
    cache = paths.warm_pool_cache(env)
    if why := unusable(cache):
        return None, f"warm-pool cache {cache} {why}: this job's caches start empty and end with it"
    for name, folder in variables(cache).items():
        env.setdefault(name, folder)
    return cache, (
        f"warm-pool cache {cache}: pip's, uv's, torch.compile's and streaming data's caches are kept there for the "
        "next job on this instance"
    )


def prepare(env: dict, given: dict, code_dir: str, say) -> None:
    """PID 1's part in a job: the caches (apply), then, where the job's own Python program comes with a
    requirements.txt, its install (install_requirements). Code the toolkit would fetch from S3 (SDK 2.x's source_dir)
    is fetched first, with the toolkit's own function, which the toolkit then finds done."""
    cache, line = apply(env)
    say(line)
    program = hyperparameters.typed(given.get("sagemaker_program", env.get("SAGEMAKER_PROGRAM", "")))
    if cache is None or not str(program).endswith(".py"):  # a shell command gets no requirements.txt installed
        return
    source = hyperparameters.typed(given.get("sagemaker_submit_directory", env.get("SAGEMAKER_SUBMIT_DIRECTORY", "")))
    if str(source).startswith("s3://") and not os.listdir(code_dir):
        try:
            from sagemaker_training import files  # boto3: only here

            files.download_and_extract(source, code_dir)
        except Exception as e:  # the toolkit fetches it again, and names what fails
            say(f"fetching the job's code from {source} failed ({type(e).__name__}: {e}); the toolkit tries again")
            return
    if os.path.exists(os.path.join(code_dir, "setup.py")):  # a package: the toolkit installs it with pip itself
        return
    if env.get("CA_REPOSITORY_ARN"):  # the toolkit logs in to CodeArtifact; an install here would ask PyPI instead
        say("requirements.txt is left to the toolkit, which installs it from CodeArtifact (CA_REPOSITORY_ARN)")
        return
    if line := install_requirements(code_dir, cache, env):
        say(line)


def lines(text: str, env) -> list[str]:
    """A requirements file's lines as pip reads them: continuations joined, comments dropped, ${NAME} expanded."""
    joined = re.sub(r"\\\n", "", text)
    found = []
    for line in joined.splitlines():
        line = re.sub(r"(^|\s+)#.*$", "", line).strip()
        found.append(re.sub(r"\$\{([A-Z0-9_]+)\}", lambda m: env.get(m[1], m[0]), line))
    return [line for line in found if line]


def sources(path: str, env) -> bytes:
    """What a requirements file installs depends on, besides the Python and the image: the file and those it pulls
    in with -r/-c, recursively (relative to the file naming it, as pip resolves them; one named by URL by its URL),
    the index settings of the environment and pip's configuration files. As bytes, for requirements_key."""
    parts, seen, todo = [], set(), [path]
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        try:
            with open(name, "rb") as f:
                text = f.read().decode(errors="replace")
        except OSError as e:  # pip names it when it installs; the key just differs
            text = f"<unreadable: {e.strerror}>"
        parts.append(f"{os.path.relpath(name, os.path.dirname(path))}\0{text}")
        for line in lines(text, env):
            if (match := INCLUDE.match(line)) and not SCHEME.match(match[1]):
                todo.append(os.path.abspath(os.path.join(os.path.dirname(name), match[1])))
    parts += [f"{name}={env[name]}" for name in INDEX_VARIABLES if name in env]
    for name in (*CONFIG_FILES, env.get("PIP_CONFIG_FILE")):
        if name and os.path.isfile(where := os.path.expanduser(name)):
            with open(where, "rb") as f:
                parts.append(f"{name}\0{f.read().decode(errors='replace')}")
    return "\0\0".join(parts).encode()


def requirements_key(requirements: bytes, installed: list[str]) -> str:
    """What a requirements.txt installs here depends on its sources, the Python and what is installed already."""
    digest = hashlib.sha256(requirements)
    digest.update(f"\0{sys.version}\0{platform.machine()}\0".encode())
    digest.update("\n".join(sorted(installed)).encode())
    return digest.hexdigest()[:16]


def unmatched(items: list[dict], wheels: str) -> list[str]:
    """The archives pip installed (its report's download_info) whose kept wheel is not the file whose hash pip
    recorded: a wheel built from a source archive, or another file than pip checked."""
    missing = []
    for item in items:
        recorded = item.get("archive_info", {}).get("hashes", {}).get("sha256")
        name = os.path.basename(urllib.parse.urlsplit(item["url"]).path)
        kept = hashlib.sha256()
        try:
            with open(os.path.join(wheels, name), "rb") as f:
                while chunk := f.read(2**20):  # a wheel may be GiBs
                    kept.update(chunk)
        except OSError:
            missing.append(name)
            continue
        if recorded is None or kept.hexdigest() != recorded:
            missing.append(name)
    return missing


def installed() -> list[str]:
    """The distributions installed where pip installs: their .dist-info folders, whose names carry the versions."""
    site = sysconfig.get_paths()["purelib"]
    return [name for name in os.listdir(site) if name.endswith(".dist-info")]


def install_requirements(code_dir: str, cache: str, env: dict, python: str = sys.executable, run=subprocess.run):
    """PID 1's install of the job's requirements.txt in `code_dir` (module docstring); the line to print, or None
    where there is no requirements.txt. A failure is pip's own output and a line: the toolkit's install, after this,
    tries again and names it as the job's failure."""
    path = os.path.join(code_dir, "requirements.txt")
    if not os.path.isfile(path):
        return None
    known = sources(path, env)
    pinned = any(HASH.search(line) for line in lines(known.decode(errors="replace"), env))
    wheels = os.path.join(cache, WHEELS, requirements_key(known, installed()))
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    if os.path.exists(os.path.join(wheels, COMPLETE)):
        offline = [*pip, "install", "--no-index", "--find-links", wheels, "-r", "requirements.txt"]
        if run(offline, cwd=code_dir, env=env).returncode == 0:
            return f"requirements.txt installed from the warm-pool cache ({wheels}), no package index asked"
        shutil.rmtree(wheels, ignore_errors=True)  # wheels pip refused (a hash, a missing one): filled anew below
    with tempfile.TemporaryDirectory() as tmp:  # as the first job did: from the index, its wheels kept
        report = os.path.join(tmp, "report.json")
        if run([*pip, "install", "--report", report, "-r", "requirements.txt"], cwd=code_dir, env=env).returncode:
            return "installing requirements.txt failed (above); the toolkit tries once more"
        with open(report) as f:
            items = [item["download_info"] for item in json.load(f).get("install", [])]
    if any("dir_info" in item for item in items):  # `-e .`, a path: built anew from the job's code each time
        return "requirements.txt installed; it names a local directory, so the next job asks the index again"
    urls = [item["url"] for item in items]
    os.makedirs(wheels, exist_ok=True)
    if (
        urls
        and run([*pip, "wheel", "--quiet", "--no-deps", "--wheel-dir", wheels, *urls], cwd=code_dir, env=env).returncode
    ):
        return "requirements.txt installed; keeping its wheels failed (above), so the next job asks the index again"
    if pinned and (other := unmatched(items, wheels)):
        return (
            f"requirements.txt installed; it pins hashes, and {', '.join(other)} kept would not be the file pip checked "
            "(a wheel built from a source archive), so the next job asks the index again"
        )
    open(os.path.join(wheels, COMPLETE), "w").close()
    return f"requirements.txt installed, its {len(urls)} wheels kept in the warm-pool cache for the next job"
