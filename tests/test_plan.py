"""The batch plan (ds2_jax.pipeline.plan): buckets and each epoch's order, pure functions of (seed, epoch, lengths)."""

from __future__ import annotations

import numpy as np
import pytest

from ds2_jax.pipeline import plan

LENGTHS = np.array([900, 120, 480, 300, 610, 75, 830, 260, 700, 150, 540, 390])
LABELS = np.array([30, 4, 17, 11, 20, 3, 28, 9, 24, 5, 18, 13])


def buckets():
    return plan.make_buckets(LENGTHS, LABELS, num_buckets=3, hop=160)


def test_equal_count_buckets_in_duration_order_padded_to_whole_hops_and_label_multiples():
    b = buckets()
    assert [len(m) for m in b.members] == [4, 4, 4]
    assert [list(LENGTHS[m]) for m in b.members] == [[75, 120, 150, 260], [300, 390, 480, 540], [610, 700, 830, 900]]
    assert b.shapes == [(320, 16), (640, 24), (960, 32)]  # 260 -> 2 hops; label 9 -> 16; 900 -> 6 hops
    assert b.steps_per_epoch(2) == 6 and b.steps_per_epoch(3) == 3


@pytest.mark.parametrize("sortagrad", [False, True])
def test_an_epoch_uses_each_utterance_at_most_once_and_starts_with_the_longest_bucket(sortagrad):
    for epoch in (0, 1, 2):
        steps = plan.epoch_plan(7, epoch, buckets(), 2, sortagrad)
        used = np.concatenate([idx for _, idx in steps])
        assert len(steps) == 6 and sorted(used) == list(range(12))
        for b, idx in steps:  # a batch is drawn from one bucket
            assert set(idx) <= set(buckets().members[b])
        if epoch == 0:
            assert steps[0][0] == 2


def test_the_order_is_a_function_of_seed_and_epoch_and_sortagrad_ascends_in_epoch_zero_only():
    def order(seed, epoch, sortagrad=False):
        return [tuple(idx) for _, idx in plan.epoch_plan(seed, epoch, buckets(), 2, sortagrad)]

    assert order(7, 1) == order(7, 1)
    assert order(7, 1) != order(8, 1) and order(7, 1) != order(7, 2)
    ascending = order(7, 0, sortagrad=True)
    durations = [LENGTHS[list(i)].max() for i in ascending[1:]]  # after the longest batch, ascending
    assert durations == sorted(durations) and ascending[0] == tuple(buckets().members[2][2:])
    assert order(7, 1, sortagrad=True) == order(7, 1)  # later epochs shuffle as without SortaGrad


def test_eval_shapes_put_each_utterance_in_the_smallest_shape_it_fits_and_add_one_for_longer():
    shapes, bucket = plan.eval_shapes(np.array([100, 330, 950, 1200]), np.array([3, 20, 30, 40]), buckets().shapes, 160)
    assert shapes[:3] == buckets().shapes and shapes[3] == (1280, 40)
    assert list(bucket) == [0, 1, 2, 3]  # 330 samples with 20 labels: bucket 1 (label 20 > 16)


def test_eval_shapes_hold_every_utterance_in_the_smallest_shape_it_fits_and_grow_in_both_dimensions():
    """Random eval splits against the training buckets (longer and shorter ones, long transcripts on
    short audio and the reverse): every utterance fits its shape, fits no smaller one, and each shape
    is at least the one before in samples and in labels, the extra one included."""
    rng = np.random.default_rng(0)
    train = buckets().shapes
    for _ in range(200):
        n = int(rng.integers(1, 12))
        samples = rng.integers(10, 1400, n)
        labels = rng.integers(1, 45, n)
        shapes, bucket = plan.eval_shapes(samples, labels, train, 160)
        assert shapes[: len(train)] == train and len(shapes) <= len(train) + 1
        for a, b in zip(shapes, shapes[1:]):
            assert b[0] >= a[0] and b[1] >= a[1], shapes
        for s, m, k in zip(samples, labels, bucket):
            assert s <= shapes[k][0] and m <= shapes[k][1], (s, m, shapes[k])
            assert not any(s <= sh[0] and m <= sh[1] for sh in shapes[:k]), (s, m, k, shapes)
