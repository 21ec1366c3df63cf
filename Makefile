# The two commands of the README (serve, test), plus lint. Each sets everything up first (idempotent).
.PHONY: serve test lint setup

serve:
	scripts/setup.sh
	.venv/bin/trillium serve

# --durations: CI's log names the slowest tests (the run is kept under 30 minutes).
test:
	scripts/setup.sh test
	.venv/bin/python -m pytest -q --durations=30

# ruff (lint + format check) over everything, mypy over the package (strict on protocol/,
# runtime/, scheduler/). Configured in pyproject.toml.
lint:
	scripts/setup.sh test
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

setup:
	scripts/setup.sh test
