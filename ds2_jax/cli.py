"""What every command line of the project shares: how it fails, logs and lists its config.

- A mistake in the command line itself (an unknown flag or config key, a value of the
  wrong type, a required flag left out, a --config file that is not there, stray
  arguments) ends the command with one line on stderr, `error: <what to change>`, and
  exit code 2, before anything is imported, compiled or written. absl commands get it
  from `run` (`parse_flags` as app.run's flags_parser, `define_config_file` for config
  flags with a default); commands whose main Python calls too from `parse_args` (flags
  of their own, nothing global). Errors found later (a
  setting's value, a file, a busy workdir) are `errors.run_explained`'s one line, exit 1.
- `setup_logging`: plain console lines (the project's INFO, everyone's warnings); the full
  log, every library's INFO with time and place, in workdir/log.txt.
- `config_listing`: --print_config, every setting with its value, type and help.
- `removing_new_workdir_on_error`: a failed run leaves no half-made workdir.

This module imports neither jax nor ds2_jax's heavy modules: a usage error costs a
fraction of a second.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import os
import re
import sys
from typing import Callable, NoReturn

from absl import app, flags

from ds2_jax import layout

USAGE_EXIT = 2  # as argparse and getopt: the command line itself is wrong


def usage_error(message: str) -> NoReturn:
    """Prints `error: message` as one line to stderr and exits with code 2."""
    print(f"error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    sys.exit(USAGE_EXIT)


def checkpoint_step(value: str | None, flag: str) -> int | str | None:
    """A checkpoint flag's value: None (the latest), a step number, or 'best' (the lowest in-training
    eval WER, state.restore_state); anything else is a usage error naming the flag."""
    if value is None or value == "best":
        return value
    if value.strip().isdigit():
        return int(value)
    usage_error(f"{flag}={value}: must be a step number (>= 0) or 'best'")


# Parsers' messages in the terms a user typed (absl's come from int(), float(), ...).
_REASONS = (
    (re.compile(r"invalid literal for int\(\)"), "expected an integer"),
    (re.compile(r"could not convert string to float"), "expected a number"),
    (re.compile(r"Non-boolean argument to boolean flag"), "expected true or false"),
)


def flag_error_message(err: flags.Error, flag_values: flags.FlagValues | None = None) -> str:
    """One line for an absl flags error."""
    fv = flags.FLAGS if flag_values is None else flag_values
    text = str(err).strip()
    missing = re.findall(r"Flag --([\w.]+) must have a value other than None", text)
    if missing:
        names = ", ".join(f"--{m}" for m in dict.fromkeys(missing))
        helps = [fv[m].help for m in dict.fromkeys(missing) if m in fv]
        what = f" ({helps[0].rstrip('.')})" if len(helps) == 1 and helps[0] else ""
        return f"{names} {'is' if len(missing) == 1 else 'are'} required{what}"
    match = re.match(r"flag (--\S+?=.*?): (.*)", text, re.S)
    if match:
        flag, reason = match.groups()
        for pattern, plain in _REASONS:
            if pattern.search(reason):
                reason = plain
                break
        else:  # a config file that raised in get_config: its last line says why
            reason = [line for line in reason.splitlines() if line.strip()][-1].strip()
        return f"{flag}: {reason}"
    return f"{text.splitlines()[0]} (--helpfull lists every flag)"


def _config_flag_names() -> list[str]:
    """The names of the command's DEFINE_config_file flags."""
    from ml_collections.config_flags.config_flags import ConfigFileFlagParser

    return [name for name in flags.FLAGS if isinstance(flags.FLAGS[name].parser, ConfigFileFlagParser)]


def _config_argument(argv: list[str], name: str) -> str | None:
    """The value given to --name in argv (the last one), else None."""
    value = None
    for i, a in enumerate(argv):
        if a.startswith(f"--{name}="):
            value = a.split("=", 1)[1]
        elif a == f"--{name}" and i + 1 < len(argv):
            value = argv[i + 1]
    return value


def missing_config_file_message(name: str, value: str) -> str | None:
    """'--config=configs/smok.py: no such file; did you mean configs/smoke.py?', or None if it exists."""
    path = value.split(":", 1)[0]
    if os.path.isfile(path):
        return None
    what = "a directory, not a config file" if os.path.isdir(path) else "no such file"
    folder = os.path.dirname(path) or "."
    try:
        candidates = [os.path.join(os.path.dirname(path), f) for f in os.listdir(folder) if f.endswith(".py")]
    except OSError:
        candidates = []
    close = difflib.get_close_matches(path, candidates, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else " (configs/*.py are the project's)"
    return f"--{name}={value}: {what}{hint}"


def unknown_config_key_message(argv: list[str], name: str, config) -> str | None:
    """'unknown config key ...' with close matches, for the first --name.KEY the config lacks."""
    known = _flat_keys(config)
    for a in argv:
        for prefix in (f"--{name}.", f"--no{name}."):
            if a.startswith(prefix):
                key = a.split("=", 1)[0][len(prefix) :]
                if key not in known:
                    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
                    hint = (
                        f"did you mean {', '.join(close)}?"
                        if close
                        else "no key is close (--print_config lists them all, ds2_jax/settings.py explains them)"
                    )
                    where = _config_argument(argv, name) or "the default config"
                    return f"unknown config key {key!r} ({a}) in {where}: {hint}"
    return None


def _load_config(argv: list[str], name: str, default: str | None = None):
    """The config --name names in argv (or its default), loaded afresh: after a failed
    override ml_collections holds none."""
    import importlib.util

    value = _config_argument(argv, name) or default or flags.FLAGS[name].default_as_str.strip("'")
    path, _, arg = value.partition(":")
    spec = importlib.util.spec_from_file_location("_ds2_config_file", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(*([arg] if arg else []))


def _flat_keys(config, prefix: str = "") -> list[str]:
    keys = []
    for k, v in config.items():
        keys.append(prefix + k)
        if hasattr(v, "items"):
            keys += _flat_keys(v, prefix + k + ".")
    return keys


def define_config_file(name: str, default: str | None, help_text: str, **kwargs):
    """config_flags.DEFINE_config_file, where an override of an unknown key is a usage error
    (with a default file, ml_collections applies sys.argv's overrides already here)."""
    from ml_collections import config_flags

    try:
        return config_flags.DEFINE_config_file(name, default, help_text, **kwargs)
    except (AttributeError, KeyError) as e:
        try:
            message = unknown_config_key_message(sys.argv, name, _load_config(sys.argv, name, default))
        except Exception:  # noqa: BLE001
            message = None
        usage_error(message or f"bad config override: {e}")


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing (app.run's flags_parser) with every mistake as one `error:` line, exit 2."""
    names = _config_flag_names()
    for name in names:  # checked first: ml_collections defers a missing file's error to first use
        value = _config_argument(argv, name)  # None: the command's default, which exists
        message = value is not None and missing_config_file_message(name, value)
        if message:
            usage_error(message)
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        usage_error(flag_error_message(e))
    except (AttributeError, KeyError) as e:  # ml_collections: an override of a key the config lacks
        for name in names:
            try:
                message = unknown_config_key_message(argv, name, _load_config(argv, name))
            except Exception:  # noqa: BLE001 - no config to compare with: the generic line below
                message = None
            if message:
                usage_error(message)
        usage_error(f"bad config override: {e}")


def run(main: Callable[[list[str]], int | None], positional: bool = False) -> None:
    """app.run(main) with `parse_flags` and `setup_logging`, main's explained errors as one
    line (errors.run_explained); stray positional arguments are a usage error unless
    `positional` (then main gets them)."""

    def checked_main(argv: list[str]):
        if len(argv) > 1 and not positional:
            usage_error(f"unexpected argument(s) {' '.join(argv[1:])} (flags are written --name=value)")
        setup_logging()  # plain console lines; a command with a workdir adds its log file
        from ds2_jax import errors

        def checked():
            try:
                return main(argv)
            except app.UsageError as e:
                usage_error(str(e))

        # An explained error is one `error: ...` line (commands with a workdir log its traceback there themselves).
        return errors.run_explained(checked, None, errors.traceback_wanted())

    app.run(checked_main, flags_parser=parse_flags)


def config_source(config_flag) -> str:
    """'configs/smoke.py --config.model.rnn_size=64 ...': the file and the overrides of a config flag."""
    from ml_collections import config_flags

    overrides = " ".join(
        f"--{config_flag.name}.{k}={v!r}" for k, v in config_flags.get_override_values(config_flag).items()
    )
    return " ".join(filter(None, [config_flags.get_config_filename(config_flag), overrides]))


def config_listing(config, source: str) -> str:
    """Every key of `config` with its value, type and help (ds2_jax/settings.py); `*` marks
    a value that differs from the default, and the last line names those keys."""
    from ds2_jax import settings

    rows = settings.describe(config)
    differ = [r for r in rows if r["value"] != r["default"]]
    lines = [f"# {source}: {len(rows)} settings; * = differs from the default (ds2_jax/settings.py)"]
    for r in rows:
        star = "*" if r in differ else " "
        default = f"  [default {r['default']!r}]" if r in differ else ""
        lines.append(f"{star} {r['key']} = {r['value']!r}  ({r['type']}){default}  {r['help']}")
    changed = ", ".join(f"{r['key']}={r['value']!r}" for r in differ) or "none"
    lines.append(f"# differ from the defaults: {changed}")
    return "\n".join(lines)


def in_flag_names(message: str, flag_of_setting: dict[str, str]) -> str:
    """`message` with each setting named by the command's own flag ('decoding.lm_path' -> '--lm')."""
    for setting, flag in sorted(flag_of_setting.items(), key=lambda kv: -len(kv[0])):
        message = re.sub(rf"(?<![\w.]){re.escape(setting)}\b", flag, message)
    return message


# ----------------------------------------------------------------------------- logging

FILE_FORMAT = "%(asctime)s %(levelname).1s %(name)s %(filename)s:%(lineno)d] %(message)s"


class ConsoleFormatter(logging.Formatter):
    """A plain line: the message (`warning: ...` / `error: ...` above INFO); no time, thread or place."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if record.levelno < logging.WARNING else f"{record.levelname.lower()}: {text}"


CONSOLE_LOGGERS = ("ds2_jax", "benchmarks")  # whose INFO lines the console shows


def _for_the_console(record: logging.LogRecord) -> bool:
    """The project's own INFO lines and anyone's warnings; other libraries' INFO (orbax's
    saves, ...) go to the log file only."""
    return record.levelno >= logging.WARNING or record.name.split(".")[0] in CONSOLE_LOGGERS


class WorkdirLog(logging.Handler):
    """Appends every record (INFO and up, every library) to workdir/log.txt with its time,
    level and place. Records before the workdir exists wait in memory: nothing creates the
    workdir but the run (a failed check leaves none behind)."""

    MAX_EARLY = 10_000
    terminal = False  # the progress bar need not clear itself for these records

    def __init__(self, workdir: str):
        super().__init__(logging.INFO)
        self.workdir = workdir
        self.setFormatter(logging.Formatter(FILE_FORMAT))
        self._file = None
        self._early: list[str] = []

    def _open(self) -> bool:
        if not os.path.isdir(self.workdir):
            return False
        # Several processes: one file each. Only asked once jax.distributed is up: asking earlier
        # would start jax's backend before the distributed service (or XLA_FLAGS) is set.
        jax = sys.modules.get("jax")
        index = jax.process_index() if jax is not None and jax.distributed.is_initialized() else 0
        self._file = open(os.path.join(self.workdir, layout.log_file(index)), "a", buffering=1)
        self._file.write(f"--- {' '.join(sys.argv)}\n")
        for line in self._early:
            self._file.write(line + "\n")
        self._early = []
        return True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
            if self._file is None and not self._open():
                if len(self._early) < self.MAX_EARLY:
                    self._early.append(line)
                return
            self._file.write(line + "\n")
        except Exception:  # noqa: BLE001 - logging must not end the run
            self.handleError(record)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        super().close()


def setup_logging(workdir: str | None = None) -> None:
    """The console shows plain lines (ds2_jax's INFO, everyone's warnings); with a workdir,
    everything at INFO (orbax's checkpoint lines too) also goes to workdir/log.txt.
    Call after absl parsed the flags (absl.app installs the console handler)."""
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.INFO)
    console = absl_logging.get_absl_handler()
    console.setFormatter(ConsoleFormatter())
    console.addFilter(_for_the_console)
    for name in CONSOLE_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)
    if workdir:
        logging.getLogger().addHandler(WorkdirLog(workdir))


@contextlib.contextmanager
def quiet_console():
    """Inside, ds2_jax's INFO lines go to the log file only (a command that prints the same
    result itself)."""
    from absl import logging as absl_logging

    def drop_info(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING

    console = absl_logging.get_absl_handler()
    console.addFilter(drop_info)
    try:
        yield
    finally:
        console.removeFilter(drop_info)


def removing_new_workdir_on_error(fn: Callable[[], object], workdir: str) -> Callable[[], object]:
    """fn, but when it raises, a workdir that did not exist before and holds no result yet
    (no checkpoint, no metrics: resilience.half_made) is removed: a failed check leaves nothing behind."""
    existed = os.path.exists(workdir)

    def wrapped():
        try:
            return fn()
        except BaseException:
            if not existed:
                from ds2_jax import resilience

                resilience.remove_half_made(workdir)
            raise

    return wrapped


def parse_args(
    argv: list[str] | None, define: Callable[[flags.FlagValues], None], doc: str, positional: str = ""
) -> tuple[flags.FlagValues, list[str]]:
    """absl flags for a command whose `main(argv)` Python code calls too (tests, the demo):
    `define(fv)` defines them on a FlagValues of their own, so nothing is global and main
    can run twice. argv: the arguments without the program name (None: sys.argv's).
    Returns the parsed flags and the positional arguments (only if `positional` names them,
    e.g. 'audio files'; then at least one is needed). A mistake is one `error:` line,
    exit 2; --help prints `doc` and the flags."""
    fv = flags.FlagValues()
    define(fv)
    args = list(sys.argv[1:] if argv is None else argv)
    if "--help" in args or "-h" in args or "--helpfull" in args:
        print(f"{doc.rstrip()}\n\nflags:\n{fv.get_help(include_special_flags=False)}")
        sys.exit(0)
    try:
        rest = fv([sys.argv[0] if sys.argv else "", *args])[1:]
    except flags.Error as e:
        usage_error(flag_error_message(e, fv))
    if rest and not positional:
        usage_error(f"unexpected argument(s) {' '.join(rest)} (flags are written --name=value)")
    if positional and not rest:
        usage_error(f"no {positional} given")
    return fv, rest
