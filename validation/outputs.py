"""Output files that survive faults: directories checked before any work, reports replaced
atomically, measurements appended as they finish, and nothing followed through a symlink."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from cost_models.errors import CpplanError


def prepare_out_dir(outdir: "str | Path", names: tuple[str, ...] = ()) -> Path:
    """Creates `outdir` if missing and proves it writable, before a command measures anything.

    Args:
        outdir: the directory the command writes into.
        names: files it will write there; none may be a directory.
    Returns:
        The directory.
    Raises:
        CpplanError: `outdir` is a file, cannot be created or written, or one of `names` is a directory.
    """
    outdir = Path(outdir)
    if outdir.exists() and not outdir.is_dir():
        raise CpplanError(f"--out {str(outdir)!r} is a file, not a directory; give a directory (created if missing).")
    try:
        outdir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=outdir):
            pass
    except OSError as err:
        raise CpplanError(
            f"--out {str(outdir)!r} cannot be written ({err.strerror}); give a directory you can write to."
        ) from None
    for name in names:
        if (outdir / name).is_dir() and not (outdir / name).is_symlink():
            raise CpplanError(
                f"{str(outdir / name)!r} is a directory where cpplan writes a file; move it away or give another --out."
            )
    return outdir


def write_atomic(path: "str | Path", data: "str | bytes") -> Path:
    """Writes a whole file through a temporary one renamed over it: readers see the old file or the
    new one, never half of one, and a symlink at `path` is replaced, not followed.

    Args:
        path: the file to (re)place.
        data: its content.
    Returns:
        `path`.
    Raises:
        CpplanError: the directory cannot be written, or `path` is a directory.
    """
    path = Path(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, 0o644)  # mkstemp makes it private; a report is as readable as any file written
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except OSError as err:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        raise CpplanError(f"cannot write {str(path)!r} ({err.strerror}); give an --out you can write to.") from None
    return path


def append_record(path: "str | Path", record: dict) -> None:
    """Appends one JSON line to `path` (created if missing), flushed to disk before returning.

    Raises:
        CpplanError: `path` is a symlink, or cannot be written.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as err:
        raise CpplanError(
            f"cannot append to {str(path)!r} ({err.strerror}); cpplan never writes through a "
            f"symlink: remove it, or give another --out."
        ) from None
    with os.fdopen(fd, "a") as f:
        f.write(json.dumps(record, allow_nan=False, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())
