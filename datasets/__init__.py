"""Loaders for public behaviour datasets and a synthetic generator, all returning
:class:`~datasets.base.Interactions`."""

from dinrec.datasets.base import Interactions
from dinrec.datasets.detect import detect_layout, load_dataset

__all__ = ["Interactions", "detect_layout", "load_dataset"]
