"""Batches from a SampleSet: every index tensor built once, one fancy-index per batch.

No per-sample Python work: a batch is a slice of a permutation, and histories are gathered from
the flat behaviour sequence (see training.samples for the jagged layout).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from dinrec.training.samples import SampleSet, Split


def gather_history(seq: torch.Tensor, hist_end: torch.Tensor, hist_len: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Left-padded histories.

    seq (E,), hist_end (B,), hist_len (B,) → (B, L) with seq[hist_end-hist_len : hist_end] right-aligned
    and 0 elsewhere. Example, L=4, seq=[5 6 7 8], hist_end=3, hist_len=2 → [0 0 6 7].
    """
    offsets = torch.arange(-seq_len, 0, device=seq.device)  # (L,) -L .. -1
    pos = hist_end.unsqueeze(1) + offsets  # (B, L)
    valid = offsets.unsqueeze(0) >= -hist_len.unsqueeze(1)  # (B, L) the last hist_len slots
    return torch.where(valid, seq[pos.clamp_min(0)], torch.zeros((), dtype=seq.dtype, device=seq.device))


def split_histories(samples: SampleSet, split: Split, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The left-padded (item, category) histories of ``split``'s ``rows``: two (B, L) tensors."""
    end, length = torch.from_numpy(split.hist_end[rows]), torch.from_numpy(split.hist_len[rows])
    return (gather_history(torch.from_numpy(samples.seq_items), end, length, samples.seq_len),
            gather_history(torch.from_numpy(samples.seq_cats), end, length, samples.seq_len))


@dataclass
class Batch:
    hist_items: torch.Tensor  # (B, L)
    hist_cats: torch.Tensor  # (B, L)
    target_item: torch.Tensor  # (B,)
    target_cat: torch.Tensor  # (B,)
    label: torch.Tensor  # (B,)
    user: torch.Tensor  # (B,)

    def inputs(self) -> tuple[torch.Tensor, ...]:
        return self.hist_items, self.hist_cats, self.target_item, self.target_cat

    def __len__(self) -> int:
        return len(self.label)


class SplitTensors:
    """One split's arrays as tensors on ``device``, plus the shared behaviour sequence."""

    seq_items: torch.Tensor  # (E,) the flat behaviour sequence's items (training.samples)
    seq_cats: torch.Tensor  # (E,) and their categories

    def __init__(self, samples: SampleSet, split: Split, seq_len: int, device: torch.device | str = "cpu",
                 share_seq_with: SplitTensors | None = None) -> None:
        as_t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
        if share_seq_with is not None:  # one copy of the behaviour sequence on the device for all splits
            self.seq_items, self.seq_cats = share_seq_with.seq_items, share_seq_with.seq_cats
        else:
            self.seq_items, self.seq_cats = as_t(samples.seq_items), as_t(samples.seq_cats)
        self.user, self.hist_end = as_t(split.user), as_t(split.hist_end)
        self.hist_len = as_t(np.minimum(split.hist_len, seq_len))
        self.target_item, self.target_cat = as_t(split.target_item), as_t(split.target_cat)
        self.label = as_t(split.label)
        self.seq_len = seq_len
        self.device = device

    def __len__(self) -> int:
        return len(self.label)

    def batch(self, idx: torch.Tensor) -> Batch:
        end, n = self.hist_end[idx], self.hist_len[idx]
        return Batch(gather_history(self.seq_items, end, n, self.seq_len),
                     gather_history(self.seq_cats, end, n, self.seq_len),
                     self.target_item[idx], self.target_cat[idx], self.label[idx], self.user[idx])

    def batches(self, batch_size: int, order: torch.Tensor | None = None, start: int = 0) -> Iterator[Batch]:
        """Batches in ``order`` (a permutation; default: as stored), from sample ``start`` on."""
        n = len(self)
        for i in range(start, n, batch_size):
            idx = order[i:i + batch_size] if order is not None else torch.arange(i, min(i + batch_size, n),
                                                                               device=self.label.device)
            yield self.batch(idx)
