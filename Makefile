# make demo: set up .venv, show the plan, run a 2-node x 2-worker DDP job here (CPU).
# make test: system packages (as root), .venv, then the whole test suite.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
JUNIT_DIR ?=

.PHONY: demo test bench setup system-deps test-image clean golden docs

# src is compiled as pip compiles a regular install (an editable one is not): where
# PYTHONDONTWRITEBYTECODE is set (this workplace sets it), every hpctorch process would compile
# the modules it imports again (~0.2 CPU-s each; the suite starts thousands).
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0 numpy
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m compileall -q src
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/hpctorch run --simulate-nodes 2 --nproc-per-node 2 examples/toy_ddp.py

system-deps:
	scripts/install-system-deps

# mpi4py compiles against the MPI that system-deps installs; without one, MPI tests skip
# (or fail under HPCTORCH_REQUIRE_CLUSTER=1).
$(VENV)/.installed-mpi: $(VENV)/.installed | system-deps
	$(PY) -m pip install -q 'mpi4py>=3.1' && touch $@ || echo "mpi4py not installed: MPI tests will skip"

# The frameworks the interop tests run (CPU builds; versions that install quickly and work
# with torch 2.13.0). DeepSpeed builds no ops here (DS_BUILD_OPS=0): the one its jobs use on a CPU
# (deepspeed_shm_comm) is compiled on first use, as users' is; scripts/run-tests starts that beside the tests.
$(VENV)/.installed-frameworks: $(VENV)/.installed
	$(PY) -m pip install -q setuptools wheel lightning==2.6.6 accelerate==1.16.0
	DS_BUILD_OPS=0 $(PY) -m pip install -q --no-build-isolation deepspeed==0.19.8
	touch $@

# The frameworks install after mpi4py: two pips never write the venv at once.
$(VENV)/.installed-frameworks: | $(VENV)/.installed-mpi

# The system packages (apt: the network and dpkg) install beside the venv (pip), not before it;
# then the unit and integration tests on every core beside the cluster tests, then the serial ones (scripts/run-tests).
test:
	$(MAKE) -j2 system-deps $(VENV)/.installed-frameworks test-image
	PY=$(PY) JUNIT_DIR=$(JUNIT_DIR) scripts/run-tests $(PYTEST_ARGS)

# The container tests' Debian root (debootstrap: ~40 s of CPU), built in the background from the
# moment its packages are in, on the core pip leaves idle; the tests wait for it (scripts/build-test-image).
TEST_IMAGE := /var/cache/hpctorch-tests/image
test-image: | system-deps
	@if [ "$$(id -u)" = 0 ] && command -v debootstrap > /dev/null; then \
	  mkdir -p $(dir $(TEST_IMAGE)) && nohup scripts/build-test-image $(TEST_IMAGE) > $(TEST_IMAGE).log 2>&1 < /dev/null & \
	fi

# The documentation site (mkdocs-material) in site/: the README is its home page, docs/ the rest.
docs: setup
	$(PY) -m pip install -q mkdocs-material
	PY=$(PY) scripts/build-docs

# Rewrite the job-script golden files from the templates (then read the diff); tests never write them.
golden: setup
	$(PY) -m tests.fixtures.submit_cases

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis src/*.egg-info site build/docs

# make bench: every benchmark (about 15 minutes here, root for the 2-node cluster parts), then RESULTS.md.
BENCHES := first_collective plan_latency plan_scale bootstrap port_collisions teardown control_plane_scale store_wait straggler_overhead stage_spread auth_cost restart stage_hot
bench: setup $(VENV)/.installed-mpi
	$(PY) -m pip install -q -e '.[bench]'
	for b in $(BENCHES); do $(PY) -m benchmarks.$$b || exit 1; done
	$(PY) -m benchmarks.report
