# The two commands of the README. Each sets everything up first (idempotent).
.PHONY: serve test setup

serve:
	scripts/setup.sh
	.venv/bin/trillium serve

test:
	scripts/setup.sh test
	.venv/bin/python -m pytest -q

setup:
	scripts/setup.sh test
