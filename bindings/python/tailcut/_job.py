"""tailcut._job: what names a torchrun job on this host, the same in every
rerun of its command and every restart attempt.

torchrun's run id (TORCHELASTIC_RUN_ID) names a job only when the user gave
one (--rdzv_id). Without it the id is "none", the same for every job of the
host; with --standalone it is a fresh uuid4 per invocation. MASTER_PORT names
nothing either, except under the static rendezvous (--master_port, the
default backend), where the user chose it: under c10d and --standalone
torchrun draws a free port for every run and every restart attempt, so a
name hashing it would never be found again. Elastic restarts within one
torchrun keep the run id and count up TORCHELASTIC_RESTART_COUNT.
"""

import hashlib
import os
import re
import sys

_UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def env_int(name, default):
    """$name as an int (torchrun's RANK, LOCAL_WORLD_SIZE, ...), `default` when unset or empty."""
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def safe(text):
    """`text` with every character outside [A-Za-z0-9._-] replaced by '_'."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in text)


def torchrun_job():
    """What names this torchrun job on the host; None outside torchrun. The
    run id when the user gave one (--rdzv_id); otherwise the command itself:
    the working directory, the script and its arguments and the ranks per
    node -- and, under the static rendezvous only, the master address and
    port the user chose (two jobs of one host differ in it). Never a port
    torchrun draws. Two runs of the same command in the same directory at the
    same time are one job: give each its own --rdzv_id (or queue name)."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if not run_id:
        return None
    if run_id != "none" and not _UUID4.match(run_id):
        return safe(run_id)[:80]
    script = sys.argv[0] if sys.argv and sys.argv[0] else "python"
    parts = [os.getcwd(), os.path.abspath(script), *sys.argv[1:],
             "LOCAL_WORLD_SIZE=" + os.environ.get("LOCAL_WORLD_SIZE", "")]
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":  # static rendezvous
        parts.append(f"MASTER={os.environ.get('MASTER_ADDR', '')}:"
                     f"{os.environ.get('MASTER_PORT', '')}")
    digest = hashlib.sha256("\0".join(parts).encode("utf-8", "surrogateescape")).hexdigest()
    stem = safe(os.path.splitext(os.path.basename(script))[0])[:40] or "job"
    return f"{stem}-{digest[:12]}"


def restart_count():
    """torchrun's attempt number of this run (0: its first attempt)."""
    return env_int("TORCHELASTIC_RESTART_COUNT", 0)


def default_name():
    """The queue name when none is given: 'work_queue', or under torchrun one
    per job and attempt, 'torchrun-<job>-<restart count>' (see torchrun_job),
    so that jobs of one host do not share a queue, a rerun of a job finds the
    queue its crashed run left, and an elastic restart starts a fresh one."""
    job = torchrun_job()
    if job is None:
        return "work_queue"
    return f"torchrun-{job}-{restart_count()}"


def earlier_attempts(name):
    """The names a job's earlier attempts gave what `name` (a default queue
    name 'torchrun-<job>-<n>', or a name that starts with one, such as its
    pool '<queue>.pool') names in this attempt; [] for any other name."""
    m = re.match(r"^(torchrun-.+)-(\d+)((?:\..*)?)$", name)
    if m is None:
        return []
    head, count, rest = m.group(1), int(m.group(2)), m.group(3)
    return [f"{head}-{attempt}{rest}" for attempt in range(count)]
