"""Run directories: what makes a folder ours, which settings made it, and the checks before anything is replaced.

Every run directory this project creates holds a marker file, ``.agentic-rl-run`` (JSON: the kind of run and, for a
stage, its resolved settings and their fingerprint). A stage that finished leaves ``stage.json``
(:data:`FINISHED_MARKER`: its result and settings), whatever the stage. Three rules follow:

* ``--fresh`` deletes only a directory whose marker says it holds a pipeline or quickstart run (never a stage's own
  run, which its ``--overwrite`` replaces), and never the working directory, one of its parents, the home directory
  or the filesystem root (:func:`check_deletable`). Nothing writes into a run directory of another kind
  (:func:`create_run_root`, :meth:`StageRun.check`).
* A stage run into a directory that holds a finished run or checkpoints refuses unless the user asked for
  ``--resume`` (continue it) or ``--overwrite`` (replace it); a non-empty folder this project did not make is never
  written into. The check has no side effects: the stage loads its model, data and rewards first, and only then
  claims the directory (:meth:`StageRun.claim`), which is when an earlier run's outputs are removed.
* ``--resume`` continues only a run made with the same settings. Settings that may legitimately change when
  continuing a run are not compared (:data:`RESUME_FREE_KEYS`: ``resume``, ``overwrite``, ``output_dir``, how long to
  train — ``max_steps`` / ``epochs`` — and where and how often to log and save). Any other difference is an error
  that names the keys.
* A run directory may be moved or copied: a stage recorded at ``runs/a/grpo`` and found at ``runs/b/grpo`` reads
  its recorded paths under ``runs/a`` as the same paths under ``runs/b`` (:func:`moved_from`), so its stages are
  reused or resumed there, not counted as made with other settings.

Every stage goes through one :class:`StageRun`::

    run = StageRun(out, config, stage="sft")
    resume_from = run.check()      # before anything is loaded: may it run here, and from which checkpoint
    ...                            # load the model, data and rewards (a bad setting fails here, nothing written)
    run.claim()                    # an earlier run's outputs go (unless resuming); marker and config.yaml written
    try:
        ...                        # train
    except BaseException:
        run.abandon()              # no checkpoint yet: what this run wrote goes, the next run starts clean
        raise
    run.finish(result)             # stage.json: the stage finished, with its result and settings

The model a stage produced is in ``<stage>/model/`` (:data:`MODEL_FOLDER`) whatever the stage.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from collections.abc import Iterable
from contextlib import ExitStack
from pathlib import Path, PurePath
from typing import Any

from agentic_rl.errors import ConfigError
from agentic_rl.utils import RUNS_ROOT, last_checkpoint, log, output_path, read_json, warn, write_json

RUN_MARKER = ".agentic-rl-run"

#: The file a stage leaves in its run directory when it finished: its result and the settings that made it. The
#: pipeline skips a stage that has it (with the same settings); ``--resume`` / ``--overwrite`` decide about it.
FINISHED_MARKER = "stage.json"

#: The folder in a stage's run directory holding the model the stage produced (pretrain, SFT, GRPO, reward model):
#: what later stages, evaluation and export load.
MODEL_FOLDER = "model"

#: The kinds of run directory that hold other runs (what :func:`create_run_root` is called with: the pipeline, which
#: every quickstart preset runs); ``--fresh`` deletes only these, a stage's own run is replaced with that stage's
#: ``--overwrite``.
RUN_ROOT_KINDS = frozenset({"pipeline"})

#: Settings that may differ between a run and its ``--resume``: continuing for more steps, or logging and saving
#: differently, does not change what the checkpoints were trained on.
RESUME_FREE_KEYS = frozenset({"resume", "overwrite", "output_dir", "max_steps", "epochs", "report_to",
                              "logging_steps", "save_steps", "save_total_limit"})

#: Settings that never tell two runs apart (a pipeline stage re-run compares everything else).
RUN_CONTROL_KEYS = frozenset({"resume", "overwrite"})


# ---------------------------------------------------------------------------------------------------------------
# Settings and fingerprints
# ---------------------------------------------------------------------------------------------------------------

def settings_of(config: Any) -> dict[str, Any]:
    """A config dataclass (or dict) as plain JSON values, so a stored copy compares equal to a fresh one."""
    values = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    return json.loads(json.dumps(values, sort_keys=True, default=str))


def fingerprint(settings: dict[str, Any], ignore: Iterable[str] = RUN_CONTROL_KEYS) -> str:
    """A short hash of ``settings`` without the ``ignore`` keys."""
    kept = {k: v for k, v in settings.items() if k not in set(ignore)}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def differing_keys(old: dict[str, Any], new: dict[str, Any], ignore: Iterable[str] = RUN_CONTROL_KEYS,
                   moved: tuple[str, str] | None = None) -> list[str]:
    """``["seed (0 -> 1)", ...]``: the settings that differ between two runs, with both values.

    Only settings both runs have are compared: one that a newer version added (or dropped) does not make a run made
    before the upgrade "other settings". ``moved`` (:func:`moved_from`): the run directory moved since ``old`` was
    recorded; a recorded path equals a new one when it is the same path, or the same path in the moved directory.
    """
    ignore = set(ignore)
    return [f"{key} ({json.dumps(old[key], default=str)} -> {json.dumps(new[key], default=str)})"
            for key in sorted(set(old) & set(new))
            if key not in ignore and old[key] != new[key] and relocated(old[key], moved) != new[key]]


def recorded_dir(settings: dict[str, Any]) -> str | None:
    """The folder a stage wrote into, as its recorded settings name it (``output_dir``; export's ``out``)."""
    folder = settings.get("output_dir", settings.get("out"))
    return folder if isinstance(folder, str) else None


def moved_from(recorded: str | None, current: str | Path) -> tuple[str, str] | None:
    """``(where the run directory was, where it is)`` when a folder recorded at ``recorded`` is now at ``current``;
    None when it did not move. The trailing parts both paths share are taken off both (``runs/a/grpo`` now at
    ``runs/b/grpo`` gives ``runs/a``, ``runs/b``), so paths of the folder's siblings — the SFT model a GRPO stage
    started from — follow the move too."""
    if recorded is None:
        return None
    old, new = PurePath(recorded).parts, Path(current).parts
    if old == new:
        return None
    shared = 0
    while shared < min(len(old), len(new)) - 1 and old[-1 - shared] == new[-1 - shared]:
        shared += 1
    return str(PurePath(*old[:len(old) - shared])), str(PurePath(*new[:len(new) - shared]))


def relocated(value: Any, moved: tuple[str, str] | None) -> Any:
    """``value`` (a recorded setting or result: strings, lists and mappings of them) with every path under
    ``moved[0]`` read as the same path under ``moved[1]``; everything else as it is."""
    if moved is None:
        return value
    if isinstance(value, str):
        try:
            inside = PurePath(value).relative_to(moved[0])
        except ValueError:
            return value
        return str(PurePath(moved[1]) / inside)
    if isinstance(value, list):
        return [relocated(item, moved) for item in value]
    if isinstance(value, dict):
        return {key: relocated(item, moved) for key, item in value.items()}
    return value


def describe(differences: list[str], limit: int = 4) -> str:
    more = f", and {len(differences) - limit} more" if len(differences) > limit else ""
    return ", ".join(differences[:limit]) + more


# ---------------------------------------------------------------------------------------------------------------
# The marker
# ---------------------------------------------------------------------------------------------------------------

def read_marker(path: str | Path) -> dict[str, Any] | None:
    """The marker of a run directory this project created (None when there is none or it is unreadable)."""
    marker = Path(path) / RUN_MARKER
    if not marker.is_file():
        return None
    try:
        data = read_json(marker)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_marker(path: str | Path, kind: str, config: Any = None) -> None:
    data: dict[str, Any] = {"created_by": "agentic-rl", "kind": kind}
    if config is not None:
        settings = settings_of(config)
        data.update(fingerprint=fingerprint(settings), settings=settings)
    write_json(Path(path) / RUN_MARKER, data)


def create_run_root(path: str | Path, kind: str) -> Path:
    """Create a run directory (with its marker) or reuse one of ours of the same ``kind``; refuse a non-empty folder
    that is not ours, or that holds another kind of run (a stage's run: writing into it would mix the two)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"run directory {path} exists and is not a directory; choose another --output-dir / --name")
    if has_run(path):
        marker = read_marker(path)
        if marker is None:
            raise ConfigError(f"{path} is not empty and was not created by agentic-rl; choose a new or empty "
                              f"--output-dir (or --name)")
        other = (marker or {}).get("kind")
        if other and other != kind:
            raise ConfigError(f"{path} holds a {other} run, not a {kind} run; choose another --output-dir (or --name)")
        return path
    path.mkdir(parents=True, exist_ok=True)
    write_marker(path, kind)
    return path


# ---------------------------------------------------------------------------------------------------------------
# --fresh
# ---------------------------------------------------------------------------------------------------------------

def check_deletable(path: str | Path, kind: str | None = None) -> None:
    """Raise :class:`ConfigError` unless ``path`` is a run directory this project created, safe to delete whole:
    a ``kind`` run (any of :data:`RUN_ROOT_KINDS` when ``kind`` is None), never a stage's own run directory."""
    path = Path(path)
    resolved = path.resolve()
    cwd, home = Path.cwd().resolve(), Path.home().resolve()
    if (path.is_symlink() or resolved == Path(resolved.anchor) or resolved in (cwd, home)
            or resolved in cwd.parents or resolved in home.parents):
        raise ConfigError(f"--fresh refuses to delete {path} ({resolved}): it is the working directory, one of its "
                          "parents, the home directory, the filesystem root or a link; choose another --name / "
                          "--output-dir")
    if not path.is_dir():
        raise ConfigError(f"--fresh: {path} is not a directory; choose another --name / --output-dir")
    if read_marker(path) is None:
        raise ConfigError(f"--fresh refuses to delete {path}: it was not created by agentic-rl as a run directory "
                          f"(no {RUN_MARKER} in it); delete it yourself or choose another --name / --output-dir")
    other = (read_marker(path) or {}).get("kind")
    if other and (other != kind if kind else other not in RUN_ROOT_KINDS):
        raise ConfigError(f"--fresh refuses to delete {path}: it holds a {other} run, not a "
                          f"{kind or ' or '.join(sorted(RUN_ROOT_KINDS))} run; delete it yourself or choose another "
                          f"--name / --output-dir")


def delete_run_dir(path: str | Path, kind: str | None = None) -> None:
    """``--fresh``: delete a run directory after :func:`check_deletable` agreed."""
    check_deletable(path, kind)
    log(f"--fresh: removing {path}")
    shutil.rmtree(path)


def check_run_name(name: str) -> None:
    """A run name is one folder name under ``runs/``: no path separators, not ``.`` or ``..``."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or not name.isprintable():  # \n, \0, \t
        raise ConfigError(f"name {name!r} must be a plain folder name (no '/', '\\', '.' or '..'); use --output-dir "
                          "for a path")


# ---------------------------------------------------------------------------------------------------------------
# A stage's run directory
# ---------------------------------------------------------------------------------------------------------------

def stage_path(output_dir: str | None, default_name: str) -> Path:
    """The run directory a stage will use (``output_dir`` or ``runs/<default_name>``), not created yet."""
    return output_path(output_dir) if output_dir else RUNS_ROOT / default_name  # '~' expanded, bad names refused


def _checkpoint_dirs(folder: Path) -> list[Path]:
    return [p for p in folder.glob("checkpoint-*") if p.is_dir()] if folder.is_dir() else []


class StageRun:
    """One stage's run directory: :meth:`check` before anything loads, :meth:`claim` once everything has,
    :meth:`finish` at the end (see the module docstring). The ``--resume`` / ``--overwrite`` rules live here.

    ``stage``: the stage's name in :data:`agentic_rl.stages.STAGES`, which says what the stage writes (removed when
    a new run replaces an earlier one) and where its checkpoints are; ``outputs`` / ``checkpoints`` override those.
    ``config`` is the stage's resolved config; its ``resume`` / ``overwrite`` fields (when it has them) decide.
    """

    def __init__(self, out: str | Path, config: Any, *, stage: str, outputs: Iterable[str] | None = None,
                 checkpoints: str | Path | None = None) -> None:
        from agentic_rl.stages import STAGES

        record = STAGES.get(stage)
        self.out, self.config, self.stage = Path(out), config, stage
        self.outputs = tuple(outputs if outputs is not None else (record.writes if record else ()))
        if checkpoints is None and record is not None and record.checkpoints is not None:
            checkpoints = self.out / record.checkpoints
        self.checkpoints = Path(checkpoints) if checkpoints is not None else None
        self.finished_path = self.out / FINISHED_MARKER
        self.resume_from: str | None = None
        self.started = time.time()
        self.created_dir = False  # claim() made the directory (abandon() may then remove it)
        self._lock = ExitStack()  # the run directory's lock, held from claim() to finish() or abandon()

    def check(self, *, announce: bool = True) -> str | None:
        """Decide, without touching the disk, what the stage may do in its directory; returns the checkpoint to
        resume from (None: start from the beginning). A run in the way is a one-line :class:`ConfigError`.
        ``announce``: print what a resume will do (off when :meth:`claim` checks again under the lock)."""
        out, config, stage = self.out, self.config, self.stage
        resume, overwrite = bool(getattr(config, "resume", False)), bool(getattr(config, "overwrite", False))
        if resume and overwrite:
            raise ConfigError("--resume continues the run in the directory and --overwrite replaces it: choose one")
        if out.exists() and not out.is_dir():
            raise ConfigError(f"output_dir {out} exists and is not a directory; choose another --output-dir")
        if not has_run(out):
            if resume and announce:
                warn(f"--resume: {out} holds no run yet; starting from the beginning")
            return None
        marker = read_marker(out)
        is_finished = self.finished_path.is_file()
        saved = _checkpoint_dirs(self.checkpoints) if self.checkpoints is not None else []
        if marker is None:
            raise ConfigError(f"{out} is not empty and was not created by agentic-rl; choose a new or empty "
                              f"--output-dir")
        kind = marker.get("kind")
        if kind and kind != stage:
            raise ConfigError(f"{out} holds a {kind} run, not a {stage} run; choose another --output-dir")
        if resume:
            self.resume_from = self._resume_point(marker, is_finished, announce)
            return self.resume_from
        if overwrite:
            return None
        if is_finished:
            raise ConfigError(f"{out} already holds a finished {stage} run; {_choices(config, 'replace it')}")
        if saved:
            raise ConfigError(f"{out} holds checkpoints of an unfinished {stage} run; "
                              f"{_choices(config, 'start over')}")
        return None

    def _resume_point(self, marker: dict[str, Any], is_finished: bool, announce: bool) -> str | None:
        out, stage = self.out, self.stage
        stored = marker.get("settings")
        if stored is None:
            if announce:
                warn(f"--resume: {out} records no settings; cannot check that they match")
        else:
            differences = differing_keys(stored, settings_of(self.config), RESUME_FREE_KEYS,
                                         moved_from(recorded_dir(stored), out))
            if differences:
                raise ConfigError(f"--resume: {out} was trained with other settings: {describe(differences)}; resume "
                                  "with the same settings, or start a new run (--overwrite or another --output-dir)")
        checkpoint = last_checkpoint(self.checkpoints) if self.checkpoints is not None else None
        if checkpoint is None and is_finished:
            raise ConfigError(f"--resume: {out} holds a finished {stage} run but no complete checkpoint to continue "
                              "from; pass --overwrite to replace it, or choose another --output-dir")
        if announce and checkpoint is None:
            warn(f"--resume: no complete checkpoint-N in {self.checkpoints or out}; starting from the beginning")
        elif announce:
            log(f"resuming from {checkpoint}")
        return checkpoint

    def claim(self) -> Path:
        """Create the directory (if needed); unless resuming, remove an earlier run's outputs and its
        :data:`FINISHED_MARKER`; record the settings in the marker and in ``config.yaml``. Call it after the model,
        data and rewards have loaded."""
        from agentic_rl.config import save_config
        from agentic_rl.locking import hold_run_lock

        out = self.out
        self.created_dir = not out.exists()
        out.mkdir(parents=True, exist_ok=True)
        # One run per directory: a second run refuses in one line. Checked again under the lock, since another run
        # may have finished (or claimed the directory) between this run's check() and now.
        self._lock.enter_context(hold_run_lock(out, self.stage))
        try:
            self.check(announce=False)
        except BaseException:
            self._lock.close()
            raise
        resuming = self.resume_from is not None
        if not resuming:
            remove_outputs(out, (*self.outputs, FINISHED_MARKER))
        else:
            self.finished_path.unlink(missing_ok=True)  # it finishes again, with more steps
        marker = read_marker(out)
        if not resuming or not (marker or {}).get("settings"):
            write_marker(out, self.stage, self.config)
        if dataclasses.is_dataclass(self.config):
            save_config(self.config, out / "config.yaml")
        return out

    def abandon(self) -> None:
        """The stage failed after :meth:`claim`. Checkpoints it saved stay for ``--resume``, and so does everything of
        a resumed run; otherwise what this run wrote goes (its outputs, and its marker and ``config.yaml`` when
        nothing else is left beside them), and the directory too when this run created it, so that the next run
        starts as if this one had not. Nothing the run did not write is removed. The lock is released."""
        try:
            saved = _checkpoint_dirs(self.checkpoints) if self.checkpoints is not None else []
            if self.resume_from is not None or saved or not self.out.is_dir():
                return
            remove_outputs(self.out, self.outputs)
            from agentic_rl.locking import LOCK_FILE

            if {p.name for p in self.out.iterdir()} <= {RUN_MARKER, "config.yaml", LOCK_FILE}:
                remove_outputs(self.out, (RUN_MARKER, "config.yaml"))
        finally:
            self._lock.close()
        if self.created_dir and not has_run(self.out):
            shutil.rmtree(self.out, ignore_errors=True)  # at most the lock file this run created

    def finish(self, result: dict[str, Any]) -> dict[str, Any]:
        """Mark the stage finished: :data:`FINISHED_MARKER` with ``result`` (plus the wall time since this object
        was made, unless the result has one) and the settings. Returns ``result``."""
        wall = {} if "wall_time_s" in result else {"wall_time_s": round(time.time() - self.started, 1)}
        try:
            mark_finished(self.out, self.stage, {**result, **wall}, self.config)
        finally:
            self._lock.close()
        return result


def _choices(config: Any, overwrite_does: str) -> str:
    """What the user can do about a run in the way, naming only the flags this stage has (``preferences`` has
    ``--overwrite`` but no ``--resume``)."""
    flags = [f"--{name} to {does}" for name, does in (("resume", "continue it"), ("overwrite", overwrite_does))
             if hasattr(config, name)]
    if not flags:
        return "choose another --output-dir"
    return f"pass {', '.join(flags)}, or choose another --output-dir"


def remove_outputs(out: Path, patterns: Iterable[str]) -> None:
    """Remove what matches ``patterns`` (names or glob patterns) in ``out``; a link is removed, not followed."""
    for pattern in patterns:
        for path in out.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)


def mark_finished(out: str | Path, stage: str, result: dict[str, Any], config: Any = None) -> Path:
    """Write ``out``'s :data:`FINISHED_MARKER`: ``result`` (as JSON values), the ``stage`` and, with ``config``,
    its settings (what a re-run compares against)."""
    data = json.loads(json.dumps(dict(result), default=str))
    data["stage"] = stage
    if config is not None:
        data["settings"] = settings_of(config)
    return write_json(Path(out) / FINISHED_MARKER, data)


def finished_result(out: str | Path) -> dict[str, Any] | None:
    """What a finished stage recorded in ``out`` (its :data:`FINISHED_MARKER`), or None when it did not finish."""
    path = Path(out) / FINISHED_MARKER
    if not path.is_file():
        return None
    data = read_json(path)
    return data if isinstance(data, dict) else None


def stage_settings_mismatch(out: Path, config: Any) -> list[str] | None:
    """For a pipeline: the settings in which ``out``'s recorded run differs from ``config`` (everything but
    ``resume``/``overwrite`` counts); None when ``out`` records no settings."""
    stored = (read_marker(out) or {}).get("settings")
    if stored is None:
        return None
    return differing_keys(stored, settings_of(config), RUN_CONTROL_KEYS, moved_from(recorded_dir(stored), out))


def has_run(out: Path) -> bool:
    """``out`` holds something besides the lock file a run that stopped before writing anything leaves."""
    from agentic_rl.locking import LOCK_FILE

    return out.is_dir() and any(p.name != LOCK_FILE for p in out.iterdir())
