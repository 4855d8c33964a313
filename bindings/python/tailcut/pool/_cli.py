"""`python3 -m tailcut.pool`: adds one loader process to the pool of a
running job on this host (main), or lists the pools a loader can join."""

import argparse
import base64
import importlib
import importlib.util
import os
import pickle
import re
import signal
import sys

import tailcut
from tailcut import _core
import tailcut.pool._lifecycle as _lifecycle
from tailcut.pool._description import pool_spec_path, read_pool_spec
from tailcut.pool._loader import load
from tailcut.pool._recipe import Recipe


class _CliError(Exception):
    pass


def _load_named(text, what):
    """MODULE:NAME or FILE.py:NAME (NAME may be dotted), or 'none'."""
    if text.lower() == "none":
        return None
    where, sep, name = text.rpartition(":")
    if not sep or not where or not name:
        raise _CliError(f"--{what} {text!r}: expected MODULE:NAME, FILE.py:NAME or none")
    try:
        if where.endswith(".py") or os.sep in where:
            path = os.path.abspath(where)
            module_name = "_tailcut_pool_" + re.sub(r"\W", "_", os.path.basename(path)[:-3])
            spec = importlib.util.spec_from_file_location(module_name, path)
            if spec is None:
                raise ImportError(f"not a Python file: {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)  # as a module: its __main__ block does not run
        else:
            module = importlib.import_module(where)
        obj = module
        for part in name.split("."):
            obj = getattr(obj, part)
    except Exception as e:
        raise _CliError(f"--{what} {text!r}: {type(e).__name__}: {e}") from None
    if not callable(obj):
        raise _CliError(f"--{what} {text!r} is a {type(obj).__name__}, not a callable")
    return obj


def _job_callable(spec, key, override):
    if override is not None:
        return _load_named(override, key.replace("_", "-"))
    ref = spec["callables"].get(key)
    if ref is None:
        return None
    flag = "--" + key.replace("_", "-")
    if "error" in ref:
        raise _CliError(f"the job's {key} ({ref['describe']}) {ref['error']}: move it to a module "
                        f"the job imports, or pass {flag} MODULE:NAME or FILE.py:NAME")
    try:
        return pickle.loads(base64.b64decode(ref["pickle"]))
    except Exception as e:
        raise _CliError(f"the job's {key} ({ref['describe']}) cannot be loaded here "
                        f"({type(e).__name__}: {e}): pass {flag} MODULE:NAME or "
                        f"FILE.py:NAME") from None


def _live(ring_name):
    """(ring stats, queue summary) of a running job, or raises _CliError."""
    try:
        ring = tailcut.inspect_batch_ring(ring_name)
    except tailcut.NotFoundError:
        raise _CliError(f"batch ring '{ring_name}' does not exist: the job has ended (or "
                        f"never started); nothing to join") from None
    if not any(c["alive"] for c in ring["clients"]):
        raise _CliError(f"batch ring '{ring_name}' has no live process: the job has ended")
    if ring["closed"]:
        raise _CliError(f"batch ring '{ring_name}' is closed: the job is ending")
    return ring


def _list_pools(out):
    prefix = f"tailcut-pool.{os.geteuid()}."
    names = sorted(f[len(prefix):-5] for f in os.listdir("/dev/shm")
                   if f.startswith(prefix) and f.endswith(".json"))
    if not names:
        print("no pools on this host (a PooledLoader's local rank 0 describes its pool when it "
              "starts its loaders)", file=out)
        return
    print(f"{'RING':32s} {'QUEUE':28s} {'EPOCH':>7s} {'LOADERS':>7s} {'TRAINERS':>8s} "
          f"{'READY':>7s}  STATE", file=out)
    for name in names:
        try:
            spec = read_pool_spec(name)
            ring = _live(name)
            q = tailcut.inspect_queue(spec["queue"]["name"])
        except (tailcut.Error, _CliError, ValueError, OSError) as e:
            print(f"{name:32s} stale: {e}", file=out)
            continue
        live = [c for c in ring["clients"] if c["alive"]]
        loaders = sum(c["role"] == "loader" for c in live)
        trainers = sum(c["role"] == "trainer" for c in live)
        ready = f"{ring['ready']}/{ring['num_slots']}"
        print(f"{name:32s} {q['name']:28s} {q['epoch']:>3d}/{q['num_epochs']:<3d} {loaders:>7d} "
              f"{trainers:>8d} {ready:>7s}  {'no batch ready' if ring['ready'] == 0 else 'ok'}",
              file=out)


_EPILOG = """\
The job's local rank 0 describes its pool in /dev/shm/tailcut-pool.<uid>.<ring>.json when it
starts its loaders (PooledLoader: on the first iteration); this command reads it, opens the
job's WorkQueue and BatchRing, and loads batches as the job's own loaders do, the same batch
size and transform, until the queue's last epoch ends. The ring's name is the PooledLoader's
`name`, by default '<queue name>.pool' (--list shows the pools of this host).

The job's collate_fn/transform come with the description when they can be imported from
here (defined in a module, not in the main script, and picklable); otherwise name them with
--transform/--collate-fn/--record-transform MODULE:NAME or FILE.py:NAME (a file is loaded as
a module: its `if __name__ == "__main__":` block does not run).

Leaving: SIGTERM or Ctrl-C makes the loader publish and ack what it holds, then exit 0 (a
second one stops it at once; its items then go back to the queue and records of them may come
out twice). Exit status: 0 when the data ended, the loader left, or the job closed its ring;
1 on an error (the message says what to do); 2 on a bad command line. An exception raised
while loading (the job's dataset, collate_fn or transform, or a read) is recorded for the job,
as its own loaders' are: every rank raises it, with this loader's traceback as its cause.
"""


def main(argv=None):
    """`python3 -m tailcut.pool`: adds one loader process to a running job's pool."""
    parser = argparse.ArgumentParser(
        prog="python3 -m tailcut.pool",
        description="Add one loader process to the pool of a running job on this host: it takes "
                    "items from the job's work queue and publishes batches into its batch ring.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ring", metavar="NAME",
                        help="the job's batch ring (PooledLoader name; default '<queue>.pool')")
    parser.add_argument("--list", action="store_true",
                        help="list the pools of this host that a loader can join, and exit")
    for key, what in (("transform", "the batch transform"),
                      ("collate-fn", "the collate function (records -> batch)"),
                      ("record-transform", "the per-record transform")):
        parser.add_argument(f"--{key}", metavar="REF",
                            help=f"{what} instead of the job's: MODULE:NAME, FILE.py:NAME or none")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="do not print when the loader joins and leaves")
    args = parser.parse_args(argv)
    if args.list:
        _list_pools(sys.stdout)
        return 0
    if not args.ring:
        parser.error("--ring NAME is required (or --list)")

    def say(text):
        if not args.quiet:
            # One write per line: loaders of one host often share a terminal.
            sys.stderr.write(f"tailcut.pool: loader {os.getpid()} {text}\n")
            sys.stderr.flush()

    queue = ring = None
    try:
        spec = read_pool_spec(args.ring)
        _live(args.ring)
        qname = spec["queue"]["name"]
        try:
            summary = tailcut.inspect_queue(qname)
        except tailcut.NotFoundError:
            raise _CliError(f"the job's queue '{qname}' does not exist: the job has "
                            f"ended") from None
        if summary["done"] >= summary["total"]:
            raise _CliError(f"the job's queue '{qname}' is done: nothing left to load")
        # The job's imports, then its relative paths, as the job sees them.
        sys.path.extend(p for p in spec["sys_path"] if p not in sys.path)
        recipe = Recipe(spec["batch_size"],
                         collate_fn=_job_callable(spec, "collate_fn", args.collate_fn),
                         transform=_job_callable(spec, "transform", args.transform),
                         record_transform=_job_callable(spec, "record_transform",
                                                        args.record_transform),
                         tensors=spec["tensors"])
        try:
            os.chdir(spec["cwd"])
        except OSError as e:
            raise _CliError(f"the job's working directory {spec['cwd']!r} (from "
                            f"{pool_spec_path(args.ring)}): {e.strerror}; run this where it "
                            f"exists (the same host and mounts as the job)") from None
        queue = tailcut.WorkQueue(**spec["queue"])
        ring = _core.BatchRing(args.ring, spec["slot_bytes"], spec["num_slots"], "loader",
                               max_clients=spec["max_clients"])
        s = queue.summary()
        loaders = sum(c["alive"] and c["role"] == "loader" for c in ring.stats()["clients"])
        say(f"joined ring '{args.ring}' (queue '{qname}', epoch {s['epoch']} of "
            f"{queue.num_epochs}, {s['done']} of {s['total']} items done; {loaders} loaders "
            f"now)")
        with _lifecycle.LeaveOnSignals((signal.SIGTERM, signal.SIGINT)) as signals:
            try:
                counts = load(queue, ring, recipe, lambda: signals.signum is not None,
                              spec["poll"])
            except Exception as e:  # the job's dataset or transform: every rank raises it
                _lifecycle.report_failure(args.ring, os.getpid(), e)
                _lifecycle.print_failure(e)
                return 1
        why = {"end": "finished (no item left)", "ring closed": "stopped (the job closed its ring)"}
        if counts["stopped"] == "left":
            why["left"] = f"left on {signal.Signals(signals.signum).name}"
        say(f"{why[counts['stopped']]}: published {counts['batches']} batches, "
            f"{counts['records']} records of {counts['items']} items")
        return 0
    except KeyboardInterrupt:
        print("python3 -m tailcut.pool: interrupted; the items this loader held go back to the "
              "queue", file=sys.stderr)
        return 130
    except _CliError as e:
        print(f"python3 -m tailcut.pool: {e}", file=sys.stderr)
        return 1
    except tailcut.Error as e:
        print(f"python3 -m tailcut.pool: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        if ring is not None:
            ring.close()
        if queue is not None:
            queue.close()
