"""The event vocabulary's errors."""


class InvalidEvent(ValueError):
    """An event failed validation (bad JSON, a missing field, a value out of range)."""
