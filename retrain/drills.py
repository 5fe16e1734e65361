"""Gate drills: train a deliberately degraded candidate and check that the gate refuses it.

A gate that has never refused anything is untested in production. ``dinrec retrain --drill KIND``
runs the whole job on the real window with one fault injected; a drill candidate is never published
and never rolled out, whatever the gate says (exit 3 when it refused, as it should; exit 5 when it let
the degraded model through).

* ``shuffled-labels``: the training samples' labels are permuted (the holdout is untouched), so the
  model learns noise — the failure of a broken label join upstream.
* ``miscalibrated``: the trained model's logits are multiplied by 4 — the ranking (AUC, GAUC) is
  exactly the trained model's, its probabilities are not — the failure of a changed negative
  sampling rate or a bad calibration layer, invisible to a GAUC-only gate.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np
import torch

from models.din import DIN
from training.samples import SampleSet

Drill = Literal["shuffled-labels", "miscalibrated"]
DRILLS: tuple[str, ...] = ("shuffled-labels", "miscalibrated")
LOGIT_SCALE = 4.0


def degrade_samples(samples: SampleSet, drill: str | None, seed: int) -> SampleSet:
    if drill != "shuffled-labels":
        return samples
    train = samples.train
    label = np.random.default_rng(seed).permutation(train.label)  # same count of positives, at random
    return dataclasses.replace(samples, train=dataclasses.replace(train, label=label))


@torch.no_grad()
def degrade_model(model: DIN, drill: str | None) -> None:
    if drill == "miscalibrated":
        model.out.weight.mul_(LOGIT_SCALE)  # logits = out(x): scaling the last layer scales every logit
        model.out.bias.mul_(LOGIT_SCALE)
