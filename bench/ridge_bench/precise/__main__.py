"""``python -m ridge_bench.precise``: runs :mod:`ridge_bench.precise.benchmark`."""

from ridge_bench.precise.benchmark import main

raise SystemExit(main())
