# Two commands a newcomer needs: `make serve` and `make test`.  Everything else is optional.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
SERVE_STAMP := $(VENV)/.serve-stamp

.PHONY: lock

$(VENV)/bin/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
	$(PYTHON) -m venv $(VENV)

# Every dependency pinned with its hashes (requirements/*.txt, written by `make lock` from
# pyproject.toml; tests/unit/test_lock.py checks they match it), then this repository and
# the Python client over them, editable (clients/examples/two_tenants.py runs with
# .venv/bin/python).  `make serve` installs what serving needs alone; `make test` and the
# rest add the test tools.
$(SERVE_STAMP): requirements/serve.txt pyproject.toml clients/python/pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install --quiet --require-hashes -r requirements/serve.txt
	$(BIN)/pip install --quiet --no-deps -e . -e ./clients/python
	@touch $@

$(STAMP): requirements/dev.txt pyproject.toml clients/python/pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install --quiet --require-hashes -r requirements/dev.txt
	$(BIN)/pip install --quiet --no-deps -e . -e ./clients/python
	@touch $@

lock: $(STAMP)  ## requirements/*.txt from pyproject.toml, with hashes (UPGRADE=1: newest releases)
	$(BIN)/python tools/lock.py

serve: $(SERVE_STAMP)  ## embedded PostgreSQL + migrate + serve on 127.0.0.1:8080
	$(BIN)/jobfair serve

# Camunda's own Python SDK, both lines, each in a virtualenv of its own (they pin their
# own dependencies); tests/acceptance/test_camunda_sdk.py drives them against Jobfair.
CAMUNDA_SDKS := .jobfair/camunda-sdk-9/.stamp .jobfair/camunda-sdk-10/.stamp
.jobfair/camunda-sdk-%/.stamp:
	$(PYTHON) -m venv $(@D)
	$(@D)/bin/pip install --quiet camunda-orchestration-sdk==$*.0.1
	@touch $@

# Camunda's JavaScript SDK (Node 20 and npm), driven by tests/acceptance/test_camunda_js_sdk.py.
CAMUNDA_JS := .jobfair/camunda-js
$(CAMUNDA_JS)/.stamp:
	npm install --prefix $(CAMUNDA_JS) --no-audit --no-fund --loglevel=error @camunda8/sdk@8.8.13
	@touch $@

# The TypeScript client: its compiler is its only (dev) dependency.
TS_CLIENT := clients/typescript
$(TS_CLIENT)/dist/.stamp: $(TS_CLIENT)/package.json $(TS_CLIENT)/tsconfig.json $(wildcard $(TS_CLIENT)/src/*.ts)
	cd $(TS_CLIENT) && npm install --no-audit --no-fund --loglevel=error && npm run --silent build
	@touch $@

# The Java client's tests run on JUnit 5 from Debian's junit5 package (Maven cannot reach
# its registry here); installed once, as root or through sudo.
JUNIT_JAR := /usr/share/java/junit-platform-console-standalone.jar
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
$(JUNIT_JAR):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq junit5

# The outage scenarios on an external server run on Debian's PostgreSQL 15, installed the
# same way (initdb and the server run as its unprivileged postgres user).
PG15_INITDB := /usr/lib/postgresql/15/bin/initdb
$(PG15_INITDB):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq postgresql-15

# The failover scenario (tests/chaos/test_failover.py) runs a primary and its synchronous
# standby under Debian's pg_auto_failover, installed the same way (with PostgreSQL 15).
PG_AUTOCTL := /usr/bin/pg_autoctl
$(PG_AUTOCTL):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq postgresql-15-auto-failover

# deploy/prometheus/alerts.yml is checked, and its unit tests run, by promtool, from
# Debian's prometheus package, installed the same way.
PROMTOOL := /usr/bin/promtool
$(PROMTOOL):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends prometheus

# The dashboard's tests drive Debian's chromium through Playwright (whose own browser
# download cannot run here), installed the same way.
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium

# tests/deploy/test_topology.py runs deploy/haproxy/haproxy.cfg in Debian's HAProxy, in
# front of two `jobfair serve` (compose.yaml's topology without containers).
HAPROXY := /usr/sbin/haproxy
$(HAPROXY):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends haproxy

# The container image (deploy/Containerfile; deploy/README.md, "The image") with Debian's
# podman.  No image registry is reachable here, so its base is made from Debian's packages
# (deploy/image/base.sh: debootstrap, about 2 minutes, once); BASE=python:3.11-slim-bookworm
# (or any Debian 12 Python 3.11 image) builds on that instead.
IMAGE ?= jobfair:latest
IMAGE_BASE ?= jobfair-base:bookworm
BASE ?=
CONTAINERS_CONF ?= $(CURDIR)/deploy/image/containers.conf
PODMAN := $(SUDO) env CONTAINERS_CONF=$(CONTAINERS_CONF) podman
# A proxy that re-signs TLS (this machine's) needs its CA bundle in the build: a secret,
# never a layer of the image.
PIP_CERT ?= /etc/ssl/certs/ca-certificates.crt
comma := ,
PODMAN_BIN := /usr/bin/podman
$(PODMAN_BIN):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq podman runc debootstrap

image-base: $(PODMAN_BIN)  ## the image's base from Debian's packages (debootstrap, ~2 minutes, once)
	@$(PODMAN) image exists $(IMAGE_BASE) || \
	  $(SUDO) env CONTAINERS_CONF=$(CONTAINERS_CONF) deploy/image/base.sh $(IMAGE_BASE)

image: $(if $(BASE),$(PODMAN_BIN),image-base)  ## the server's image, $(IMAGE) (about a minute)
	nice $(PODMAN) build --format docker -f deploy/Containerfile -t $(IMAGE) \
	  --build-arg BASE=$(or $(BASE),localhost/$(IMAGE_BASE)) \
	  $(if $(wildcard $(PIP_CERT)),--secret id=pip_cert$(comma)src=$(PIP_CERT)) .
	@# Earlier builds' images, untagged by this one (the builder's cached layers stay).
	@$(PODMAN) image prune -f --filter label=org.opencontainers.image.title=jobfair >/dev/null

# `make test` runs tests/deploy/test_image.py once the base exists (`make image-base`): on
# it, building the image for the code at hand takes well under a minute; without it, 2
# minutes more, and the suite is held to 15.
IMAGE_TEST := $(shell $(PODMAN) image exists $(IMAGE_BASE) 2>/dev/null || \
  echo --ignore=tests/deploy/test_image.py)

test: $(STAMP) $(CAMUNDA_SDKS) $(CAMUNDA_JS)/.stamp $(TS_CLIENT)/dist/.stamp $(JUNIT_JAR) $(PROMTOOL) $(CHROMIUM) $(HAPROXY) $(PG15_INITDB)  ## every test, on embedded PostgreSQL (and Debian's PostgreSQL 15 for tests/chaos)
	$(if $(IMAGE_TEST),@echo "tests/deploy/test_image.py left out: no $(IMAGE_BASE) (make image-base, once)")
	$(BIN)/pytest -q -n 2 --dist loadfile --durations=30 $(IMAGE_TEST)

# Outage scenarios left out of `make test` for time (an external PostgreSQL 15 restarted
# and killed under load with --workers 1 and 2; `make test` kills the embedded one).
chaos: $(STAMP) $(PG15_INITDB) $(PG_AUTOCTL)  ## the chaos-marked tests
	$(BIN)/pytest -q -m chaos

# Jobfair on a Citus cluster (docs/scaling.md): Citus installed for PostgreSQL 15 (from its
# packages, or built once from CITUS_SRC, a Citus source tree: tools/citus/install.sh),
# then the citus-marked tests, on a coordinator and two worker nodes started for the run.
CITUS_SRC ?=
# The hot path's, the guarantees' and the operators' suites, run against Citus too (each test's
# database the cluster's, emptied: tests/fixtures.py).
CITUS_SUITES = tests/integration/test_store_port.py tests/integration/test_caps.py \
	tests/integration/test_held_lanes.py tests/acceptance/test_fairness.py \
	tests/acceptance/test_fair_keys.py tests/acceptance/test_priority.py \
	tests/acceptance/test_pause.py tests/acceptance/test_rate_limits.py \
	tests/acceptance/test_fencing_and_retries.py tests/acceptance/test_long_polling.py \
	tests/acceptance/test_streams.py tests/acceptance/test_hand_off.py \
	tests/acceptance/test_work_conserving.py tests/acceptance/test_fairness_by.py \
	tests/acceptance/test_operators.py tests/acceptance/test_explain.py \
	tests/acceptance/test_explain_scoped.py tests/acceptance/test_job_browser.py \
	tests/acceptance/test_metrics.py tests/acceptance/test_readable_stats.py \
	tests/acceptance/test_dashboard.py tests/integration/test_history.py
# One process, one cluster: with -n 2 two clusters (six PostgreSQL instances) and their
# servers shared two cores, and the tests that time a rate limit's use or the leases'
# held seconds failed there (docs/scaling.md).
citus: $(STAMP) $(PG15_INITDB)  ## the Citus tests (CITUS_SRC=/path/to/citus builds Citus first)
	CITUS_SRC=$(CITUS_SRC) sh tools/citus/install.sh
	JOBFAIR_TEST_CITUS=1 $(BIN)/pytest -q -m citus tests/citus
	JOBFAIR_TEST_CITUS=1 $(BIN)/pytest -q $(CITUS_SUITES)

# The 30-minute soak of docs/reliability.md (tests/chaos/test_soak.py is its 2-minute
# version): JSON rows each minute, a table, and docs/img/soak.png drawn by matplotlib,
# installed here only (nothing else needs it).
SOAK_MINUTES ?= 30
soak: $(STAMP)  ## half the measured capacity for 30 minutes: drift, sizes, RSS, a plot
	$(BIN)/python -c 'import matplotlib' 2>/dev/null || $(BIN)/pip install --quiet matplotlib
	$(BIN)/python -m tests.chaos.soak --minutes $(SOAK_MINUTES)

# More cases of what `make test` covers, left out of it to keep it under 15 minutes: the
# listing's query plans on 60,000 rows, the demo's Ctrl-C and --keep, a server waiting
# on a schema that never comes.
extended: $(STAMP)  ## the extended-marked tests (a few minutes)
	$(BIN)/pytest -q -m extended

lint: $(STAMP)
	$(BIN)/ruff check app tests bench clients/python
	$(BIN)/ruff format --check app tests bench clients/python
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy app
	$(BIN)/mypy --strict clients/python/jobfair_client

screenshots: $(STAMP) $(CHROMIUM)  ## docs/img/*.png: each dashboard view, from a live server
	$(BIN)/python tools/screenshots.py

openapi: $(STAMP)  ## regenerate clients/openapi.json (a test fails when it is stale)
	$(BIN)/python -m app.api.openapi > clients/openapi.json

check: lint typecheck test

# The long schemathesis run (make test runs a bounded one): every operation of the
# document, all phases, FUZZ_EXAMPLES examples each, a fresh seed (FUZZ_SEED to replay).
FUZZ_EXAMPLES ?= 300
fuzz: $(STAMP)  ## schemathesis against the app's OpenAPI document, long (minutes)
	JOBFAIR_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) JOBFAIR_FUZZ_SEED=$(FUZZ_SEED) \
	  $(BIN)/pytest -q -s tests/acceptance/test_fuzz.py

bench: $(STAMP)  ## the benchmarks, JSON + a table (minutes; not part of `make test`)
	$(BIN)/python -m bench.run

# Jobfair against PgQueuer and Procrastinate, in-process on the same embedded PostgreSQL;
# W2 at 50 in flight also through the TypeScript and Java clients' workers.
# The published figures' sizes (docs/benchmarks.md "Issue 23"); PEERS_ARGS= for full size.
PEERS_ARGS ?= --scale 0.5 --repeat 3
bench-peers: $(STAMP) $(TS_CLIENT)/dist/.stamp  ## Jobfair vs PgQueuer and Procrastinate (~15 minutes)
	$(BIN)/pip install --quiet -e '.[dev,peers]'
	$(BIN)/python -m bench.peers $(PEERS_ARGS)

clean:
	rm -rf $(VENV) .jobfair .pytest_cache .mypy_cache .ruff_cache *.egg-info
