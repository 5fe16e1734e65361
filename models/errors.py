"""models' own exceptions, importable without torch (the CLI maps them at its boundary for every
command, `dinrec ingest` among those that never load a model)."""


class BundleError(ValueError):
    """A bundle is missing, of an unknown format, or fails its checksums."""
