#!/usr/bin/env bash
# tests/tools/cli_test.sh TAILCUT HOLD_QUEUE
#
# Drives the `tailcut` command-line tool against real queues held by
# hold_queue processes: ls, stat, stat --json, rm with and without --force,
# bad names, usage errors and help. Queue names carry this shell's pid, so
# parallel runs and other users of /dev/shm do not interfere. Exits 0 when
# every check passed; otherwise lists the failed checks and exits 1.

set -u

if [[ $# -ne 2 ]]; then
  echo "usage: $0 TAILCUT HOLD_QUEUE" >&2
  exit 2
fi
TAILCUT=$1
HOLD=$2

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tailcut_cli_test.XXXXXX")
prefix="clitest_$$"
queues=()
holder_pids=()
holder_fds=()
failures=0

cleanup() {
  local pid name
  for pid in "${holder_pids[@]}"; do
    [[ -n $pid ]] && kill -9 "$pid" 2>/dev/null
  done
  for name in "${queues[@]}"; do
    "$TAILCUT" rm --force "$name" >/dev/null 2>&1
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# run CMD...: runs it, leaving its stdout in $out, stderr in $err, status in $rc.
run() {
  "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  out=$(<"$tmp/out")
  err=$(<"$tmp/err")
}

# check_rc WANT WHAT: the last run exited with WANT.
check_rc() {
  if [[ $rc -ne $1 ]]; then
    fail "$2: exit status $rc, want $1 (stdout: '$out', stderr: '$err')"
    return 1
  fi
}

# check_match TEXT REGEX WHAT: TEXT has a line matching the extended REGEX.
check_match() {
  if ! grep -Eq -- "$2" <<<"$1"; then
    fail "$3: no line matches /$2/ in:"$'\n'"$1"
    return 1
  fi
}

check_no_match() {
  if grep -Eq -- "$2" <<<"$1"; then
    fail "$3: a line matches /$2/ in:"$'\n'"$1"
    return 1
  fi
}

# An operation error: status 1 and one "tailcut: <message>" line on stderr.
check_error() {
  check_rc 1 "$1" && check_match "$err" '^tailcut: .+' "$1: message"
}

# A usage error: status 2 and a "tailcut: " line on stderr.
check_usage_error() {
  check_rc 2 "$1" && check_match "$err" '^tailcut: .+' "$1: message"
}

# start_holder INDEX NAME [hold_queue flags...]: starts a holder of queue
# NAME with a pipe on its stdin and waits for it to be ready. Sets
# holder_pids[INDEX] and holder_fds[INDEX].
start_holder() {
  local index=$1 name=$2
  shift 2
  local fifo="$tmp/holder$index.in" fd
  mkfifo "$fifo"
  # The holder must not inherit the write ends of other holders' pipes, or
  # closing one would not reach it.
  (
    for fd in "${holder_fds[@]}"; do
      [[ -n $fd ]] && eval "exec $fd>&-"
    done
    exec "$HOLD" "$name" "$tmp/data" "$@" <"$fifo" >"$tmp/holder$index.out" 2>"$tmp/holder$index.err"
  ) &
  holder_pids[index]=$!
  exec {fd}>"$fifo"
  holder_fds[index]=$fd
  local tries
  for ((tries = 0; tries < 200; tries++)); do
    if grep -q '^ready ' "$tmp/holder$index.out" 2>/dev/null; then
      return 0
    fi
    if ! kill -0 "${holder_pids[index]}" 2>/dev/null; then
      echo "FATAL: holder $index of $name exited: $(<"$tmp/holder$index.err")" >&2
      exit 1
    fi
    sleep 0.05
  done
  echo "FATAL: holder $index of $name not ready after 10 s: $(<"$tmp/holder$index.err")" >&2
  exit 1
}

# stop_holder INDEX: closes its stdin and checks that it exits 0.
stop_holder() {
  local index=$1 fd=${holder_fds[$1]} status
  eval "exec $fd>&-"
  holder_fds[index]=
  wait "${holder_pids[index]}"
  status=$?
  holder_pids[index]=
  if [[ $status -ne 0 ]]; then
    fail "holder $index exited with $status: $(<"$tmp/holder$index.err")"
  fi
}

# kill_holder INDEX: kill -9, as a crash.
kill_holder() {
  local index=$1 fd=${holder_fds[$1]}
  kill -9 "${holder_pids[index]}"
  wait "${holder_pids[index]}" 2>/dev/null
  eval "exec $fd>&-"
  holder_fds[index]=
  holder_pids[index]=
}

# --- help, version, usage errors (no queue needed) ------------------------

run "$TAILCUT" --help
check_rc 0 "--help" && check_match "$out" '^usage: tailcut' "--help: usage line" &&
  check_match "$out" '^  (ls|stat|rm)' "--help: lists commands"
run "$TAILCUT" help
check_rc 0 "help"
for command in ls stat rm; do
  run "$TAILCUT" help "$command"
  check_rc 0 "help $command" && check_match "$out" "^usage: tailcut $command" "help $command: usage" &&
    check_match "$out" "tailcut $command" "help $command: example"
  run "$TAILCUT" "$command" --help
  check_rc 0 "$command --help" && check_match "$out" "^usage: tailcut $command" "$command --help: usage"
done
run "$TAILCUT" --version
check_rc 0 "--version" && check_match "$out" '^tailcut [0-9]+\.[0-9]+' "--version: version"

run "$TAILCUT"
check_usage_error "no command"
run "$TAILCUT" frobnicate
check_usage_error "unknown command"
run "$TAILCUT" help frobnicate
check_usage_error "help for an unknown command"
run "$TAILCUT" stat
check_usage_error "stat without a name"
run "$TAILCUT" stat a b
check_usage_error "stat with two names"
run "$TAILCUT" stat --bogus x
check_usage_error "stat with an unknown option"
run "$TAILCUT" rm
check_usage_error "rm without a name"
run "$TAILCUT" ls extra
check_usage_error "ls with an operand"
run "$TAILCUT" top
check_usage_error "top without a name"
run "$TAILCUT" --bogus
check_usage_error "an unknown option before the command"
run "$TAILCUT" stat --json
check_usage_error "stat --json without a name"
# After "--" an operand may start with '-': a name, so an operation error.
run "$TAILCUT" stat -- "-${prefix}_dash"
check_error "stat -- -NAME" && check_match "$err" "-${prefix}_dash" "stat -- -NAME names the queue"

# --- bad and missing names -------------------------------------------------

for bad in "bad/name" "" "../escape"; do
  run "$TAILCUT" stat "$bad"
  check_error "stat '$bad'"
  run "$TAILCUT" rm "$bad"
  check_error "rm '$bad'"
done
missing="${prefix}_missing"
run "$TAILCUT" stat "$missing"
check_error "stat of a missing queue" && check_match "$err" "$missing" "stat of a missing queue names it"
run "$TAILCUT" rm "$missing"
check_error "rm of a missing queue"

# --- a queue with two live clients -----------------------------------------

qa="${prefix}_a"
queues+=("$qa")
start_holder 1 "$qa" --take 3 --ack 2
start_holder 2 "$qa" --take 1 --ack 0
pid1=${holder_pids[1]}
pid2=${holder_pids[2]}

run "$TAILCUT" ls
check_rc 0 "ls" &&
  check_match "$out" '^NAME +CLIENTS +EPOCH +DONE +AGE +KEPT$' "ls: header" &&
  check_match "$out" "^$qa +2/2 +1/2 +2/[0-9]+ \([0-9.]+%\) +[0-9]+s +- *\$" "ls: two live clients, epoch 1/2, 2 done, seconds old, not kept"

run "$TAILCUT" stat "$qa"
check_rc 0 "stat" &&
  check_match "$out" "^queue +$qa\$" "stat: name" &&
  check_match "$out" '^SLOT +PID +STATE +TAKEN +ACKED +MB ACKED +ITEMS/S +IDLE% +STALE +OPEN$' "stat: client header" &&
  check_match "$out" "^ *[0-9]+ +$pid1 +alive +3 +2 +[0-9.]+ +[0-9.-]+ +[0-9.-]+ +0 +1\$" "stat: first client row" &&
  check_match "$out" "^ *[0-9]+ +$pid2 +alive +1 +0 +0\.0 +[0-9.-]+ +[0-9.-]+ +0 +1\$" "stat: second client row"

run "$TAILCUT" stat "$qa" --json
if check_rc 0 "stat --json"; then
  if ! /usr/bin/python3 -m json.tool <"$tmp/out" >/dev/null 2>"$tmp/json_err"; then
    fail "stat --json does not parse: $(<"$tmp/json_err")"$'\n'"$out"
  fi
  if ! /usr/bin/python3 - "$tmp/out" "$qa" "$pid1" "$pid2" 2>"$tmp/json_err" <<'EOF'; then
import json, sys
path, name, pid1, pid2 = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
stats = json.load(open(path))
queue_keys = {"name", "segment_path", "num_items", "num_epochs", "num_samples", "total", "done",
              "in_flight",
              "handed_out", "epoch", "seed", "shuffle", "num_clients", "clients_joined",
              "recovered_items", "stale_acks", "splits", "now_ns", "clients"}
client_keys = {"slot", "pid", "alive", "items_taken", "items_acked", "items_given_back",
               "items_recovered", "bytes_acked", "records", "stale_acks", "splits", "open_items",
               "busy_ns", "idle_ns", "last_progress_ns", "joined_ns"}
assert set(stats) == queue_keys, f"queue keys: {sorted(set(stats) ^ queue_keys)}"
assert stats["name"] == name, stats["name"]
assert stats["num_epochs"] == 2 and stats["seed"] == 7 and stats["shuffle"] is True, stats
assert stats["total"] == stats["num_items"] * 2, stats
assert stats["done"] == 2 and stats["in_flight"] == 2 and stats["clients_joined"] == 2, stats
clients = {c["pid"]: c for c in stats["clients"]}
for c in stats["clients"]:
    assert set(c) == client_keys, f"client keys: {sorted(set(c) ^ client_keys)}"
assert clients[pid1]["alive"] and clients[pid2]["alive"], clients
assert (clients[pid1]["items_taken"], clients[pid1]["items_acked"], clients[pid1]["open_items"]) == (3, 2, 1)
assert (clients[pid2]["items_taken"], clients[pid2]["items_acked"], clients[pid2]["open_items"]) == (1, 0, 1)
assert clients[pid1]["bytes_acked"] > 0
EOF
    fail "stat --json fields: $(<"$tmp/json_err")"$'\n'"$out"
  fi
fi

segment_path=$(/usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["segment_path"])' "$tmp/out" 2>/dev/null)

run "$TAILCUT" rm "$qa"
check_error "rm with live clients" &&
  check_match "$err" "$pid1" "rm refusal names the first live pid" &&
  check_match "$err" "$pid2" "rm refusal names the second live pid"
run "$TAILCUT" stat "$qa"
check_rc 0 "the refused rm left the queue in place"

# One client leaves cleanly; the other is still alive, so rm still refuses.
stop_holder 2
run "$TAILCUT" rm "$qa"
check_error "rm with one live client left" && check_match "$err" "$pid1" "rm refusal names the remaining pid"

run "$TAILCUT" rm --force "$qa"
check_rc 0 "rm --force" && check_match "$out" "$qa" "rm --force says what it removed"
run "$TAILCUT" stat "$qa"
check_error "stat after rm --force"
run "$TAILCUT" ls
check_rc 0 "ls after rm --force" && check_no_match "$out" "^$qa " "ls after rm --force no longer lists it"
# A client whose queue was removed under it still closes cleanly.
stop_holder 1

# --- a queue whose only client died ----------------------------------------

qb="${prefix}_b"
queues+=("$qb")
start_holder 3 "$qb" --take 2 --ack 1
pid3=${holder_pids[3]}
kill_holder 3

run "$TAILCUT" ls
check_rc 0 "ls with a dead client" && check_match "$out" "^$qb +0/1 " "ls: no live client of 1" &&
  check_match "$out" "^$qb .* a process of it died, so a rerun resumes it *\$" "ls: why the queue is kept"
run "$TAILCUT" stat "$qb"
check_rc 0 "stat with a dead client" && check_match "$out" "^ *[0-9]+ +$pid3 +dead " "stat: dead client row"
run "$TAILCUT" rm "$qb"
check_rc 0 "rm of a queue whose clients all died (no --force)"
run "$TAILCUT" stat "$qb"
check_error "stat after rm of a stale queue"

# --- rm -f, the short form of --force --------------------------------------

qc="${prefix}_c"
queues+=("$qc")
start_holder 4 "$qc" --take 1 --ack 0
run "$TAILCUT" rm -f "$qc"
check_rc 0 "rm -f with a live client" && check_match "$out" "$qc" "rm -f says what it removed"
run "$TAILCUT" stat "$qc"
check_error "stat after rm -f"
stop_holder 4

# --- a segment that is not a queue -----------------------------------------

# Beside a real queue's segment, under the same naming scheme.
if [[ -n $segment_path && $segment_path == *"$qa" ]]; then
  qj="${prefix}_junk"
  queues+=("$qj")
  junk_path="${segment_path%"$qa"}$qj"
  printf 'not a tailcut segment' >"$junk_path"
  run "$TAILCUT" ls
  check_rc 0 "ls with an unreadable segment" &&
    check_match "$out" "^$qj +unreadable: .+" "ls shows the unreadable segment with its problem"
  run "$TAILCUT" stat "$qj"
  check_error "stat of an unreadable segment"
  run "$TAILCUT" rm --force "$qj"
  check_rc 0 "rm --force of an unreadable segment"
  [[ -e $junk_path ]] && fail "rm --force left $junk_path"
else
  fail "stat --json segment_path '$segment_path' does not end in the queue name"
fi

if [[ $failures -ne 0 ]]; then
  echo "cli_test: $failures check(s) failed" >&2
  exit 1
fi
echo "cli_test: all checks passed"
