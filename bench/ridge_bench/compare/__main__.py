"""``python -m ridge_bench.compare``: runs :mod:`ridge_bench.compare.benchmark`."""

from ridge_bench.compare.benchmark import main

raise SystemExit(main())
