"""What a rank that waited `timeout` for a batch says about the ring's
loaders: for each, its pid, what the kernel says it is doing (/proc/<pid>/stat:
running, sleeping, in disk wait, stopped by a signal or a debugger), the
slots it holds, how long it has waited for a free one, and the queue's items
it holds with its last progress. A stopped loader's items go to the others
after its stop timeout (run_loader's stop_timeout), so a wait that ends here
is usually every loader stopped, or a transform that never returns."""

import tailcut

# /proc/<pid>/stat's state letter, as a person reads it.
_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "in disk wait (uninterruptible I/O)",
    "T": "stopped by a signal (SIGSTOP, a frozen container; `kill -CONT {pid}` resumes it)",
    "t": "stopped by a debugger",
    "Z": "a zombie (exited, not yet reaped)",
    "X": "dead",
    "I": "idle",
}


def process_state(pid):
    """The kernel's state letter of `pid` ('R', 'S', 'T', ...), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')'.
    rest = stat[stat.rfind(")") + 1:].split()
    return rest[0] if rest else None


def describe_loaders(ring, queue=None):
    """One line per loader of `ring` that is alive: pid, state, slots, items."""
    items = {}
    if queue is not None:
        try:
            summary = queue.summary()
            for c in summary["clients"]:
                if c["alive"]:
                    idle = max(summary["now_ns"] - c["last_progress_ns"], 0) / 1e9
                    items[c["pid"]] = (c["open_items"], idle)
        except tailcut.Error:
            pass  # a closed queue: say what the ring knows
    lines = []
    for c in ring.stats()["clients"]:
        if c["role"] != "loader" or not c["alive"]:
            continue
        pid = c["pid"]
        state = process_state(pid)
        line = f"loader {pid} is " + (_STATES.get(state, f"in state {state}").format(pid=pid)
                                      if state else "gone")
        line += f", holds {c['acquired']} slot(s)"
        if c["waiting_seconds"] > 0:
            line += f" and has waited {c['waiting_seconds']:.1f} s for a free one"
        if pid in items:
            held, idle = items[pid]
            line += f", holds {held} item(s) of the queue, last progress {idle:.1f} s ago"
        lines.append(line)
    return lines


def timeout_error(ring, ring_name, epoch, timeout, queue=None):
    """The tailcut.TimeoutError of a rank that waited `timeout` s for a batch."""
    lines = describe_loaders(ring, queue)
    what = "; ".join(lines) if lines else "no loader process is alive"
    return tailcut.TimeoutError(
        f"PooledLoader: waited {timeout:g} s (timeout) for a batch of epoch {epoch} of batch ring "
        f"'{ring_name}': {what}. Resume or end a stopped loader, or raise timeout if a batch "
        f"takes longer to make")
