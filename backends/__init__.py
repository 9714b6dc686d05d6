"""Everything engine-specific: upstream client, engine dialects, metrics scraping, the endpoint
registry and the engine simulator."""
