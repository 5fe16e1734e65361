"""Offline training of DIN: point-in-time samples, the pure model, the loop, bundles."""
