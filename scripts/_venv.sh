# Sourced by scripts/serve, scripts/test and scripts/install: make sure .venv exists and
# holds kestreld with the given extras, saying what it does (a first run takes a minute).
#
# Two steps, each announced on stderr:
#   1. the dependencies (the build's, the server's, the extras') go into .venv with pip;
#   2. kestreld itself is installed (editable) and its fast path compiled, with no build
#      environment of its own (the build's requirements are already in .venv); setup.py's
#      `kestreld:` lines show each module as it compiles, the whole log is kept in .venv.
# One stamp records which extras are installed.  Step 2 runs again only when pyproject.toml
# or setup.py changed: a new extra (scripts/install spark) installs its dependencies and
# compiles nothing.  The compile is plain unless KESTRELD_PGO=1 asks for the profile-guided
# one (the image and CI do; it trains a server between two compiles and takes longer).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KESTRELD_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
extras="${1:-}"

say() { printf 'kestreld: %s\n' "$*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  say "creating the environment in $VENV (first run only)"
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.kestreld-installed"
installed=""
built=0
if [ -f "$stamp" ] && [ ! "$ROOT/pyproject.toml" -nt "$stamp" ] && [ ! "$ROOT/setup.py" -nt "$stamp" ]; then
  installed="$(cat "$stamp")"
  built=1
fi
# The extras wanted now, plus those installed before (an install replaces them).
wanted="$(printf '%s\n' ${installed//,/ } ${extras//,/ } | sort -u | paste -sd, -)"
if [ "$built" = 0 ] || [ "$wanted" != "$installed" ]; then
  started=$SECONDS
  say "installing dependencies${wanted:+ (extras: $wanted)} into $VENV"
  # pyproject.toml's lists, read by the venv's Python (tomllib: 3.11+).
  mapfile -t requirements < <("$VENV/bin/python" - "$ROOT/pyproject.toml" "$wanted" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)
wanted = [e for e in sys.argv[2].split(",") if e]
print(*project["build-system"]["requires"], sep="\n")
print(*project["project"]["dependencies"], sep="\n")
for extra in wanted:
    print(*project["project"]["optional-dependencies"][extra], sep="\n")
PY
  )
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${requirements[@]}"
  say "dependencies ready ($((SECONDS - started)) s)"
  if [ "$built" = 0 ]; then
    started=$SECONDS
    log="$VENV/kestreld-build.log"
    say "installing kestreld from $ROOT (pip's log: $log)"
    set +e
    "$VENV/bin/python" -m pip install -v --no-build-isolation --no-deps \
      --disable-pip-version-check -e "$ROOT" 2>&1 \
      | tee "$log" | sed -un 's/^[[:space:]]*\(kestreld: \)/\1/p' >&2
    status=${PIPESTATUS[0]}
    set -e
    if [ "$status" != 0 ]; then
      tail -n 30 "$log" >&2
      say "the install failed (exit $status); the whole log is $log"
      exit "$status"
    fi
    # pip byte-compiles what it installs, but not an editable project: compiled here, a
    # server run with PYTHONDONTWRITEBYTECODE=1 (scripts/bench) does not compile its sources
    # at each start (0.3 MiB of an idle server's memory).
    "$VENV/bin/python" -m compileall -q "$ROOT/kestreld" >/dev/null
    say "kestreld installed ($((SECONDS - started)) s)"
  fi
  printf '%s' "$wanted" >"$stamp"
fi
