"""The FastAPI recommendation service."""
