"""The ranking blend's features and their file format (models.blend)."""

from __future__ import annotations

import numpy as np
import pytest

from dinrec.models.blend import FEATURES, RECENT, Blend, category_share, features


def test_the_recent_category_share_reads_only_the_newest_behaviours():
    history = [0, 0, *([3] * 5), *([1] * RECENT)]  # oldest first, 0 = padding; the 3s are too old to count
    share = category_share(history, np.array([1, 3, 2, 1]))
    assert share.tolist() == [1.0, 0.0, 0.0, 1.0]
    mixed = [2, 2, 2, 1, 1, 1, 1, 1, 1, 1]
    assert category_share(mixed, np.array([1, 2, 5])).tolist() == pytest.approx([0.7, 0.3, 0.0])
    assert category_share([0, 0], np.array([1, 2])).tolist() == [0.0, 0.0]  # no behaviour: no signal


def test_features_come_in_the_order_the_weights_are_kept_and_scale_per_request():
    x = features(din_logits=np.array([1.0, -1.0]), cosines=np.array([0.07, 0.0]), covisit=np.array([2.0, 4.0]),
                 covisit_newest=np.array([0.0, 0.0]), recent_category=np.array([0.5, 0.1]),
                 counts=np.array([0.0, np.e - 1]), temperature=0.07)
    assert x.shape == (2, len(FEATURES)) and x.dtype == np.float32
    np.testing.assert_allclose(x, [[1.0, 1.0, 0.5, 0.0, 0.5, 0.0], [-1.0, 0.0, 1.0, 0.0, 0.1, 1.0]], rtol=1e-6)
    blend = Blend(tuple(float(i) for i in range(len(FEATURES))))
    assert blend.combine(x).tolist() == pytest.approx((x @ np.arange(len(FEATURES))).tolist())


def test_a_blend_file_of_other_features_is_refused_not_misread():
    blend = Blend(tuple([0.5] * len(FEATURES)))
    assert Blend.from_json(blend.to_json()) == blend
    with pytest.raises(ValueError, match="blend features"):
        Blend.from_json({"features": ["din", "towers", "covisit", "popularity"], "weights": [1, 1, 1, 1]})
    with pytest.raises(ValueError, match="finite"):
        Blend((float("nan"),) * len(FEATURES))
