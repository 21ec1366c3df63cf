# The two commands of the README (serve, test), plus lint. Each sets everything up first (idempotent).
.PHONY: serve test lint setup

serve:
	scripts/setup.sh
	.venv/bin/trillium serve

test:
	scripts/setup.sh test
	.venv/bin/python -m pytest -q

# ruff (lint + format check) over everything, mypy over the package (strict on protocol/,
# runtime/, scheduler/). Configured in pyproject.toml.
lint:
	scripts/setup.sh test
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

setup:
	scripts/setup.sh test
