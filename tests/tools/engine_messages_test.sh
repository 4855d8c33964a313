#!/usr/bin/env bash
# The C++ libraries speak no language but C++'s: their messages name options
# and values as a C++ caller writes them ("unset", "on"), never Python's
# ("None", "True"), which the binding words for Python.
# Usage: engine_messages_test.sh SOURCE_DIR
set -uo pipefail
cd "$1" || exit 2
found=$(grep -rnE '"[^"]*\b(None|True|False|Python)\b[^"]*"' engine io pool global \
          --include='*.cc' --include='*.h' | grep -vE '^[^:]+:[0-9]+:\s*//')
if [[ -n $found ]]; then
  echo "messages in the C++ libraries that speak Python (say it as a C++ caller would):"
  echo "$found"
  exit 1
fi
echo "no Python words in the C++ libraries' strings"
