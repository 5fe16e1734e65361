import itertools

import numpy as np
import pytest

from dinrec.training.metrics import auc, gauc, logloss


def brute_auc(y, s):
    pairs = [(a, b) for a, b in itertools.product(range(len(y)), repeat=2) if y[a] == 1 and y[b] == 0]
    return sum(1.0 if s[a] > s[b] else 0.5 if s[a] == s[b] else 0.0 for a, b in pairs) / len(pairs)


def test_auc_matches_pairwise_definition_with_ties():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 60)
    s = rng.integers(0, 5, 60).astype(float)  # many ties
    assert auc(y, s) == pytest.approx(brute_auc(y, s))
    assert np.isnan(auc(np.ones(3), np.arange(3)))


def test_gauc_weights_users_by_impressions_and_skips_one_class_users():
    users = np.array([1, 1, 1, 1, 2, 2, 3])
    y = np.array([1, 0, 0, 0, 1, 0, 1])
    s = np.array([0.9, 0.1, 0.2, 0.95, 0.1, 0.9, 0.5])
    u1, u2 = brute_auc(y[:4], s[:4]), brute_auc(y[4:6], s[4:6])
    assert gauc(users, y, s) == pytest.approx((4 * u1 + 2 * u2) / 6)


def test_logloss_is_stable_for_large_logits():
    y = np.array([1.0, 0.0, 1.0])
    z = np.array([1000.0, -1000.0, 0.0])
    assert logloss(y, z) == pytest.approx(np.log(2) / 3)
