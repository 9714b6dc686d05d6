"""ridge's pure decision logic. Imports nothing of the project but itself, and no web framework,
HTTP client, Redis or Prometheus library."""
