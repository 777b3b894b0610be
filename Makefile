# sagemaker-lightning: `make help` lists the targets. Every variable below can be set on the command line.
FLAVOR ?= dlc
IMAGE ?= sagemaker-lightning
TAG ?= latest
# Base image of each flavor, tags pinned (BASE_IMAGE=... overrides the flavor's)
BASE_dlc := public.ecr.aws/deep-learning-containers/pytorch:2.13.0-cu133-amzn2023-sagemaker
BASE_dlc-smddp := 763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5.1-gpu-py311-cu124-ubuntu22.04-sagemaker
BASE_conda := ubuntu:22.04
BASE_pypi := python:3.11-slim-bookworm
BASE_IMAGE ?= $(BASE_$(FLAVOR))
# make push: to ECR of the AWS configuration, or to this registry (host:port) when set
REGISTRY ?=
# The pypi base made from Debian packages, for machines that reach no container registry
DEBIAN_BASE ?= sagemaker-lightning-base:bookworm
DEBIAN_MIRROR ?= http://deb.debian.org/debian
# A CA bundle for pip inside the build (TLS-inspecting proxies); pip's own PIP_CERT by default
PIP_CA_BUNDLE ?= $(PIP_CERT)
# More `docker build` options, e.g. the conda flavor's --build-arg SMDDP_WHEEL=<url> (build arguments: docker/Dockerfile)
BUILD_ARGS ?=
# A docker client that runs BuildKit builds: one with the buildx plugin, or one older than 23 (built in)
DOCKER ?= $(shell for d in $$(which -a docker); do if $$d buildx version >/dev/null 2>&1 \
  || $$d version -f '{{.Client.Version}}' 2>/dev/null | grep -qE '^(1[0-9]|2[0-2])\.'; then echo $$d; break; fi; done)
PYTHON := .venv/bin/python
# 28 steps on 2 hosts: 100% validation accuracy on the generated data with trainer.yaml's warm-up and decay (62% at
# the earlier constant rate; train.py on 2 CPU processes, 17 s), about a minute in local mode on 2 CPU cores
DEMO_ARGS := trainer.max_epochs=1 trainer.accelerator=cpu data.batch_size=16 optimizer.lr=0.02

.PHONY: help install lint format test test-unit lightning-cli-suite bench bench-overhead bench-memory bench-startup bench-streaming bench-checkpoint build push push-check debian-base demo local image clean

help:  ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

install:  ## Make .venv (SDK 2.x, tests, the runtime package) and .venv-sdk3 (SDK 3.x); pins in pyproject.toml
# both at once: 177 s from a fresh clone, against 306 s one after the other (2 EPYC cores, pip's cache warm)
	@$(MAKE) --no-print-directory -j2 .venv/.installed .venv-sdk3/.installed
# .venv/.client: the SDK and the runtime package, no torch (pyproject.toml's client group): all that demo, local and
# push run on the host, so a first `make demo` installs it while the image builds; .venv/.installed adds the rest
.venv/.client .venv-sdk3/.installed: pyproject.toml
	python3 -m venv $(@D)
	$(@D)/bin/pip install -q pip==26.0.1
	$(@D)/bin/pip install -q --group $(if $(findstring sdk3,$@),sdk3,client)
	$(@D)/bin/pip install -q --no-deps -e .
	touch $@
.venv/.installed: .venv/.client
	.venv/bin/pip install -q --group dev
	touch $@

lint: install  ## ruff: lint and formatting check (settings in pyproject.toml)
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

format: install  ## ruff: fix what it can, then format
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .

test: install  ## Run every test tier: unit, toolkit, cloud, container (REQUIRE_ALL_TIERS=1: a skipped tier fails); the unit tier on one core beside the jobs of the others (tests/conftest.py)
	.venv/bin/pytest -rs -n 2 --dist loadscope

test-unit: install  ## The unit tier alone: pure functions and in-process objects, on both cores (pytest-xdist)
	.venv/bin/pytest -rs -n 2 --dist loadscope tests/unit

lightning-cli-suite: install  ## Lightning's own CLI tests (its tag of the installed version) with its LightningCLI and the runtime's; names any test only the runtime's fails (git clone; LIGHTNING_REPO=path: a clone)
	.venv/bin/python scripts/lightning_cli_suite.py $(if $(LIGHTNING_REPO),--lightning-repo $(LIGHTNING_REPO))

bench: install  ## Training images/s: baseline (the pipeline of Martin Krasser's part 1, README), default path, model alone (BENCH_ARGS="--repeat 3 ...")
	$(PYTHON) scripts/benchmark.py $(BENCH_ARGS)

bench-overhead: install  ## Steps/s of a negligible model: Lightning's LightningCLI vs the runtime's as a SageMaker job, 1 and 2 processes (BENCH_ARGS="--profile")
	$(PYTHON) scripts/bench_overhead.py $(BENCH_ARGS)

bench-memory: install  ## Parameter + gradient + optimizer-state MiB per process, ddp vs fsdp, 2 CPU processes (BENCH_ARGS="--arch convnext_base")
	$(PYTHON) scripts/bench_memory.py $(BENCH_ARGS)

bench-streaming: install  ## File against litdata streaming from S3 (moto here): first step, images/s with the model and a no-op one, peak disk (BENCH_ARGS="--images 50000")
	$(PYTHON) scripts/bench_streaming.py $(BENCH_ARGS)

bench-checkpoint: install  ## A save's stall against its snapshot, local and to S3 (moto here), whole-file and DCP-sharded; S3 rates against raw boto3 (BENCH_ARGS="--only s3 --params 1e9 --quick")
	$(PYTHON) scripts/bench_checkpoint.py $(BENCH_ARGS)

bench-startup: install  ## Seconds from docker run to the first optimizer step in $(IMAGE):$(TAG), as SageMaker starts it, phase by phase
	$(PYTHON) scripts/startup.py --image $(IMAGE):$(TAG)

build:  ## Build $(IMAGE):$(TAG) for FLAVOR=dlc|dlc-smddp|conda|pypi (BASE_IMAGE, BUILD_ARGS, PIP_CA_BUNDLE, DOCKER: see above)
	@test -n "$(DOCKER)" || { echo "error: no docker client here runs BuildKit builds; install docker-buildx or set DOCKER=/path/to/docker" >&2; exit 1; }
	@test -n "$(BASE_$(FLAVOR))" || { echo "error: FLAVOR=$(FLAVOR) is not a flavor; choose dlc, dlc-smddp, conda or pypi" >&2; exit 1; }
	@base=$(BASE_IMAGE); \
	if ! $(DOCKER) image inspect $$base >/dev/null 2>&1 && ! $(DOCKER) pull -q $$base >/dev/null 2>&1; then \
	  if [ $(FLAVOR) = pypi ] && [ "$(origin BASE_IMAGE)" = file ]; then \
	    echo "cannot pull $$base: using $(DEBIAN_BASE), the same Python from Debian packages"; \
	    $(MAKE) --no-print-directory debian-base || exit 1; base=$(DEBIAN_BASE); \
	  else \
	    echo "error: cannot pull the base image $$base of FLAVOR=$(FLAVOR); log in to its registry (README: Image flavors) or set BASE_IMAGE" >&2; exit 1; \
	  fi; \
	fi; \
	set -x; DOCKER_BUILDKIT=1 $(DOCKER) build -f docker/Dockerfile -t $(IMAGE):$(TAG) \
	  --build-arg FLAVOR=$(FLAVOR) --build-arg BASE_IMAGE=$$base \
	  $(if $(wildcard $(PIP_CA_BUNDLE)),--secret id=pip_ca$(,)src=$(PIP_CA_BUNDLE)) $(BUILD_ARGS) .

push: push-check  ## Push $(IMAGE):$(TAG) to ECR (REGISTRY=host:port: elsewhere) as <git revision> and latest; prints the URI
	@$(PYTHON) scripts/push.py $(IMAGE):$(TAG) $(if $(REGISTRY),--registry $(REGISTRY)) --docker $(or $(DOCKER),docker)

# AWS credentials and region (or REGISTRY's form): `make build push` checks them before the build, not after it
push-check: .venv/.client
	@$(PYTHON) scripts/push.py --check $(if $(REGISTRY),--registry $(REGISTRY))
ifneq ($(filter push,$(MAKECMDGOALS)),)
build: push-check
push: $(filter build,$(MAKECMDGOALS))  # in that order whatever the order of the goals, and with -j
endif

debian-base:  ## Make $(DEBIAN_BASE) from Debian packages with debootstrap (root): a pypi base without a registry
	@$(DOCKER) image inspect $(DEBIAN_BASE) >/dev/null 2>&1 || { \
	  root=$$(mktemp -d) && trap 'rm -rf $$root' EXIT && \
	  debootstrap --variant=minbase --include=python3,python3-venv,python3-dev,gcc,libc6-dev,ca-certificates \
	    bookworm $$root $(DEBIAN_MIRROR) >/dev/null && \
	  tar -C $$root -c . | $(DOCKER) import - $(DEBIAN_BASE); }

demo:  ## Train on generated data: local mode, 2 CPU containers; prints the path of model.tar.gz
	$(MAKE) --no-print-directory -j2 .venv/.client image  # at the same time: pip on the host, the image's build
	$(PYTHON) scripts/make_dataset.py synthetic data/synthetic --train 1000 --test 200
	$(PYTHON) scripts/run_sagemaker.py --image $(IMAGE):$(TAG) --instance-type local --instance-count 2 \
	  --input data/synthetic --output runs $(DEMO_ARGS)

local: .venv/.client image  ## The same on the real CIFAR-10 (downloaded into data/cifar10 once; needs internet)
	test -f data/cifar10/cifar-10-python.tar.gz || $(PYTHON) scripts/make_dataset.py cifar10 data/cifar10
	$(PYTHON) scripts/run_sagemaker.py --image $(IMAGE):$(TAG) --instance-type local --instance-count 2 \
	  --input data/cifar10 --output runs $(DEMO_ARGS) data.val_split=0

# $(IMAGE):$(TAG), built as the pypi flavor when it is missing (an image made otherwise is used as it is)
image:
	@$(DOCKER) image inspect $(IMAGE):$(TAG) >/dev/null 2>&1 || $(MAKE) --no-print-directory build FLAVOR=pypi

clean:  ## Remove generated data, job outputs and logs (not .venv, not images)
	rm -rf data runs logs

, := ,
