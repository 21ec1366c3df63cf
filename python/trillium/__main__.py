"""``python -m trillium ...``: the ``trillium`` command (``trillium cluster`` starts replicas this way)."""

from trillium.cli import main

raise SystemExit(main())
