#!/usr/bin/env bash
# Install a lock file whose torch pin is a PyTorch build (torch==X+cpu) on any machine.
#
#   [TORCH_VARIANT=cpu|cu128|...] .ci/pip_install_lock.sh PYTHON LOCKFILE [pip args...]
#
# cpu (the default) tries three sources in turn, stopping at the first that serves the lock:
#   1. the configured indexes and find-links as they are (a wheel house or a mirror that carries the
#      CPU build: nothing leaves the machine);
#   2. PyTorch's CPU index as an extra index (download.pytorch.org/whl/cpu);
#   3. PyPI's default build of the same version (torch==X, no local tag): on Linux x86_64 that is the
#      CUDA build, a few GB with its nvidia-* wheels, which runs on the CPU all the same.
# Only a failure to find torch's build moves on to the next source; any other failure stops.
# The order matters where PyTorch's index is unreachable: pip retries it with backoff, so it is asked
# only when the configured indexes cannot serve the lock. The last line printed says which build was
# taken and where from (make venv shows it in the install summary; it is kept in $VENV/.torch-source).
# Any other variant (a CUDA build, e.g. cu128): the lock with torch==X+<variant>, from that index.
# With --no-deps (a complete lock, such as the vLLM environment's), step 3 installs the lock without its torch
# line, then torch==X with the dependencies of that build, then the lock once more (pins torch's install moved).
set -uo pipefail
py="$1"; lock="$2"; shift 2
variant="${TORCH_VARIANT:-cpu}"
index="${TORCH_INDEX_BASE:-https://download.pytorch.org/whl}/$variant"
log="$(mktemp)"; req="$(mktemp)"
trap 'rm -f "$log" "$req"' EXIT
torch_pin="$(grep -Eo '^torch==[^ ;#]+' "$lock" || true)"
venv_dir="$(dirname "$(dirname "$py")")"

dry_run=0; no_deps=0
for arg in "$@"; do
  [ "$arg" = --dry-run ] && dry_run=1
  [ "$arg" = --no-deps ] && no_deps=1
done

took() {  # the summary line, also kept beside the venv (.torch-source) for make venv's summary
  if [ "$dry_run" = 1 ]; then
    echo "torch: would install from $1" >&2
    return
  fi
  local installed
  installed="$("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '?')"
  echo "torch: installed $installed from $1" | tee "$venv_dir/.torch-source" >&2
}

torch_missing() {  # did pip fail because no source had torch's build (or the index could not be reached)?
  grep -Eq "(No matching distribution found for|satisfies the requirement) torch([=<>~! ]|$)" "$log"
}

if [ "$variant" != cpu ]; then
  [ -n "$torch_pin" ] || { echo "$lock pins no torch==...; nothing to swap for the $variant build" >&2; exit 1; }
  sed -E "s/^torch==([^+ ;#]+)(\+[A-Za-z0-9]+)?/torch==\1+$variant/" "$lock" >"$req"
  echo "installing $lock with $(grep -Eo '^torch==[^ ;#]+' "$req") from $index" >&2
  "$py" -m pip install -q --extra-index-url "$index" -r "$req" "$@" || exit 1
  took "PyTorch's $variant index ($index)"
  exit 0
fi

# 1. the configured indexes
if "$py" -m pip install -q -r "$lock" "$@" >"$log" 2>&1; then
  cat "$log"; took "the configured package indexes (${torch_pin:-torch})"; exit 0
fi
torch_missing || { cat "$log" >&2; exit 1; }

# 2. PyTorch's CPU index
echo "torch's CPU build (${torch_pin:-torch}) is not on the configured package indexes; trying --extra-index-url $index" >&2
if "$py" -m pip install -q --retries "${TORCH_INDEX_RETRIES:-2}" --extra-index-url "$index" -r "$lock" "$@" >"$log" 2>&1; then
  cat "$log"; took "PyTorch's CPU index ($index)"; exit 0
fi
torch_missing || { cat "$log" >&2; exit 1; }

# 3. PyPI's default build of the same version
[ -n "$torch_pin" ] || { cat "$log" >&2; exit 1; }
sed -E "s/^torch==([^+ ;#]+)\+[A-Za-z0-9]+/torch==\1/" "$lock" >"$req"
plain="$(grep -Eo '^torch==[^ ;#]+' "$req")"
echo "PyTorch's CPU index cannot serve ${torch_pin} here either; installing $plain, the package indexes' default build (on Linux x86_64 the CUDA build: a few GB, runs on the CPU)" >&2
grep -Ev '^torch==|^[[:space:]]*(#|$)' "$req" >"$req.rest" || true
if [ "$no_deps" = 1 ] && [ "$dry_run" = 0 ] && [ -s "$req.rest" ]; then
  # A complete lock installed --no-deps (the vLLM one) pins torch's CPU build and leaves out what that build
  # does not need: the default build's own dependencies (its nvidia-* wheels) come with it, then the lock again
  # puts back every pin the torch install moved (setuptools).
  "$py" -m pip install -q -r "$req.rest" "$@" || exit 1
  "$py" -m pip install -q "$plain" || exit 1
  "$py" -m pip install -q -r "$req.rest" "$@" || exit 1
  rm -f "$req.rest"
  took "the package indexes' default build ($plain with its own dependencies; PyTorch's CPU build unavailable here)"
  exit 0
fi
rm -f "$req.rest"
"$py" -m pip install -q -r "$req" "$@" || exit 1
took "the package indexes' default build ($plain; PyTorch's CPU build unavailable here)"
