"""ridge's edge: the FastAPI app, settings, the OpenAI API, streaming, errors and telemetry."""
