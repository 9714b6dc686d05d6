"""``python -m ridge_bench.overload``: runs :mod:`ridge_bench.overload.benchmark`."""

from ridge_bench.overload.benchmark import main

raise SystemExit(main())
