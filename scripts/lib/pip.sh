# shellcheck shell=bash
# pip_run PIP ARGS...: runs a pip command; drops pip's harmless "is ignored: it is neither" chatter; when pip
# fails, runs it again (up to three attempts, the later ones without pip's cache). A package mirror sometimes
# hands out a truncated or corrupt file -- CI saw "THESE PACKAGES DO NOT MATCH THE HASHES" for a wheel whose
# published hash was right -- and that must not fail a set-up whose inputs are correct. A real error (a pin
# that does not exist, a conflict) fails three times and is returned, its output shown once.
pip_run() {
  local attempt rc out
  out=$(mktemp)
  for attempt in 1 2 3; do
    rc=0
    if [ "$attempt" = 1 ]; then
      "$@" >"$out" 2>&1 || rc=$?
    else
      PIP_NO_CACHE_DIR=1 "$@" >"$out" 2>&1 || rc=$?
    fi
    if [ "$rc" = 0 ]; then
      grep -v 'is ignored: it is neither' "$out" >&2 || true
      rm -f "$out"
      return 0
    fi
    if [ "$attempt" -lt 3 ]; then
      printf '[pip] attempt %s of 3 failed (last lines below); trying again without the cache\n' "$attempt" >&2
      grep -v 'is ignored: it is neither' "$out" | tail -n 4 >&2 || true
      sleep $((attempt * ${MODELFLEET_PIP_RETRY_PAUSE:-5}))
    fi
  done
  grep -v 'is ignored: it is neither' "$out" >&2 || true
  rm -f "$out"
  return "$rc"
}
