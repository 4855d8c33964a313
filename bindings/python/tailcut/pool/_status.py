"""The pool's status for `tailcut top`: why it has the loaders it has
(autoscale decisions) and each rank's share of the global batch (balance).

Local rank 0 keeps one PoolStatus per PooledLoader and rewrites
/dev/shm/tailcut-pool.<euid>.<ring name>.status (JSON, mode 0600, replaced
atomically) when something it shows changes: when its loaders start, after
an autoscale decision, and when a balance decision changes the shares; never
per batch. It goes with the pool's other files (tailcut.pool._lifecycle.remove_pool,
`tailcut clean`). tools/pool_status.cc reads it and says so when it cannot.

The file holds:
  version    1
  pid, ring  the writer and its ring
  autoscale  (num_workers=(min, max) only) min, max, loaders now, and the last
             DECISIONS_KEPT decisions, oldest first: time (Unix seconds),
             action ("add" or "remove"), before, after (loaders), why (words)
  balance    (balance= only) records (per step, one per rank), speeds
             (records per second of compute, smoothed; 0: not measured yet),
             step (steps done when decided), time (Unix seconds)
"""

import logging
import os
import time

from tailcut.pool._description import pool_spec_path, write_json

log = logging.getLogger("tailcut.pool")

VERSION = 1
# Decisions the file keeps: `tailcut top` shows the last few, and the file
# stays small however long the job runs.
DECISIONS_KEPT = 8


def status_path(ring_name):
    """/dev/shm/tailcut-pool.<euid>.<ring name>.status, beside the description."""
    return pool_spec_path(ring_name)[:-len(".json")] + ".status"


class PoolStatus:
    """What local rank 0 publishes about one pool that autoscales, balances
    or both (a pool with neither has none). Not thread-safe: the rank's own
    iteration alone calls it."""

    def __init__(self, ring_name, autoscale, shares):
        self.ring_name = ring_name
        self.autoscale = autoscale  # _autoscale.Autoscale or None
        self.shares = shares  # _balance.Shares or None
        self._decisions_seen = 0
        self._loaders = 0
        self._balance = None  # the last balance part written
        self._write_failed = False  # said once

    def started(self, loaders):
        """The pool's loaders started (`loaders` of them): the first status."""
        self._loaders = loaders
        self._publish()

    def after_look(self):
        """After an autoscale look: publishes the decisions it made, if any."""
        made = len(self.autoscale.decisions)
        if made != self._decisions_seen:
            self._decisions_seen = made
            self._loaders = self.autoscale.decisions[-1]["loaders"]
            self._publish()

    def after_decision(self):
        """After the ranks decided the shares: publishes them if they changed."""
        if self._balance is None or self._balance["records"] != self._records():
            self._publish()

    def _records(self):
        return [units * self.shares.unit for units in self.shares.shares]

    def _publish(self):
        status = dict(version=VERSION, pid=os.getpid(), ring=self.ring_name)
        if self.autoscale is not None:
            status["autoscale"] = dict(
                min=self.autoscale.minimum, max=self.autoscale.maximum, loaders=self._loaders,
                decisions=[dict(time=d["time"], action=d["action"], after=d["loaders"],
                                before=d["loaders"] + (-d["n"] if d["action"] == "add" else d["n"]),
                                why=d["why"])
                           for d in self.autoscale.decisions[-DECISIONS_KEPT:]])
        if self.shares is not None:
            if self._balance is None or self._balance["records"] != self._records():
                self._balance = dict(records=self._records(), speeds=list(self.shares.speeds),
                                     step=self.shares.steps, time=time.time())
            status["balance"] = self._balance
        try:
            write_json(status_path(self.ring_name), status, "pool status")
        except OSError as e:  # what top shows is not worth stopping the job for
            if not self._write_failed:
                self._write_failed = True
                log.warning("tailcut.pool: cannot write the status of batch ring '%s' for "
                            "`tailcut top` (%s); the job goes on without it", self.ring_name, e)
