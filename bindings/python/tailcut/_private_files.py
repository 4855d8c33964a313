"""Private files in a directory others can write to (/dev/shm): every file the
pool writes there, and every one it reads back, goes through here.

/dev/shm is world-writable, so another local user may plant anything at a
name the pool uses before the job starts: a FIFO (an open() for writing
blocks until someone reads it), a file of theirs that anyone may write (what
the pool writes would then be theirs to read and change: the description
names code that loaders unpickle), or a symbolic link. fs.protected_regular
and fs.protected_fifos guard against some of this, but they may be off, so
nothing here relies on them:

* write() creates a temporary file under an unpredictable name with
  O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600, checks what it opened (a regular
  file of this user), writes, then renames it into place (or links it, when
  the first writer's file must stay). A file already at the final name that
  is not a private regular file of this user is refused, not replaced.
* read() opens with O_NOFOLLOW|O_NONBLOCK (a FIFO must not block the open),
  then fstat()s what it opened and refuses anything but a regular file of
  this user that no one else may write or read.
* remove() removes only files of this user: another user's file at one of
  the pool's names is left for its owner (and write() refuses it).

A full file system is a tailcut.NoSpaceError naming the file, the free space
and the fix, as a full /dev/shm is when a ring or queue is made; the
temporary file is removed.
"""

import errno
import os
import secrets
import stat

import tailcut

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def byte_size(n):
    """n bytes in words, as the engine writes sizes (ByteSize)."""
    if n < 1024:
        return f"{n} byte" if n == 1 else f"{n} bytes"
    u = 0
    while u + 1 < len(_UNITS) and n >> (10 * (u + 2)):
        u += 1
    unit = 1 << (10 * (u + 1))
    if n % unit == 0:
        return f"{n // unit} {_UNITS[u]}"
    return f"{n / unit:.1f} {_UNITS[u]} ({n} bytes)"


def free_space(directory):
    """The space left to this user in `directory`, in words."""
    try:
        vfs = os.statvfs(directory)
    except OSError:
        return "unknown"
    return byte_size(vfs.f_bavail * vfs.f_frsize)


def _kind(mode):
    if stat.S_ISREG(mode):
        return "a regular file"
    for test, kind in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def why_not_private(st):
    """Why a file of this stat is not one to use (None when it is a regular
    file of this user that no one else may read or write)."""
    if not stat.S_ISREG(st.st_mode):
        return f"it is {_kind(st.st_mode)}"
    if st.st_uid != os.geteuid():
        return (f"it belongs to user {st.st_uid}, not to user {os.geteuid()} "
                f"(mode {stat.S_IMODE(st.st_mode):o})")
    if st.st_mode & 0o077:
        return f"others may use it (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def refused(what, path, why, fix):
    return tailcut.PermissionDeniedError(
        f"{what} {path}: {why}: refusing to use it; {fix}")


def _remove_fix(path):
    return (f"remove it (rm -f {path}; only its owner or root can) and find out who made it: "
            f"no one else should write the files of this user's pools")


def write(path, data, what, fix, replace=True):
    """Writes the bytes `data` to `path` at once: readers see the old file or
    the new one, never a part. replace=False keeps a file already there (the
    first writer's stays) and returns False then; else True. `what` names the
    file in errors ("pool description"); `fix` is what to do when the file
    system is full. Raises PermissionDeniedError when something that is not a
    private file of this user is at `path`, NoSpaceError when the file system
    is full; leaves no temporary file either way."""
    directory = os.path.dirname(path) or "."
    # Digits, as `tailcut clean` expects of a temporary file, but not guessable.
    tmp = f"{path}.{secrets.randbelow(10 ** 18)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise refused(what, tmp, "something is already at this temporary name, which no one "
                      "should know", _remove_fix(tmp)) from None
    except OSError as e:
        raise _error(e, what, tmp, directory, len(data), fix) from None
    try:
        try:
            why = why_not_private(os.fstat(fd))
            if why is not None:  # an ACL or a file system that ignores the mode
                raise refused(what, tmp, why, f"write it in a directory of your own")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        try:
            why = why_not_private(os.lstat(path))
        except FileNotFoundError:
            why = None
        if why is not None:
            raise refused(what, path, why, _remove_fix(path))
        if replace:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
    except OSError as e:
        raise _error(e, what, path, directory, len(data), fix) from None
    finally:
        _unlink(tmp)


def _error(e, what, path, directory, size, fix):
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return tailcut.NoSpaceError(
            f"cannot write {byte_size(size)} of {what} {path}: {e.strerror} ({directory} has "
            f"{free_space(directory)} free); {fix}")
    if isinstance(e, tailcut.Error):
        return e
    return type(e)(e.errno, f"cannot write {what} {path}: {e.strerror}")


def read(path, what, fix, max_bytes):
    """The bytes of the private file at `path`, None when there is none.
    Raises PermissionDeniedError when it is not a private regular file of
    this user (a symbolic link, a FIFO, another user's, one others may
    write), naming `fix`; CorruptError when it holds more than max_bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        why = "it is a symbolic link" if e.errno == errno.ELOOP else e.strerror
        raise refused(what, path, why, fix) from None
    try:
        why = why_not_private(os.fstat(fd))
        if why is not None:
            raise refused(what, path, why, fix)
        chunks, left = [], max_bytes + 1
        while left:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise tailcut.CorruptError(f"{what} {path} holds more than {byte_size(max_bytes)}, "
                                   f"more than tailcut writes there; {fix}")
    return data


def exists(path):
    """Whether a private file of this user is at `path` (a planted one is not)."""
    try:
        return why_not_private(os.lstat(path)) is None
    except FileNotFoundError:
        return False


def remove(path):
    """Removes `path` if it is this user's (another user's file is left to its owner)."""
    try:
        if os.lstat(path).st_uid == os.geteuid():
            os.unlink(path)
    except FileNotFoundError:
        pass


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
