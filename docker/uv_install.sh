#!/bin/sh
# `uv pip install ARGS` into the image's python3 (the pypi flavor's venv, a DLC's own Python): a RUN step's installer,
# mounted for that step, so that neither uv nor a CA bundle lands in a layer. uv downloads and unpacks in parallel
# where pip does one wheel at a time: with pip, `make demo`'s cold build took 140 s of its 226 s, 63 s of it torch's
# 3 GB of wheels unpacked on one core (2 Xeon cores; docs/performance.md).
#   RUN --mount=type=bind,source=docker/uv_install.sh,target=/tmp/uv_install.sh --mount=type=secret,id=pip_ca \
#       --mount=type=cache,target=/root/.cache  sh /tmp/uv_install.sh --group /tmp/pyproject.toml:torch
set -eu
UV=uv==0.13.9  # the installer's pin; pip itself is pinned in ARGS (the toolkit installs a job's requirements.txt with it)
ca=/run/secrets/pip_ca  # a CA bundle for a TLS-inspecting proxy (Makefile: PIP_CA_BUNDLE), pip's and uv's
if [ -s "$ca" ]; then export PIP_CERT="$ca" SSL_CERT_FILE="$ca"; fi
tmp=$(mktemp -d)  # uv and what it leaves in TMPDIR (its build locks), removed after
python3 -m pip install --quiet --target "$tmp/uv" "$UV"
# bytecode compiled at install, as pip does (imports at start-up read it; jobs write none: PYTHONDONTWRITEBYTECODE);
# copies, not links, out of the cache mount (another filesystem). uv installs into a venv's python3 (the pypi flavor's)
# only without --system and into any other (a DLC's conda) only with it
system=$(python3 -c 'import sys; print("" if sys.prefix != sys.base_prefix else "--system")')
TMPDIR="$tmp" UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy "$tmp/uv/bin/uv" pip install --python python3 $system "$@"
rm -r "$tmp"
