"""Every reported number against an independently computed value (issue 40, item 11).

Tests with a 1.0 s interval cannot see a missing `* interval_s`; with no skipped step, a wrong
denominator of the interval's grad_norm mean; with a constant rate, a learning rate one step off.
Here the reporter gets the train step's own metric records for steps with a warm-up rate, a
skipped step and an interval of 2.5 s, and every field of metrics.jsonl and TensorBoard is held to
a value computed here from the raw numbers; the eval JSON's rates to an edit distance written
here. Their keys agree with each other.
"""

import json
import os
import struct
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ds2_jax import metrics, reporting, train
from ds2_jax import state as state_lib
from ds2_jax.pipeline.batch import Sharding
from ds2_jax.pipeline.source import make_source
from tests.helpers import tiny_settings

INTERVAL_S = 2.5
LR, WARMUP = 1e-3, 4


def tensorboard_scalars(folder: str) -> dict[tuple[str, int], float]:
    """{(tag, step): value} of every scalar in the TFRecord event files of `folder`."""
    from tensorboardX.proto import event_pb2

    out = {}
    for name in sorted(os.listdir(folder)):
        data = open(os.path.join(folder, name), "rb").read()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            for v in event.summary.value:
                out[(v.tag, event.step)] = (
                    v.simple_value
                    if v.HasField("simple_value")
                    else float(
                        np.frombuffer(v.tensor.tensor_content, np.float32)[0]
                        if v.tensor.tensor_content
                        else v.tensor.float_val[0]
                    )
                )
    return out


@pytest.fixture(scope="module")
def step_records():
    """The train step's metric records of steps 0-5 (step 3's loss NaN: skipped), from the real step."""
    config = tiny_settings(
        per_device_batch_size=2,
        num_devices=1,
        **{
            "model.rnn_size": 8,
            "model.conv_channels": 2,
            "optimizer.learning_rate": LR,
            "optimizer.warmup_steps": WARMUP,
            "faults.nan_at_steps": "3",
            "dataset.synthetic_min_duration_s": 0.3,
            "dataset.synthetic_max_duration_s": 0.5,
        },
    )
    source = make_source(config, Sharding(2))
    state = state_lib.initial_state(config, source, jax.random.PRNGKey(0))
    step = jax.jit(
        lambda s, b, r: train.step_function(config)(s, b, r, axis_name=None, **state_lib.step_kwargs(config))
    )
    records = []
    for i in range(6):
        state, m = step(state, {k: jnp.asarray(v) for k, v in source.train_batch(i).items()}, jax.random.PRNGKey(1))
        records.append(jax.device_get(m))
    return config, records


@pytest.mark.slow
def test_every_field_of_metrics_jsonl_and_tensorboard_equals_its_oracle(step_records, tmp_path):
    config, records = step_records
    w = str(tmp_path / "w")
    rep = reporting.Reporter(config, w, 0, is_chief=True)
    with rep:
        for i, m in enumerate(records[:5]):
            rep.dispatched(i, m)
            if i == 0:  # the first step's wait (worker start-up) is not counted; then 0.75 s in all
                rep.input_wait.add(0.75)  # what reporting.next_batch would have measured
        rep._last_time = time.perf_counter() - INTERVAL_S  # the interval of steps 2-5 took 2.5 s
        state = type("S", (), {"skipped_steps": np.int32(1)})()
        rep.interval_end(state)
        rep.evaluated(5, {"wer": 0.25, "cer": 0.125, "loss": 3.5, "utterances": 4, "examples": []})
    (train_record, eval_record) = [json.loads(line) for line in open(os.path.join(w, "metrics.jsonl"))]

    # The oracle: steps 0-4 are the interval's means; its time is that of steps 1-4 (step 0 compiles and
    # is not timed); step 3 was skipped.
    interval = records[:5]
    finite = [m for m in interval if m["finite_steps"] == 1]
    assert len(finite) == 4 and interval[3]["finite_steps"] == 0
    want = {
        "step": 5,
        "loss": sum(float(m["loss_sum"]) for m in finite) / sum(float(m["loss_count"]) for m in finite),
        "grad_norm": sum(float(m["grad_norm_sum"]) for m in finite) / 4,  # the finite steps only
        "learning_rate": np.mean([LR * min(s, WARMUP) / WARMUP for s in range(5)]),  # the rate each step used
        "infeasible_utterances": sum(float(m["infeasible"]) for m in interval),
        "step_time_s": INTERVAL_S / 4,
        "utterances_per_s": 4 * 2 / INTERVAL_S,  # the 4 timed steps of 2 utterances each
        "input_wait_s": 0.75,
        "skipped_steps": 1,
    }
    assert set(train_record) == set(want)
    for key, value in want.items():
        assert train_record[key] == pytest.approx(value, rel=2e-3), key
    assert eval_record == {"step": 5, "eval_wer": 0.25, "eval_cer": 0.125, "eval_loss": 3.5}
    scalars = tensorboard_scalars(os.path.join(w, "tensorboard"))
    in_jsonl = {(k, r["step"]): v for r in (train_record, eval_record) for k, v in r.items() if k != "step"}
    assert set(scalars) == set(in_jsonl)  # the same keys and steps in both
    for key, value in in_jsonl.items():
        assert scalars[key] == pytest.approx(value, rel=1e-6), key


def _edit_distance(a, b) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def test_eval_rates_are_corpus_edit_distances_over_reference_lengths():
    refs = ["the cat sat", "a dog", "hello world again"]
    hyps = ["the cat sat down", "dog", "hello word again"]
    words = sum(_edit_distance(r.split(), h.split()) for r, h in zip(refs, hyps)) / sum(len(r.split()) for r in refs)
    chars = sum(_edit_distance(r, h) for r, h in zip(refs, hyps)) / sum(len(r) for r in refs)
    got = metrics.error_rates(refs, hyps)
    assert got["wer"] == pytest.approx(words) and got["cer"] == pytest.approx(chars)


def test_a_value_that_is_not_a_number_is_null_in_metrics_jsonl_and_absent_from_tensorboard(tmp_path):
    writer = metrics.MetricWriter(str(tmp_path))
    writer.write(3, {"a": float("nan"), "b": float("inf"), "c": -float("inf"), "d": None, "e": 1.5})
    writer.close()
    line = open(tmp_path / "metrics.jsonl").read()
    record = json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c}: not JSON"))
    assert record == {"step": 3, "a": None, "b": None, "c": None, "d": None, "e": 1.5}
    assert tensorboard_scalars(str(tmp_path / "tensorboard")) == {("e", 3): 1.5}


@pytest.mark.slow
def test_an_interval_without_a_trainable_utterance_logs_no_loss_and_says_why(step_records, tmp_path, caplog):
    """Steps whose every utterance is CTC-infeasible (a 40x speed factor did this): loss null, never 0,
    and a warning naming the steps and where to look."""
    config, records = step_records
    empty = [
        dict(m, loss_sum=np.float32(0), loss_count=np.float32(0), infeasible=m["utterances"], untrainable=np.float32(1))
        for m in records[:2]
    ]
    w = str(tmp_path / "w")
    rep = reporting.Reporter(config, w, 0, is_chief=True)
    with rep, caplog.at_level("INFO"):
        for i, m in enumerate(empty):
            rep.dispatched(i, m)
        rep.interval_end(type("S", (), {"skipped_steps": np.int32(0)})())
    (record,) = [json.loads(line) for line in open(os.path.join(w, "metrics.jsonl"))]
    assert record["loss"] is None and record["infeasible_utterances"] == 2 * float(records[0]["utterances"])
    assert "2 of steps 1-2 had no trainable utterance" in caplog.text and "waveform.speed_max" in caplog.text
    assert "loss=-" in caplog.text and "no utterance of steps 1-2 was trainable" in caplog.text
