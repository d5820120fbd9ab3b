"""Orbax checkpoints of the (unreplicated) train state: save, restore, resume; and the workdir's
config.json: written, read back, compared on resume, overlaid for an evaluation."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import os
import re
import weakref

import orbax.checkpoint as ocp

from ds2_jax import errors, files, settings

log = logging.getLogger("ds2_jax")


def manager(workdir: str, keep: int = 3) -> ocp.CheckpointManager:
    """A CheckpointManager over `workdir/checkpoints` keeping the newest `keep`."""
    directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
    return ocp.CheckpointManager(directory, options=options)


@contextlib.contextmanager
def managed(workdir: str, keep: int = 3):
    """manager(), closed on the way out: an in-flight save finishes even when an error ends the run.
    Meanwhile orbax's background threads log their errors to workdir/error.log, not the terminal:
    the failure reaches the main thread and is explained there in one line."""
    mgr = manager(workdir, keep)
    with errors.background_errors_to_log(workdir, "orbax", "Event loop is closed"):
        try:
            yield mgr
        except BaseException:
            try:
                mgr.close()
            except Exception as e:  # noqa: BLE001  (the error already propagating is the one to report)
                log.warning("while stopping after an error, the checkpoint manager failed too: %s", str(e)[:300])
            raise
        mgr.close()


def save(mgr: ocp.CheckpointManager, step: int, state, wait: bool = False) -> None:
    """Saves `state` (a host or single-device pytree) as checkpoint `step` (asynchronously)."""
    mgr.save(step, args=ocp.args.StandardSave(state))
    if wait:
        mgr.wait_until_finished()


def damaged_name(step: int) -> str:
    """Where a damaged checkpoint is moved: <step>.damaged-<UTC time> (orbax ignores the name)."""
    return f"{step}.damaged-{datetime.datetime.now(datetime.timezone.utc).strftime('%Y%m%dT%H%M%S')}"


def _move_aside(mgr: ocp.CheckpointManager, step: int) -> str:
    src = os.path.join(os.fspath(mgr.directory), str(step))
    dst = os.path.join(os.fspath(mgr.directory), damaged_name(step))
    os.rename(src, dst)
    return dst


FINISHED_MARKER = "_CHECKPOINT_METADATA"  # orbax writes it when a save is committed


def unfinished(mgr: ocp.CheckpointManager, step: int) -> str | None:
    """What a step folder lacks that every finished save has (None: nothing), without
    asking orbax (an empty or partial folder is a save that never finished). The marker
    counts only where another step has it (an orbax that writes none has no such rule)."""
    directory = os.fspath(mgr.directory)
    folder = os.path.join(directory, str(step))
    items = [n for n in os.listdir(folder) if os.path.isdir(os.path.join(folder, n))]
    if not items:
        return "item folder (e.g. default/): an empty or partial folder"
    if not os.path.isfile(os.path.join(folder, FINISHED_MARKER)) and any(
            os.path.isfile(os.path.join(directory, str(s), FINISHED_MARKER)) for s in mgr.all_steps() if s != step):
        return FINISHED_MARKER
    return None


def restore_latest(mgr: ocp.CheckpointManager, target, move_damaged: bool = False):
    """(state, step) from the newest checkpoint that restores, shaped like `target`.

    A damaged newest checkpoint (truncated or missing files) is skipped with a warning
    naming what failed, and the previous one is used; with `move_damaged` (training) the
    damaged ones are renamed aside (damaged_name), so their steps are trained and saved
    again. (None, None) when there are no checkpoints; a CheckpointError, never a silent
    fresh start, when none of them restores.
    """
    steps = sorted(mgr.all_steps(), reverse=True)
    if not steps:
        return None, None
    failures = []
    for step in steps:
        if (missing := unfinished(mgr, step)) is not None:
            # Not handed to orbax: its failed guess at an empty folder's layout made every
            # later restore of this manager fail too (good checkpoints called damaged).
            failures.append((step, f"never finished: no {missing} (a save cut short by a crash or a slow file system)"))
            log.warning("checkpoint %d in %s is damaged, trying the previous one (%s)", step, mgr.directory, failures[-1][1])
            continue
        try:
            state = mgr.restore(step, args=ocp.args.StandardRestore(target))
        except Exception as e:  # orbax raises many types for damaged files
            failures.append((step, f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"))
            log.warning("checkpoint %d in %s is damaged, trying the previous one (%s)", step, mgr.directory, failures[-1][1])
            continue
        log.info("restored checkpoint at step %d from %s", step, mgr.directory)
        if move_damaged and failures:
            for bad, _ in failures:
                log.warning("moved damaged checkpoint %d aside to %s; steps %d-%d are trained again",
                            bad, _move_aside(mgr, bad), step + 1, bad)
            mgr.reload()
        return state, step
    # Name a failure orbax saw (a model mismatch, damaged files) before a merely unfinished folder.
    newest, reason = next((f for f in failures if not f[1].startswith("never finished")), failures[0])
    raise errors.CheckpointError(
        f"none of the {len(steps)} checkpoints in {mgr.directory} restores into this model (step {newest}: "
        f"{reason[:200]}). If the model or optimizer settings differ from the run that wrote them, use its "
        f"config ({os.path.join(os.path.dirname(os.fspath(mgr.directory)), 'config.json')}); if the files are "
        f"damaged, move {mgr.directory} away to start over"
    )


def failed_step(directory: str, err: BaseException) -> int | None:
    """The step whose save `err` (or an error it chains) reports, read off the path it names
    (`<directory>/<step>.orbax-checkpoint-tmp/...`); None if it names none."""
    pattern = re.compile(re.escape(os.fspath(directory).rstrip("/")) + r"/(\d+)(?:\.orbax-checkpoint-tmp|/|\b)")
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if match := pattern.search(str(err)):
            return int(match.group(1))
        err = err.__cause__ or err.__context__
    return None


def explain_save_error(mgr: ocp.CheckpointManager, step: int | None, err: BaseException) -> errors.Ds2Error:
    """A short error naming the checkpoint directory, the step whose save failed (saves are
    asynchronous: an earlier save's failure surfaces at the next), its free space and the way out."""
    directory = os.fspath(mgr.directory)
    step = failed_step(directory, err) or step
    what = f"writing checkpoint {step}" if step is not None else "finishing the last checkpoint"
    full = errors.is_disk_full(err)
    cause = "disk full" if full else f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"
    return (errors.DiskFull if full else errors.CheckpointError)(
        f"{what} to {directory} failed ({cause}; {errors.free_space(directory)} there); earlier checkpoints are "
        "intact. Free disk space or choose another --workdir, then rerun the same command"
    )


_STARTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # manager -> the step of its last save()


def save_or_explain(mgr: ocp.CheckpointManager, step: int, state) -> None:
    """save(), turning a failure (disk full, permissions, an orbax error) into a clear error
    naming the step whose save failed: the previous (asynchronous) one, or this one."""
    finish_or_explain(mgr)  # orbax's save waits for the previous one anyway: its failure is its own
    try:
        _STARTED[mgr] = step
        save(mgr, step, state)
        mgr.check_for_errors()
    except Exception as e:  # noqa: BLE001  (orbax and tensorstore raise many types)
        raise explain_save_error(mgr, step, e) from e


def finish_or_explain(mgr: ocp.CheckpointManager) -> None:
    """wait_until_finished(): an asynchronous save's failure surfaces here, explained."""
    try:
        mgr.wait_until_finished()
        mgr.check_for_errors()
    except Exception as e:  # noqa: BLE001
        raise explain_save_error(mgr, _STARTED.get(mgr), e) from e


def save_config(config: settings.Settings, workdir: str) -> None:
    """Writes workdir/config.json (settings.to_dict of the run's Settings), so eval and
    transcription rebuild the same model. Atomic: a kill mid-write leaves the old file."""
    os.makedirs(workdir, exist_ok=True)
    files.write_text(os.path.join(workdir, "config.json"), json.dumps(settings.to_dict(config), indent=2))


def key_at(text: str, pos: int) -> str:
    """The dotted key of a JSON text whose value is being read at character `pos`
    ('model.rnn_size'; '' at the top level), for errors about a torn or hand-edited file."""
    stack: list = []
    tokens = re.findall(r'"(?:[^"\\]|\\.)*"|[{}\[\]:]', text[:pos])
    for i, tok in enumerate(tokens):
        if tok in "{[":
            stack.append(None)
        elif tok in "}]":
            stack = stack[:-1]
        elif tok.startswith('"') and i + 1 < len(tokens) and tokens[i + 1] == ":" and stack:
            stack[-1] = json.loads(tok)
    return ".".join(k for k in stack if k is not None)


def read_config_json(workdir: str) -> dict:
    """workdir/config.json as written (a nested dict; keys added since keep their absence).
    A torn or hand-broken file is a ValueError naming the file, the place and the key."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: is {workdir} a ds2_jax training workdir?")
    with open(path) as f:
        text = f.read()
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        key = key_at(text, e.pos)
        raise ValueError(
            f"{path} is not valid JSON at line {e.lineno} column {e.colno}"
            f"{f' (after key {key})' if key else ''}: {e.msg}. It was cut short or edited by hand: repair it (it "
            "records the settings this workdir's checkpoints were trained with), or move the workdir away to "
            "start over"
        ) from e
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds a JSON {type(config).__name__}, not the settings of a run (an object of "
                         "sections); repair it or move the workdir away to start over")
    return config


def load_config(workdir: str) -> settings.Settings:
    """The checked Settings a workdir was trained with (see save_config); keys newer than
    its config.json take their defaults."""
    trained = read_config_json(workdir)
    try:
        return settings.from_config_dict(trained)
    except ValueError as e:
        raise ValueError(f"{os.path.join(workdir, 'config.json')}: {e}") from e


# What an evaluation sets itself; every other setting (model, features, loss, optimizer,
# ...) comes from the workdir's config.json, so the restored model is the one trained.
EVAL_SETTINGS = ("eval", "decoding", "dataset", "per_device_batch_size", "num_devices", "compile", "parallelism",
                 "keep_checkpoints", "prefetch_batches")


def differing_keys(trained: dict, given: dict) -> list[tuple[str, object, object]]:
    """(dotted key, trained value, given value) of the training settings both have that differ."""
    return [d for d in _differences(flat(trained), flat(given)) if d[0].split(".")[0] not in EVAL_SETTINGS]


def _overlay(base: dict, top: dict) -> dict:
    """base with top's values, section by section (keys only base has are kept)."""
    out = dict(base)
    for k, v in top.items():
        out[k] = _overlay(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def config_for_eval(config, workdir: str) -> settings.Settings:
    """The workdir's config.json with `config`'s EVAL_SETTINGS, checked; warns naming every
    training setting of `config` that differs from the one the checkpoints were trained with."""
    if not os.path.exists(os.path.join(workdir, "config.json")):
        log.warning("%s has no config.json: evaluating with --config as given", workdir)
        return settings.from_config_dict(config)
    trained = read_config_json(workdir)
    given = settings.to_dict(config)
    diff = differing_keys(trained, given)
    if diff:
        more = f" and {len(diff) - 12} more" if len(diff) > 12 else ""
        log.warning("eval restores with %s: %d setting(s) of --config differ and are taken from it: %s%s",
                    os.path.join(workdir, "config.json"), len(diff), _trained_vs_given(diff[:12]), more)
    # Knobs newer than the workdir keep --config's value (their default when it was trained).
    try:
        return settings.from_config_dict(_overlay(given, {k: v for k, v in trained.items() if k not in EVAL_SETTINGS}))
    except ValueError as e:  # --config was checked before: the workdir's file holds the bad value
        raise ValueError(f"{os.path.join(workdir, 'config.json')}: {e}") from e


# ----------------------------------------------------------------------------- resume

# Settings a resumed run cannot change: the checkpoints' parameter shapes and the meaning
# of their inputs (the feature statistics are per bin of this spectrogram).
FIXED_ON_RESUME = (*(f"model.{k}" for k in ("num_conv_layers", "conv_channels", "num_rnn_layers", "rnn_size", "rnn_cell",
                                            "share_rnn_weights", "bidirectional", "row_conv_context")),
                   *(f"features.{f.name}" for f in dataclasses.fields(settings.Spectrogram)))
# Settings that change how a run is driven or watched, not what it trains: never a "change".
NOT_TRAINING = ("faults.", "eval.", "decoding.", "num_train_steps", "log_every_steps", "eval_every_steps",
                "checkpoint_every_steps", "keep_checkpoints", "prefetch_batches", "input_wait_warn_fraction",
                "step_timeout_s", "compilation_cache_dir", "dataset.num_workers", "dataset.worker_buffer_size")
CHANGES_FILE = "config_changes.jsonl"  # {"step", "time", "changes": {key: [before, after]}} per resume that changed any


def flat(d: dict, prefix: str = "") -> dict:
    """{'model.rnn_size': 32, ...} of a nested settings dict, values as JSON reads them back
    (tuples as lists, so a config and its config.json compare equal)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = json.loads(json.dumps(v))
    return out


def _differences(before: dict, after: dict) -> list[tuple[str, object, object]]:
    return [(k, before[k], after[k]) for k in sorted(set(before) & set(after)) if before[k] != after[k]]


def _shown(diff) -> str:
    return ", ".join(f"{k} {a!r} -> {b!r}" for k, a, b in diff)


def _trained_vs_given(diff) -> str:
    return ", ".join(f"{k} (trained {a!r}, --config {b!r})" for k, a, b in diff)


def refuse_fixed_changes(config: settings.Settings, workdir: str) -> None:
    """Before a restore: a ValueError naming every FIXED_ON_RESUME setting `config` changes
    from the workdir's config.json (such a checkpoint would not restore: not 'damaged')."""
    if not os.path.exists(os.path.join(workdir, "config.json")):
        return
    trained = flat(settings.to_dict(load_config(workdir)))
    given = flat(settings.to_dict(config))
    fixed = [d for d in _differences(trained, given) if d[0] in FIXED_ON_RESUME]
    if fixed:
        raise ValueError(
            f"the checkpoints in {workdir} were trained with other model settings than --config: "
            f"{_trained_vs_given(fixed)}; a resumed run cannot change them. Drop those flags to resume (the "
            "workdir's config.json has the trained values), or choose another --workdir to train a new model"
        )


def record_resume_changes(config: settings.Settings, workdir: str, step: int) -> list[tuple[str, object, object]]:
    """Settings `config` changes from those the workdir's checkpoints were trained with last
    (config.json, then config_changes.jsonl up to `step`): (key, before, after), logged and
    appended to workdir/config_changes.jsonl as a change at `step`. config.json keeps the
    settings the run started with; a fresh start (step 0) writes it and forgets old changes."""
    path = os.path.join(workdir, CHANGES_FILE)
    if step == 0 or not os.path.exists(os.path.join(workdir, "config.json")):
        save_config(config, workdir)
        if os.path.exists(path):
            os.remove(path)
        return []
    records = []
    if os.path.exists(path):
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
    kept = [r for r in records if r["step"] <= step]  # changes of steps a crash undid are made again
    current = flat(settings.to_dict(load_config(workdir)))
    for r in kept:
        current.update({k: after for k, (_, after) in r["changes"].items()})
    diff = [d for d in _differences(current, flat(settings.to_dict(config))) if not d[0].startswith(NOT_TRAINING)]
    if diff:
        log.warning("settings changed at step %d (resuming %s): %s; recorded in %s (config.json keeps the settings "
                    "the run started with)", step, workdir, _shown(diff), path)
        kept.append({"step": step, "time": datetime.datetime.now().isoformat(timespec="seconds"),
                     "changes": {k: [a, b] for k, a, b in diff}})
    if kept != records:
        files.write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
    return diff
