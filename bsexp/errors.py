"""User-facing errors: one line that names the key, the value and what is valid (exit code 2)."""

from __future__ import annotations

import contextlib
import difflib
import sys

# The exit codes of `python -m bsexp.train` (docs: Outputs and logging, "Exit codes"): 0 a run
# (or every point of a sweep) completed; a signal's stop 128 + its number (130 for Ctrl-C).
FAILED = 1  # a runtime failure: a crash, an out-of-memory error, a full disk, a failed sweep point
CONFIG = 2  # a configuration the user can fix, or a directory that cannot be used
DIVERGED = 3  # the training loss went non-finite (status diverged): no crash, no result


class ConfigError(Exception):
    """A configuration the user can fix. Printed as one line; the process exits with code 2."""

    def __init__(self, key: str, value: object, expected: str) -> None:
        super().__init__(f"{key}={_format_value(value)}: {expected}")
        self.key, self.value, self.expected = key, value, expected

    def __reduce__(self):  # crosses process boundaries (the finder's probe, spawned workers)
        return ConfigError, (self.key, self.value, self.expected)


def _format_value(value: object) -> str:
    if isinstance(value, str):
        return value if value and " " not in value else repr(value)
    if hasattr(value, "name") and type(value).__module__ != "builtins":  # enums
        return str(value.name)
    return str(value)


def one_line(exc: BaseException) -> str:
    """A single line describing a configuration error from bsexp, Hydra or OmegaConf."""
    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    if (inner := config_error_within(exc)) is not None:  # itself, or a resolver's (bsexp_tuned) OmegaConf wrapped
        return str(inner)
    if isinstance(exc, MissingConfigException):
        return _missing_option(exc)
    if isinstance(exc, OverrideParseException) and exc.override:
        why = " ".join(str(exc.message).split()).split(" See https://")[0]
        return (
            f"{exc.override}: not an override Hydra can read ({why}); valid: key=value, with a value "
            f"that holds '=', ',' or spaces quoted: key='value'"
        )
    cause = exc.__cause__
    if isinstance(cause, OmegaConfBaseException):
        return _omegaconf_line(cause)
    if isinstance(exc, OmegaConfBaseException):
        return _omegaconf_line(exc)
    return " ".join(str(exc).split())


def refused(exc: BaseException) -> bool:
    """Whether a run failed because bsexp refused its configuration (a ConfigError, however deep):
    the run cannot start, or go on, with these values; running it again gives the same answer."""
    return config_error_within(exc) is not None


def config_error_within(exc: BaseException) -> ConfigError | None:
    """The ConfigError an error was raised from, however deep (OmegaConf wraps a resolver's)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ConfigError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _missing_option(exc) -> str:
    missing = exc.missing_cfg_file or ""
    options = ", ".join(sorted(exc.options or []))
    if "/" in missing and options:
        group, _, name = missing.rpartition("/")
        return f"{group}={name}: unknown option; valid: {options}"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else missing
    return first + (f"; valid: {options}" if options else "")


def _omegaconf_line(exc) -> str:
    key = getattr(exc, "full_key", None) or getattr(exc, "key", None) or "?"
    message = str(getattr(exc, "msg", None) or exc).strip().splitlines()[0]
    if "not in struct" in message or (message.startswith("Key '") and "not in" in message):
        parent = key.rpartition(".")[0]
        known = _known_keys(exc)
        where = f"a key of {parent}" if parent else "a top-level key"
        hint = _elsewhere(key) or did_you_mean(key, known)
        return f"{key}: not {where}" + hint + (f"; valid: {', '.join(known)}" if known else "")
    return f"{key}: {message}"


# Where the config does have a name it lacks (the full key, or the group options that define it):
# told by bsexp.config.schema, which knows the schemas, so that this module stays below it.
_KEY_HINTS: list = []


def add_key_hint(hint) -> None:
    """Register `hint(key) -> str`: text to add to the message for an unknown key ("" if none)."""
    _KEY_HINTS.append(hint)


def _elsewhere(key: str) -> str:
    return next((text for hint in _KEY_HINTS if (text := hint(key))), "")


def did_you_mean(key: str, valid: list[str]) -> str:
    """ " (did you mean batch.size?)" for a key one typo away from a valid one of its node; else ""."""
    parent, _, name = key.rpartition(".")
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.75)
    return f" (did you mean {parent + '.' if parent else ''}{close[0]}?)" if close else ""


def _known_keys(exc) -> list[str]:
    node = getattr(exc, "parent_node", None)
    try:
        return [str(k) for k in node.keys()] if node is not None else []
    except Exception:  # a node left half-built by the failed merge
        return []


def config_errors() -> tuple[type[Exception], ...]:
    """The errors that say a configuration is wrong (bsexp's checks, Hydra's composition,
    OmegaConf's types): one line and exit code 2 wherever they reach the command line."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    return ConfigError, HydraException, OmegaConfBaseException


def to_log_file(line: str, exc: BaseException | None = None) -> None:
    """Write `line` (with `exc`'s traceback, where given) to the run's log file, `train.log` (the
    log's file handlers alone: the console has it already), so that a failed run's log says why.
    Nothing where no log file is open (an error before the job's logging is set up)."""
    import logging

    root = logging.getLogger()
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    record = root.makeRecord("bsexp", logging.ERROR, __file__, 0, line, (), exc_info)
    for handler in root.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


@contextlib.contextmanager
def exit_on_config_error():
    """Turn a configuration error into its one line on stderr (and in the run's log file) and exit
    code 2."""
    try:
        yield
    except config_errors() as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr, flush=True)
        to_log_file(f"error: {one_line(exc)}")
        sys.exit(2)
