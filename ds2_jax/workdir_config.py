"""The workdir's config.json: the settings its checkpoints were trained with. Written at a
fresh start (atomically), read back for eval and transcription (a torn or hand-edited file is
one error naming the place and the key), compared on resume and overlaid for an evaluation
(config_for_eval), each setting as its settings.Role says: a resume's change to a 'fixed' one is
refused, to a 'recorded' one recorded in config_changes.jsonl, to an 'ignored' one never a change;
an evaluation takes the 'trained' ones from config.json and the 'given' ones from its --config."""

from __future__ import annotations

import datetime
import json
import logging
import os
import re

from ds2_jax import files, layout, settings

log = logging.getLogger("ds2_jax")


def save_config(config: settings.Settings, workdir: str) -> None:
    """Writes workdir/config.json (settings.to_dict of the run's Settings), so eval and
    transcription rebuild the same model. Atomic: a kill mid-write leaves the old file."""
    os.makedirs(workdir, exist_ok=True)
    files.write_text(os.path.join(workdir, layout.CONFIG), json.dumps(settings.to_dict(config), indent=2))


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
    path = os.path.join(workdir, layout.CONFIG)
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
        raise ValueError(
            f"{path} holds a JSON {type(config).__name__}, not the settings of a run (an object of "
            "sections); repair it or move the workdir away to start over"
        )
    return config


def load_config(workdir: str) -> settings.Settings:
    """The checked Settings a workdir was trained with (see save_config); keys newer than
    its config.json take their defaults."""
    trained = read_config_json(workdir)
    try:
        return settings.from_config_dict(trained)
    except ValueError as e:
        raise ValueError(f"{os.path.join(workdir, layout.CONFIG)}: {e}") from e


# ----------------------------------------------------------------------------- comparing settings


def unflat(d: dict) -> dict:
    """flat's inverse: {'model.rnn_size': 32} -> {'model': {'rnn_size': 32}}."""
    out: dict = {}
    for key, v in d.items():
        *sections, name = key.split(".")
        node = out
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = v
    return out


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


# ----------------------------------------------------------------------------- resume


def _resume_role(key: str, config: settings.Settings) -> str:
    """What a resume does with a change to `key` (settings.Role.resume): num_train_steps is
    'recorded' where it sets the learning rate (a cosine schedule with decay_steps=0)."""
    if key == "num_train_steps" and config.optimizer.schedule == "cosine" and config.optimizer.decay_steps == 0:
        return "recorded"
    return settings.roles()[key].resume


def refuse_fixed_changes(config: settings.Settings, workdir: str) -> None:
    """Before a restore: a ValueError naming every 'fixed' setting (settings.Role) `config` changes
    from the workdir's config.json (such a checkpoint would not restore: not 'damaged')."""
    if not os.path.exists(os.path.join(workdir, layout.CONFIG)):
        return
    trained = flat(settings.to_dict(load_config(workdir)))
    given = flat(settings.to_dict(config))
    fixed = [d for d in _differences(trained, given) if _resume_role(d[0], config) == "fixed"]
    if fixed:
        raise ValueError(
            f"the checkpoints in {workdir} were trained with other model settings than --config: "
            f"{_trained_vs_given(fixed)}; a resumed run cannot change them. Drop those flags to resume (the "
            "workdir's config.json has the trained values), or choose another --workdir to train a new model"
        )


def refuse_ema_toggle(config: settings.Settings, workdir: str) -> None:
    """Before a restore: a ValueError when `config` turns the weight EMA on or off against the
    workdir's checkpoints (they hold an EMA or not: the state would not restore)."""
    if not os.path.exists(os.path.join(workdir, layout.CONFIG)):
        return
    trained = load_config(workdir).optimizer.ema_decay
    if (trained > 0) != (config.optimizer.ema_decay > 0):
        raise ValueError(
            f"optimizer.ema_decay={config.optimizer.ema_decay} but the checkpoints in {workdir} were trained with "
            f"optimizer.ema_decay={trained}: a resumed run cannot turn the weight EMA "
            f"{'on' if trained == 0 else 'off'}. Keep it {'off (0)' if trained == 0 else 'on (> 0)'}, or start "
            "a new --workdir (--config.init_from=THIS_WORKDIR starts one from its weights)"
        )


def record_resume_changes(config: settings.Settings, workdir: str, step: int) -> list[tuple[str, object, object]]:
    """Settings `config` changes from those the workdir's checkpoints were trained with last
    (config.json, then config_changes.jsonl up to `step`): (key, before, after), logged and
    appended to workdir/config_changes.jsonl as a change at `step`. config.json keeps the
    settings the run started with; a fresh start (step 0) writes it and forgets old changes."""
    path = os.path.join(workdir, layout.CONFIG_CHANGES)
    if step == 0 or not os.path.exists(os.path.join(workdir, layout.CONFIG)):
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
    diff = [d for d in _differences(current, flat(settings.to_dict(config))) if _resume_role(d[0], config) != "ignored"]
    if diff:
        log.warning(
            "settings changed at step %d (resuming %s): %s; recorded in %s (config.json keeps the settings "
            "the run started with)",
            step,
            workdir,
            _shown(diff),
            path,
        )
        kept.append(
            {
                "step": step,
                "time": datetime.datetime.now().isoformat(timespec="seconds"),
                "changes": {k: [a, b] for k, a, b in diff},
            }
        )
    if kept != records:
        files.write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
    return diff


# ----------------------------------------------------------------------------- eval


def _set_by_eval(key: str) -> bool:
    """Whether an evaluation sets `key` itself (settings.Role.eval 'given'); every other setting
    (model, features, loss, optimizer, ...) comes from the workdir's config.json, so the restored
    model is the one trained. A key the schema lacks (a whole section, or a setting since removed)
    follows its section: given if all of its settings are."""
    roles = settings.roles()
    if key in roles:
        return roles[key].eval == "given"
    section = key if any(k.startswith(key + ".") for k in roles) else key.rpartition(".")[0]
    inside = [r for k, r in roles.items() if section and k.startswith(section + ".")]
    return bool(inside) and all(r.eval == "given" for r in inside)


def _trained_part(trained: dict, prefix: str = "") -> dict:
    """The settings of a config.json dict that an evaluation takes from it (not _set_by_eval)."""
    out = {}
    for k, v in trained.items():
        key = prefix + k
        if not _set_by_eval(key):
            out[k] = _trained_part(v, key + ".") if isinstance(v, dict) else v
    return out


def differing_keys(trained: dict, given: dict) -> list[tuple[str, object, object]]:
    """(dotted key, trained value, given value) of the training settings both have that differ."""
    return [
        d
        for d in _differences(flat(trained), flat(given))
        if not _set_by_eval(d[0]) and not (settings.roles()[d[0]].set_by_training and d[2] == "")
    ]


def _overlay(base: dict, top: dict) -> dict:
    """base with top's values, section by section (keys only base has are kept)."""
    out = dict(base)
    for k, v in top.items():
        out[k] = _overlay(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


DATA_SECTION = "dataset."  # the data a run was trained on: an evaluation reads it too unless told otherwise


def _data_of(trained: dict, given: dict, overrides) -> tuple[dict, list[str]]:
    """`given` with the workdir's dataset.* settings where the command line did not set them itself
    (`overrides`: the dotted keys it set), and those keys: an own-data run's eval needs no dataset flag."""
    was, now = flat(trained), flat(given)
    taken = sorted(
        k
        for k in was
        if k.startswith(DATA_SECTION) and k in now and k not in overrides and _set_by_eval(k) and was[k] != now[k]
    )
    return _overlay(given, unflat({k: was[k] for k in taken})), taken


def config_for_eval(config, workdir: str, overrides=None) -> settings.Settings:
    """The workdir's config.json with the settings an evaluation takes from `config` (_set_by_eval),
    checked; warns naming every training setting of `config` that differs from the one the
    checkpoints were trained with. With `overrides` (the keys the command line set: launch.py's
    --config.KEY=...), the dataset.* settings it did not set come from config.json too (logged)."""
    if not os.path.exists(os.path.join(workdir, layout.CONFIG)):
        log.warning("%s has no config.json: evaluating with --config as given", workdir)
        return settings.from_config_dict(config)
    trained = read_config_json(workdir)
    given = settings.to_dict(config)
    if overrides is not None:
        given, taken = _data_of(trained, given, set(overrides))
        if taken:
            was = flat(trained)
            log.info(
                "eval reads the data the run was trained on (%s): %s; set --config.dataset.KEY to read other data",
                os.path.join(workdir, layout.CONFIG),
                ", ".join(f"{k}={was[k]!r}" for k in taken),
            )
    diff = differing_keys(trained, given)
    if diff:
        more = f" and {len(diff) - 12} more" if len(diff) > 12 else ""
        log.warning(
            "eval restores with %s: %d setting(s) of --config differ and are taken from it: %s%s",
            os.path.join(workdir, layout.CONFIG),
            len(diff),
            _trained_vs_given(diff[:12]),
            more,
        )
    # Knobs newer than the workdir keep --config's value (their default when it was trained).
    try:
        return settings.from_config_dict(_overlay(given, _trained_part(trained)))
    except ValueError as e:  # --config was checked before: the workdir's file holds the bad value
        raise ValueError(f"{os.path.join(workdir, layout.CONFIG)}: {e}") from e
