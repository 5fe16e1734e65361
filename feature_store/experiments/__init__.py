"""A/B experiments: definitions and assignment (assign.py), CTR statistics (stats.py)."""
