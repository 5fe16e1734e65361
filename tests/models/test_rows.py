"""Append-only tables (models.rows): appending copies nothing while there is room, and no version a
reader holds ever changes."""

from __future__ import annotations

import torch

from dinrec.models.rows import AppendOnlyRows


def test_appending_writes_past_the_end_of_the_same_buffer_and_old_versions_keep_their_rows():
    base = torch.arange(12.0).view(6, 2)  # (6, 2)
    v0 = AppendOnlyRows(base, min_spare=4)
    v1 = v0.appended(torch.full((3, 2), -1.0))
    assert len(v0) == 6 and len(v1) == 9 and v0.capacity == v1.capacity == 10
    assert v1.rows.data_ptr() == v0.rows.data_ptr()  # the same storage: the base rows were not copied
    assert torch.equal(v0.rows, base) and torch.equal(v1.rows[:6], base) and (v1.rows[6:] == -1).all()
    # Extending an older version must not write over rows a newer one published: it copies instead.
    v1b = v0.appended(torch.full((1, 2), 7.0))
    assert v1b.rows.data_ptr() != v0.rows.data_ptr() and (v1.rows[6:] == -1).all()
    assert torch.equal(v1b.rows, torch.cat([base, torch.full((1, 2), 7.0)]))


def test_a_full_buffer_grows_into_a_new_one_with_room_for_an_eighth_more():
    v = AppendOnlyRows(torch.zeros(0, 3, dtype=torch.long), min_spare=8)
    versions = [v]
    for j in range(40):
        versions.append(versions[-1].appended(torch.full((1, 3), j)))
    last = versions[-1]
    assert torch.equal(last.rows[:, 0], torch.arange(40)) and last.rows.dtype == torch.long
    buffers = {x.rows.data_ptr() for x in versions[1:]}
    assert len(buffers) == 5  # 40 appends of one row: buffers of 8, 17, 26, 35, 44 rows, not 40 copies
    assert all(torch.equal(x.rows[:, 0], torch.arange(len(x))) for x in versions)  # every version intact
