"""``python -m ridge_bench.capacity``: runs :mod:`ridge_bench.capacity.benchmark`."""

from ridge_bench.capacity.benchmark import main

raise SystemExit(main())
