"""``python -m ridge_bench.overhead``: runs :mod:`ridge_bench.overhead.benchmark`."""

from ridge_bench.overhead.benchmark import main

raise SystemExit(main())
