"""Loaders for public behaviour datasets and a synthetic generator, all returning
:class:`~feature_store.datasets.base.Interactions`."""

from dinrec.feature_store.datasets.base import Interactions
from dinrec.feature_store.datasets.detect import detect_layout, load_dataset

__all__ = ["Interactions", "detect_layout", "load_dataset"]
