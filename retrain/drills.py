"""Gate drills: train a deliberately degraded candidate and check that the gate refuses it.

A gate that has never refused anything is untested in production. ``dinrec retrain --drill KIND``
runs the whole job on the real window with one fault injected; a drill candidate is never published
and never rolled out, whatever the gate says (exit 3 when it refused, as it should; exit 5 when it let
the degraded model through).

* ``shuffled-labels``: a broken join upstream — the training samples' labels are permuted and every
  training behaviour's item and category ids are remapped at random (the holdout the gate measures on is
  untouched), so each model learns noise: DIN, the lanes, the counts. (Permuting the labels alone no
  longer suffices: the listwise DIN and the lanes read the behaviour log, which a label join does not
  reach, and a consistent shuffle of the log keeps each item's count, which still ranks.)
* ``miscalibrated``: the trained model's logits are multiplied by 4 — the ranking (AUC, GAUC) is
  exactly the trained model's, its probabilities are not — the failure of a changed negative
  sampling rate or a bad calibration layer, invisible to a GAUC-only gate.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np
import torch

from dinrec.models.din import DIN
from dinrec.models.vocab import PAD
from dinrec.training.samples import SampleSet

Drill = Literal["shuffled-labels", "miscalibrated"]
DRILLS: tuple[str, ...] = ("shuffled-labels", "miscalibrated")
LOGIT_SCALE = 4.0


def degrade_samples(samples: SampleSet, drill: str | None, seed: int) -> SampleSet:
    if drill != "shuffled-labels":
        return samples
    rng = np.random.default_rng(seed)
    train = samples.train
    label = rng.permutation(train.label)  # same count of positives, at random
    items = np.concatenate([[PAD], 1 + rng.permutation(samples.vocab.n_items - 1)])  # id → a wrong id
    cats = np.concatenate([[PAD], 1 + rng.permutation(samples.vocab.n_categories - 1)])
    train = dataclasses.replace(train, label=label, target_item=items[train.target_item],
                                target_cat=cats[train.target_cat])
    return dataclasses.replace(samples, train=train, seq_items=items[samples.seq_items],
                               seq_cats=cats[samples.seq_cats])


@torch.no_grad()
def degrade_model(model: DIN, drill: str | None) -> None:
    if drill == "miscalibrated":
        if model.calibration is not None:  # a listwise DIN: its logits pass through (scale, bias) last
            model.calibration.mul_(LOGIT_SCALE)
            return
        for param in model.out.parameters():  # logits = out(x): scaling the last layer scales every logit
            param.mul_(LOGIT_SCALE)
