"""``python -m ridge_bench.fidelity``: runs :mod:`ridge_bench.fidelity.benchmark`."""

from ridge_bench.fidelity.benchmark import main

raise SystemExit(main())
