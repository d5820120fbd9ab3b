"""Duration buckets and the order of batches: pure functions of (seed, epoch, lengths). No jax.

* the kept utterances fall into <= dataset.num_buckets equal-count duration buckets,
  each with one padded (samples, label length) shape; a batch is drawn from one bucket;
* epoch e: each bucket's utterances in ascending duration (e = 0 with SortaGrad) or
  shuffled by (seed, e, bucket), cut into global batches, and the batches in ascending
  order (SortaGrad) or shuffled by (seed, e). Step 0 is always a batch of the longest
  bucket, so running out of device memory shows at once;
* evaluation: each utterance in the smallest training shape it fits, and one extra
  shape for those longer than every bucket.
"""

from __future__ import annotations

import dataclasses

import numpy as np

LABEL_ALIGN = 8  # Padded label lengths are multiples of this (fewer distinct shapes).


def round_up(x: int, multiple: int) -> int:
    return -(-int(x) // multiple) * multiple


@dataclasses.dataclass(frozen=True)
class Buckets:
    members: list[np.ndarray]  # per bucket: indices into the lengths, in ascending duration
    shapes: list[tuple[int, int]]  # per bucket: padded (samples, label length)

    def steps_per_epoch(self, global_batch: int) -> int:
        return sum(len(m) // global_batch for m in self.members)

    def describe(self, global_batch: int, sample_rate: int) -> str:
        return "\n".join(
            f"  bucket {b}: {len(m)} utterances, <= {s / sample_rate:.2f} s -> "
            f"[{global_batch}, {s}] samples, [{global_batch}, {label_len}] labels"
            for b, (m, (s, label_len)) in enumerate(zip(self.members, self.shapes))
        )


def stretched(samples: int, stretch: float) -> int:
    """The most samples an utterance of `samples` has after augmentation that lengthens it up to
    `stretch` times (speed perturbation: settings.Waveform.stretch; the resampler may round up)."""
    return int(samples) if stretch == 1.0 else int(np.ceil(samples * stretch)) + 1


def make_buckets(
    num_samples: np.ndarray, label_lengths: np.ndarray, num_buckets: int, hop: int, stretch: float = 1.0
) -> Buckets:
    """Equal-count buckets over the duration order; each padded to its longest member (its length
    times `stretch` when augmentation may lengthen it; samples rounded up to whole hops, label
    lengths to LABEL_ALIGN)."""
    order = np.argsort(num_samples, kind="stable")
    members = np.array_split(order, num_buckets)
    shapes = [
        (round_up(stretched(num_samples[m].max(), stretch), hop), round_up(label_lengths[m].max(), LABEL_ALIGN))
        for m in members
    ]
    return Buckets(members, shapes)


def epoch_plan(
    seed: int, epoch: int, buckets: Buckets, global_batch: int, sortagrad: bool
) -> list[tuple[int, np.ndarray]]:
    """[(bucket, global batch of indices)] of one epoch (see the module docstring)."""
    ascending = sortagrad and epoch == 0
    plan = []
    for b, members in enumerate(buckets.members):
        if not ascending:
            members = np.random.default_rng([seed, epoch, b]).permutation(members)
        for k in range(len(members) // global_batch):
            plan.append((b, members[k * global_batch : (k + 1) * global_batch]))
    if not ascending:
        plan = [plan[i] for i in np.random.default_rng([seed, epoch]).permutation(len(plan))]
    if epoch == 0:  # the longest shape first: an OOM shows at step 0, not hours later
        last = len(buckets.members) - 1
        first = len(plan) - 1 if ascending else next(i for i, (b, _) in enumerate(plan) if b == last)
        plan.insert(0, plan.pop(first))
    return plan


def eval_shapes(
    samples: np.ndarray, label_lens: np.ndarray, train_shapes: list[tuple[int, int]], hop: int
) -> tuple[list[tuple[int, int]], np.ndarray]:
    """(shapes, <int>[N] shape of each utterance): the training shapes, plus one when some
    utterance fits none of them; each utterance goes to the smallest shape it fits."""
    shapes = list(train_shapes)
    fits = lambda s, label_len: (samples <= s) & (label_lens <= label_len)  # noqa: E731
    if samples.size and not fits(*shapes[-1]).all():
        extra = (round_up(samples.max(), hop), round_up(label_lens.max(), LABEL_ALIGN))
        shapes.append((max(extra[0], shapes[-1][0]), max(extra[1], shapes[-1][1])))
    bucket = np.full(len(samples), -1)
    for b in reversed(range(len(shapes))):
        bucket[fits(*shapes[b])] = b
    return shapes, bucket
