"""Orbax checkpoints of the (unreplicated) train state: save (asynchronous; a failed save
explained, naming its step and the free space), restore the newest that restores (a damaged
or unfinished step folder skipped and, in training, moved aside). The settings they were
trained with live in the workdir's config.json: workdir_config.py."""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import re
import time
import weakref

import jax
import numpy as np
import orbax.checkpoint as ocp

from ds2_jax import errors, layout

log = logging.getLogger("ds2_jax")


BEST_METRIC = "wer"  # what keep_best ranks by (lower is better): the in-training eval's greedy WER,
TIE_METRIC = "cer"  # then its CER (a small dev split's WERs tie often)


def _wer(metrics) -> tuple[float, float]:
    """The rank of a checkpoint's metrics, lower is better (orbax sorts by it)."""
    return float(metrics[BEST_METRIC]), float(metrics.get(TIE_METRIC, 0.0))


def manager(workdir: str, keep: int = 3, keep_best: int = 0) -> ocp.CheckpointManager:
    """A CheckpointManager over `workdir/checkpoints` keeping the newest `keep` and, with `keep_best`,
    also the `keep_best` whose metrics (saved with them: `save(..., metrics=)`) have the lowest
    WER, then CER. Orbax's own policies decide (LatestN or BestN); it deletes only after a new save is
    committed, and the metrics are part of that save, so a kill at any point loses none of them.
    Without `keep_best`, the checkpoints an earlier run kept as its best are never deleted (orbax's
    CustomSteps): a resume with keep_best_checkpoints=0 leaves them as they are."""
    from orbax.checkpoint.checkpoint_managers import preservation_policy as pp

    directory = os.path.abspath(os.path.join(workdir, layout.CHECKPOINTS))
    if not keep_best:
        kept = ranked_steps(directory)
        if not kept:
            return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))
        policy = pp.AnyPreservationPolicy([pp.LatestN(keep), pp.CustomSteps(kept)])
        return ocp.CheckpointManager(
            directory, options=ocp.CheckpointManagerOptions(create=True, preservation_policy=policy)
        )
    _quiet_unranked_saves()
    best = pp.BestN(get_metric_fn=_wer, reverse=True, n=keep_best, keep_checkpoints_without_metrics=False)
    options = ocp.CheckpointManagerOptions(  # best_fn: orbax writes the metrics and tracks the best
        create=True,
        best_fn=_wer,
        best_mode="min",
        preservation_policy=pp.AnyPreservationPolicy([pp.LatestN(keep), best]),
    )
    return ocp.CheckpointManager(directory, options=options)


def ranked_steps(directory: str) -> list[int]:
    """The steps of the checkpoints under `directory` saved with an eval's metrics (kept as the best
    by a run with keep_best_checkpoints)."""
    if not os.path.isdir(directory):
        return []
    # No step folder holds orbax's metrics item: nothing to ask orbax (whose read-only manager also
    # syncs all processes at construction, which a multi-process run must not do here).
    if not any(os.path.isdir(os.path.join(directory, n, "metrics")) for n in os.listdir(directory) if n.isdigit()):
        return []
    absl_log = logging.getLogger("absl")
    absl_log.addFilter(_drop_read_only_notes)  # orbax says at construction what read_only implies
    try:
        mgr = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(read_only=True))
    finally:
        absl_log.removeFilter(_drop_read_only_notes)
    try:
        return [step for step in mgr.all_steps() if _metrics(mgr, step) is not None]
    finally:
        mgr.close()


def _drop_read_only_notes(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return "read_only=True" not in message and "directory is read only" not in message


def _drop_unranked_warning(record: logging.LogRecord) -> bool:
    return "Requested `tracked_metric`" not in record.getMessage()


def _quiet_unranked_saves() -> None:
    """Orbax warns at every save without metrics once it tracks the best; here only the checkpoints
    of an eval carry them, by design (the others are kept as the newest), so the warning is dropped."""
    absl_logger = logging.getLogger("absl")
    if _drop_unranked_warning not in absl_logger.filters:
        absl_logger.addFilter(_drop_unranked_warning)


def best(mgr: ocp.CheckpointManager) -> tuple[int, dict] | None:
    """(step, metrics) of the checkpoint with the lowest in-training eval WER, then CER (the newest
    of equals, as orbax's BestN keeps them); None when no checkpoint has metrics."""
    scored = ranked(mgr)
    return (scored[0], _metrics(mgr, scored[0])) if scored else None


def ranked(mgr: ocp.CheckpointManager) -> list[int]:
    """The steps of the checkpoints saved with an eval's metrics, best first: lowest WER, then CER,
    then the newest of equals (as orbax's BestN keeps them)."""
    scored = [(step, m) for step in mgr.all_steps() if (m := _metrics(mgr, step)) is not None]
    return [step for step, _ in sorted(scored, key=lambda sm: (_wer(sm[1]), -sm[0]))]


def _metrics(mgr: ocp.CheckpointManager, step: int) -> dict | None:
    """The metrics saved with checkpoint `step`; None without (or unreadable: never the best)."""
    try:
        m = mgr.metrics(step)
    except Exception:  # noqa: BLE001  (a damaged file: orbax raises many types)
        return None
    return dict(m) if hasattr(m, "get") and BEST_METRIC in m else None


@contextlib.contextmanager
def managed(workdir: str, keep: int = 3, keep_best: int = 0):
    """manager(), closed on the way out: an in-flight save finishes even when an error ends the run.
    Meanwhile orbax's background threads log their errors to workdir/error.log, not the terminal:
    the failure reaches the main thread and is explained there in one line."""
    mgr = manager(workdir, keep, keep_best)
    if not keep_best and (kept := ranked_steps(mgr.directory)):
        log.info(
            "keep_best_checkpoints=0: the best checkpoints an earlier run kept (steps %s) stay untouched; "
            "--mode=eval --eval_step=best still scores the best of them",
            ", ".join(map(str, kept)),
        )
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


def save(mgr: ocp.CheckpointManager, step: int, state, wait: bool = False, metrics: dict | None = None) -> None:
    """Saves `state` (a host or single-device pytree) as checkpoint `step` (asynchronously), with
    `metrics` ({'wer': ..., 'cer': ...}) where the manager keeps the best (manager's keep_best)."""
    mgr.save(step, args=ocp.args.StandardSave(state), metrics=metrics)
    if wait:
        mgr.wait_until_finished()


def non_finite(state) -> str | None:
    """What in `state` (a pytree of host or device arrays) holds NaN or inf, in words ('3 arrays, e.g.
    params/Dense_0/kernel'); None when every floating-point entry is finite."""
    bad = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        x = np.asarray(leaf)
        if np.issubdtype(x.dtype, np.inexact) and not np.isfinite(x).all():
            bad.append(jax.tree_util.keystr(path))
    return f"{len(bad)} array{'s' if len(bad) > 1 else ''}, e.g. {bad[0]}" if bad else None


def newest_words(mgr: ocp.CheckpointManager) -> str:
    """'the newest checkpoint, step N in DIR, holds finite parameters' (or that there is none yet), for
    a message's way out: every checkpoint is finite (save_or_explain refuses others)."""
    step = mgr.latest_step()
    if step is None:
        return f"no checkpoint is in {mgr.directory} yet"
    return f"the newest checkpoint, step {step} in {mgr.directory}, holds finite parameters"


def damaged_name(step: int) -> str:
    """Where a damaged checkpoint is moved: <step>.damaged-<UTC time> (orbax ignores the name)."""
    return f"{step}.damaged-{datetime.datetime.now(datetime.timezone.utc).strftime('%Y%m%dT%H%M%S')}"


def _move_aside(mgr: ocp.CheckpointManager, step: int) -> str:
    src = os.path.join(os.fspath(mgr.directory), str(step))
    dst = os.path.join(os.fspath(mgr.directory), damaged_name(step))
    os.rename(src, dst)
    return dst


FINISHED_MARKER = "_CHECKPOINT_METADATA"  # orbax writes it when a save is committed
COMMIT_MARKER = "commit_success.txt"  # the last file of a save; where it is written in place, the only sign
COMMIT_MARKERS = (FINISHED_MARKER, COMMIT_MARKER)
SAVING = re.compile(r"(\d+)\.orbax-checkpoint-tmp")  # orbax writes step N here, then renames it N


def unfinished(mgr: ocp.CheckpointManager, step: int) -> str | None:
    """What a step folder lacks that every finished save has (None: nothing), without
    asking orbax (an empty or partial folder is a save that never finished). A marker
    counts only where another step has it (an orbax that writes none has no such rule)."""
    directory = os.fspath(mgr.directory)
    folder = os.path.join(directory, str(step))
    items = [n for n in os.listdir(folder) if os.path.isdir(os.path.join(folder, n))]
    if not items:
        return "item folder (e.g. default/): an empty or partial folder"
    for marker in COMMIT_MARKERS:
        if not os.path.isfile(os.path.join(folder, marker)) and _writes(mgr, marker, step):
            return marker
    return None


def _writes(mgr: ocp.CheckpointManager, marker: str, step: int, alone: bool = False) -> bool:
    """Whether this orbax writes `marker` into a finished save: a step other than `step` has it
    (`alone`: the answer where there is no other step to tell)."""
    directory = os.fspath(mgr.directory)
    others = [s for s in mgr.all_steps() if s != step]
    return any(os.path.isfile(os.path.join(directory, str(s), marker)) for s in others) or (alone and not others)


def being_written(mgr: ocp.CheckpointManager) -> list[int]:
    """Steps newer than the newest finished checkpoint whose save is under way (orbax's
    temporary folder, or a step folder `unfinished` names), newest first."""
    directory = os.fspath(mgr.directory)
    names = os.listdir(directory) if os.path.isdir(directory) else []
    saving = {int(m.group(1)) for n in names if (m := SAVING.match(n))}
    steps = [s for s in mgr.all_steps() if os.path.isdir(os.path.join(directory, str(s)))]
    open_steps = {s for s in steps if unfinished(mgr, s) is not None}
    newest = max((s for s in steps if s not in open_steps), default=-1)
    return sorted((s for s in saving | open_steps if s > newest), reverse=True)


SAVE_WAIT_S = 60.0  # how long eval and transcribe wait for a checkpoint a training run is writing


def wait_for_saves(mgr: ocp.CheckpointManager, wait_s: float | None = None, poll_s: float = 0.2) -> list[int]:
    """Waits, at most `wait_s` (default SAVE_WAIT_S), while a training run writes a checkpoint newer
    than the newest finished one (`being_written`); returns the steps still being written then."""
    wait_s = SAVE_WAIT_S if wait_s is None else wait_s
    pending = being_written(mgr)
    if pending:
        log.warning(
            "checkpoint %d in %s is being written by a training run now: waiting for it (at most %.0f s)",
            pending[0],
            mgr.directory,
            wait_s,
        )
    deadline = time.monotonic() + wait_s
    while pending and time.monotonic() < deadline:
        time.sleep(poll_s)
        mgr.reload()
        pending = being_written(mgr)
    return pending


def still_being_written(mgr: ocp.CheckpointManager, steps: list[int]) -> errors.CheckpointError:
    """The error for a workdir whose only checkpoints (`steps`) are still being written: never 'damaged'."""
    return errors.CheckpointError(
        f"checkpoint {steps[0]} in {mgr.directory} is being written by a training run now (or its save was cut "
        f"short), and no earlier one is finished: rerun when that run has written it (the folder is then named "
        f"{steps[0]})"
    )


DELETED_RETRIES = 3  # rereads of the step list when a checkpoint is deleted while it is read


def _gone(mgr: ocp.CheckpointManager, step: int) -> bool:
    """Whether `step`'s folder is no longer there: a training run keeping only its newest checkpoints
    (keep_checkpoints) deleted it after a newer save, while this process was reading it."""
    return not os.path.isdir(os.path.join(os.fspath(mgr.directory), str(step)))


def restore_latest(mgr: ocp.CheckpointManager, target, move_damaged: bool = False, retries: int = DELETED_RETRIES):
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
        if _gone(mgr, step) and retries > 0:  # replaced by a newer save meanwhile: read the list again
            log.info(
                "checkpoint %d in %s was replaced by a newer one while read: taking the newest", step, mgr.directory
            )
            mgr.reload()
            return restore_latest(mgr, target, move_damaged, retries - 1)
        if (missing := unfinished(mgr, step)) is not None:
            # Not handed to orbax: its failed guess at an empty folder's layout made every
            # later restore of this manager fail too (good checkpoints called damaged).
            failures.append(
                (
                    step,
                    f"never finished: no {missing} (being written by a training run now, or a save "
                    "cut short by a crash or a slow file system)",
                )
            )
            log.warning(
                "checkpoint %d in %s is unfinished, trying the previous one (%s)", step, mgr.directory, failures[-1][1]
            )
            continue
        try:
            state = mgr.restore(step, args=ocp.args.StandardRestore(target))
        except Exception as e:  # orbax raises many types for damaged files
            if _gone(mgr, step) and retries > 0:  # deleted mid-read (keep_checkpoints): not damaged, not unfinished
                log.info(
                    "checkpoint %d in %s was replaced by a newer one while read: taking the newest", step, mgr.directory
                )
                mgr.reload()
                return restore_latest(mgr, target, move_damaged, retries - 1)
            folder = os.path.join(os.fspath(mgr.directory), str(step))
            if not os.path.isfile(os.path.join(folder, COMMIT_MARKER)) and _writes(
                mgr, COMMIT_MARKER, step, alone=True
            ):
                # a save written in place, under way (an orbax that writes no commit marker never does that)
                failures.append(
                    (
                        step,
                        "never finished: no commit marker and orbax cannot read it (being written "
                        "by a training run now, or a save cut short)",
                    )
                )
                log.warning(
                    "checkpoint %d in %s is unfinished, trying the previous one (%s)",
                    step,
                    mgr.directory,
                    failures[-1][1],
                )
                continue
            failures.append((step, f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"))
            log.warning(
                "checkpoint %d in %s is damaged, trying the previous one (%s)", step, mgr.directory, failures[-1][1]
            )
            continue
        if (bad := non_finite(state)) is not None:  # saved before ds2_jax refused to: training on it is NaN
            failures.append((step, f"not finite: NaN or inf in {bad}"))
            log.warning(
                "checkpoint %d in %s is damaged, trying the previous one (%s)", step, mgr.directory, failures[-1][1]
            )
            continue
        log.info("restored checkpoint at step %d from %s", step, mgr.directory)
        if move_damaged and failures:
            for bad, _ in failures:
                log.warning(
                    "moved damaged checkpoint %d aside to %s; steps %d-%d are trained again",
                    bad,
                    _move_aside(mgr, bad),
                    step + 1,
                    bad,
                )
            mgr.reload()
        return state, step
    if not move_damaged and all(reason.startswith("never finished") for _, reason in failures):
        raise still_being_written(
            mgr, steps
        )  # eval/transcribe beside a live run: not damaged (training holds the lock)
    # Name a failure orbax saw (a model mismatch, damaged files) before a merely unfinished folder.
    newest, reason = next(f for f in failures if not f[1].startswith("never finished"))
    raise errors.CheckpointError(
        f"none of the {len(steps)} checkpoints in {mgr.directory} restores into this model (step {newest}: "
        f"{reason[:200]}). If the model or optimizer settings differ from the run that wrote them, use its "
        f"config ({os.path.join(os.path.dirname(os.fspath(mgr.directory)), layout.CONFIG)}); if the files are "
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


def save_or_explain(mgr: ocp.CheckpointManager, step: int, state, metrics: dict | None = None) -> None:
    """save(), turning a failure (disk full, permissions, an orbax error) into a clear error
    naming the step whose save failed: the previous (asynchronous) one, or this one."""
    finish_or_explain(mgr)  # orbax's save waits for the previous one anyway: its failure is its own
    if (bad := non_finite(state)) is not None:  # the step never keeps one; a resume from it would train NaN
        raise FloatingPointError(
            f"not writing checkpoint {step}: the state is not finite (NaN or inf in {bad}); {newest_words(mgr)}. "
            "Rerun with a lower optimizer.learning_rate, or check the data"
        )
    try:
        _STARTED[mgr] = step
        save(mgr, step, state, metrics=metrics)
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
