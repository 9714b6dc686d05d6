"""``python -m gateway.cli``: the ``ridge`` command (:mod:`gateway.cli.main`)."""

from gateway.cli.main import main

raise SystemExit(main())
