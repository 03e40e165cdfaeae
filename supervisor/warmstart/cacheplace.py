"""Where the kernel caches may live, and whose they are (issue 50).

`[paths] cache_dir` is owned like the token file: the daemon uses it only when it belongs to the
daemon's user and nobody else can write it. In a shared directory with the sticky bit (a /tmp-like
one, owned by root or by that user) the daemon uses a private sub-directory of its own, `uid-<euid>/`
(0700); anywhere else the caches are refused (the launch goes on unpinned, with a journal line): a
directory another user can write lets that user steer what a root daemon deletes and where it
writes. Every directory from `/` down to it is opened one component at a time without following a
link, and must be owned by root or that user and not writable by others (unless sticky), so the
path the server is given resolves to the directories checked.

Below that, each daemon keeps its caches in a directory of its own, `daemon-<identity>/`, named by a
random identity written once into its state directory (`state_dir/identity`): two daemons that share
a `cache_dir` never walk, set aside or prune each other's fingerprints, even of the same model.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

IDENTITY_FILE = "identity"
IDENTITY = re.compile(r"[0-9a-f]{16}")
ROOT_PREFIX = "daemon-"  # a daemon's own directory under the cache base: daemon-<identity>
PRIVATE_PREFIX = "uid-"  # the private base inside a shared sticky cache_dir: uid-<euid>
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

Place = Literal["own", "private", "refused"]


class Refused(Exception):
    """The caches cannot be placed without trusting another user (or a link): why, for the journal."""


def ancestor_safe(uid: int, mode: int, euid: int) -> bool:
    """A directory on the way to the caches: nobody but root or this user can rename what is in it."""
    return uid in (0, euid) and (not mode & 0o022 or bool(mode & stat.S_ISVTX))


def judge(path: str, uid: int, mode: int, euid: int) -> tuple[Place, str]:
    """Whether `cache_dir` (owner `uid`, `mode`) is this user's own, a shared sticky directory the
    daemon makes a private sub-directory in, or neither (the reason names the fix)."""
    if uid == euid and not mode & 0o022:
        return "own", ""
    if mode & stat.S_ISVTX and uid in (0, euid):
        return "private", f"{path} is shared (mode {stat.S_IMODE(mode):04o}): the caches go to {PRIVATE_PREFIX}{euid}/"
    if uid != euid:
        return "refused", (
            f"[paths] cache_dir {path!r} is owned by uid {uid}, not by this daemon's user (uid {euid}): "
            f"`chown {euid} {path}` if it is the daemon's, or name a directory of its own"
        )
    return "refused", (
        f"[paths] cache_dir {path!r} is writable by group or others (mode {stat.S_IMODE(mode):04o}) without "
        f"the sticky bit: `chmod 700 {path}`"
    )


def _open_dir(parent: int, name: str, where: str, *, create: bool) -> int:
    """`name` in `parent` as a directory fd, never through a link; made 0700 when missing and `create`."""
    try:
        return os.open(name, O_DIR, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent)
        return _open_dir(parent, name, where, create=False)
    except OSError as err:
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:
            raise Refused(f"{where}: cannot open it: {err.strerror or err}") from None
        if stat.S_ISLNK(st.st_mode):
            raise Refused(f"{where} is a symbolic link where a directory should be: left alone") from None
        raise Refused(f"{where} is not a directory: left alone") from None


@dataclass(frozen=True)
class Base:
    """The directory the caches live in: its path (what the server is given) and an fd of it."""

    path: str
    fd: int
    place: Place
    note: str  # why a private sub-directory ("" when own)

    def close(self) -> None:
        os.close(self.fd)


def open_base(cache_dir: Path, euid: int, *, create: bool = True) -> Base:
    """Walk from `/` to `cache_dir` (the operator's links resolved once, then none followed), check
    each directory, and return the base the caches may use. Raises Refused (or FileNotFoundError when
    not `create` and a part is missing)."""
    real = os.path.realpath(cache_dir)
    fd = os.open("/", O_DIR)
    where = "/"
    try:
        parts = [p for p in real.split("/") if p]
        for i, name in enumerate(parts):
            st = os.fstat(fd)
            if not ancestor_safe(st.st_uid, st.st_mode, euid):
                raise Refused(
                    f"[paths] cache_dir {str(cache_dir)!r}: {where} (on its way) is owned by uid {st.st_uid} or "
                    f"writable by others (mode {stat.S_IMODE(st.st_mode):04o}): another user could swap what is in it"
                )
            where = "/" + "/".join(parts[: i + 1])
            nxt = _open_dir(fd, name, where, create=create)
            os.close(fd)
            fd = nxt
        st = os.fstat(fd)
        place, note = judge(real, st.st_uid, st.st_mode, euid)
        if place == "refused":
            raise Refused(note)
        if place == "private":
            sub = f"{PRIVATE_PREFIX}{euid}"
            inner = _open_dir(fd, sub, f"{real}/{sub}", create=create)
            os.close(fd)
            fd = inner
            st = os.fstat(fd)
            if st.st_uid != euid or st.st_mode & 0o077:
                raise Refused(
                    f"{real}/{sub} is not this daemon's private directory (uid {st.st_uid}, mode "
                    f"{stat.S_IMODE(st.st_mode):04o}): left alone; name a [paths] cache_dir of the daemon's own"
                )
            real = f"{real.rstrip('/')}/{sub}"
        return Base(real, fd, place, note)
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def opened(cache_dir: Path, euid: int, *, create: bool = True) -> Iterator[Base]:
    base = open_base(cache_dir, euid, create=create)
    try:
        yield base
    finally:
        base.close()


def inspect(cache_dir: Path, euid: int) -> tuple[Place, str]:
    """What a launch will make of `cache_dir`, creating nothing: ("own", ""), ("private", why) or
    ("refused", why). A part still missing is judged as the launch would make it (0700, its own)."""
    try:
        with opened(cache_dir, euid, create=False) as base:
            return base.place, base.note
    except FileNotFoundError:
        real = os.path.realpath(cache_dir)
        if not os.path.isdir(real):
            return "own", ""  # made 0700 by the launch, on the way checked so far
        st = os.stat(real)  # only the private sub-directory is missing
        return judge(real, st.st_uid, st.st_mode, euid)
    except Refused as why:
        return "refused", str(why)
    except OSError as err:
        return "refused", f"[paths] cache_dir {str(cache_dir)!r}: {err.strerror or err}"


def daemon_identity(state_dir: Path) -> str:
    """This daemon's identity among the users of a cache directory: a random id written once into
    `state_dir/identity` (kept across restarts and upgrades; a new state directory is a new daemon).
    Read without following a link; raises Refused when it cannot be read or written."""
    path = state_dir / IDENTITY_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return _new_identity(path)
    except OSError as err:
        raise Refused(f"{path}: cannot read it: {err.strerror or err} (a link is not followed)") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused(f"{path} is not a regular file")
        text = os.read(fd, 256).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    if not IDENTITY.fullmatch(text):
        raise Refused(f"{path} does not hold an identity (16 hex digits): remove it to make a new one")
    return text


def _new_identity(path: Path) -> str:
    ident = os.urandom(8).hex()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        return daemon_identity(path.parent)  # another start wrote it first
    except OSError as err:
        raise Refused(f"{path}: cannot write it: {err.strerror or err}") from None
    try:
        os.write(fd, (ident + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return ident
