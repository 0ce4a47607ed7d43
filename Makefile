# Two commands do all the set-up: `make demo` and `make test` each create .venv when needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test jvm-archive bench bench-35 bench-loop bench-latency bench-scaleout soak install clean pg kafka s3 fuzz

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/sparkstate demo

# The postgres sink is tested against a real server (tests/io/pg.py starts a throwaway one):
# install the PostgreSQL server binaries from the OS packages when they are missing.
pg:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 \
	    || [ -x "$$SPARKSTATE_PG_BIN/initdb" ]; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  echo "installing the PostgreSQL server (apt-get install postgresql) for the postgres sink tests"; \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; \
	else \
	  echo "PostgreSQL server binaries (initdb, pg_ctl) are needed by the tests: install PostgreSQL, or set SPARKSTATE_PG_BIN" >&2; exit 1; \
	fi

# Spark's Kafka connector and a Kafka broker (for the kafka: tests and `sparkstate demo --kafka`):
# resolved with Maven into its local repository; sparkstate.io.connectors decides the coordinates
# and writes the jar lists to ~/.cache/sparkstate (SPARKSTATE_CACHE). Needs mvn and Java 17.
kafka: $(STAMP)
	$(PY) -c "from sparkstate.io.connectors import main; raise SystemExit(main(['fetch']))"

# S3A (s3a:// checkpoints and outputs): hadoop-aws of pyspark's Hadoop version with the AWS SDK v2
# modules it needs, and S3Proxy, the S3-compatible server the tests start on loopback. Resolved with
# Maven like `make kafka` (versions: sparkstate.io.connectors.HADOOP_AWS_VERSIONS). Needs mvn and Java 17.
s3: $(STAMP)
	$(PY) -c "from sparkstate.io.connectors import main; raise SystemExit(main(['fetch', 'hadoop-aws', 's3proxy']))"

# The driver JVM's class-data archive (sparkstate.jvm_archive): made once for this Java and pyspark
# (about 1.5 min), it starts every later local session in about 60% of the time. Without it,
# sessions start as before.
jvm-archive: $(STAMP)
	@test -f "$$($(VENV)/bin/sparkstate jvm-archive --path)" || $(VENV)/bin/sparkstate jvm-archive \
	  || echo "sparkstate jvm-archive failed: local sessions start without the archive"

# Two pytest workers (pytest-xdist; worksteal rebalances the long tests): a Spark test spends much
# of its time waiting (triggers, JVM and Python worker start-up, child jobs), so two share 2 cores well.
# PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2
# The quality gates first (settings: pyproject.toml's [tool.ruff] and [tool.mypy]), then the suite.
test: $(STAMP) pg kafka s3 jvm-archive
	$(PY) -m ruff check src
	$(PY) -m mypy
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# Property-based fuzzing of hostile input (every tests/io/test_hostile_*.py) with many more records per
# stream than `make test` draws (60): FUZZ_EXAMPLES records (Hypothesis, derandomized: the same each run).
FUZZ_EXAMPLES ?= 2000
fuzz: $(STAMP) pg kafka
	SPARKSTATE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -n 0 $(wildcard tests/io/test_hostile_*.py)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info

# Benchmarks (see benchmarks/README.md): BENCH_ARGS="--quick" for a short smoke run,
# BENCH_ARGS="--steady --high-cardinality" for 20 steady micro-batches and a 1M-key cell.
# Then the batched engine's per-key loop without Spark (benchmarks/loop.py, about a minute):
# LOOP_ARGS="--keys 25000 --profile 20" for where the time goes; `make bench-loop` runs it alone.
LOOP_ARGS ?= --keys 25000 --repeats 3
bench: $(STAMP)
	$(PY) -m benchmarks.run $(BENCH_ARGS)
	$(PY) -m benchmarks.loop $(LOOP_ARGS)

bench-loop: $(STAMP)
	$(PY) -m benchmarks.loop $(LOOP_ARGS)

# Speed on PySpark 3.5 (issue 38; benchmarks/README.md, "PySpark 3.5"): the running count and event-time
# sessions at 50K and 1M keys, Java and raw applyInPandasWithState beside sparkstate's inband engine,
# then the state cost (100K and 10M keys in state, 10K touched per batch); each contender in its own
# JVM, in the version matrix's 3.5 venv (`python -m tests.versions.venvs` makes it), this checkout's
# sources first. About 2 hours on a quiet 2-core machine (raw applyInPandasWithState at 1M keys is most of
# it: one Python call per key and batch, and per timeout); BENCH35_ARGS="--quick" checks the wiring.
BENCH35 := --pyspark 3.5 --workload all --high-cardinality --scaling --contenders java pyspark-pandas sparkstate-inband \
	--timeout 7200
bench-35: $(STAMP)
	$(PY) -m benchmarks.run $(BENCH35) $(BENCH35_ARGS)

# Latency (benchmarks/latency.py): Kafka in -> the stateful job -> Kafka out through a local broker,
# each contender in its own JVM: the one-record floor, p50/p95/p99 at fixed rates, the sustained rate.
# LATENCY_ARGS="--quick" for a smoke run; "--workload count --rates 1000,10000 --seconds 30" to choose.
# Without LATENCY_ARGS: every contender and the settings variants of docs/performance.md (about 25 min).
bench-latency: $(STAMP) kafka
	$(PY) -m benchmarks.latency $(LATENCY_ARGS)

# Scale-out (benchmarks/scaleout.py): running-count on a standalone cluster of 1, 2 and 3 one-core
# workers started here; stateful tasks per stage, events/s, and a 100-node projection from the
# measured per-task cost. SCALEOUT_ARGS="--rows 20000" to change it.
bench-scaleout: $(STAMP)
	$(PY) -m benchmarks.scaleout $(SCALEOUT_ARGS)

# Soak run (benchmarks/soak.py): sessionize on the generator at a fixed rate for 10 minutes; exits 1
# unless batch duration and state stay flat. SOAK_ARGS="--minutes 2 --rate 300" to change it.
# SOAK=long: 30 minutes, 50,000 users at 2,000 events/s, at spark_session()'s own 64 MB RocksDB
# bound (benchmarks/soak.py PRESETS; on a quiet machine).
SOAK ?=
soak: $(STAMP)
	$(PY) -m benchmarks.soak $(if $(SOAK),--preset $(SOAK)) $(SOAK_ARGS)
