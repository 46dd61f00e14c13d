#!/usr/bin/env bash
# Install a lock file whose torch pin is a PyTorch build (torch==X+cpu): those wheels live on PyTorch's
# own index (download.pytorch.org/whl/<variant>), not on PyPI.
#
#   [TORCH_VARIANT=cpu|cu128|...] .ci/pip_install_lock.sh PYTHON LOCKFILE [pip args...]
#
# cpu (the default): first the plain install, with whatever indexes and find-links pip is configured
# with (a wheel house or a mirror that carries the CPU build: nothing leaves the machine). Only if that
# fails because torch's build is missing, the same install again with PyTorch's CPU index as an extra
# index. The order matters where that index is unreachable: pip retries it 5 times with backoff, each
# try up to --timeout seconds when the host resolves but does not answer, so it is asked only when
# the configured indexes cannot serve the lock.
# Any other variant (a CUDA build, e.g. cu128): the lock with torch==X+<variant>, from that index.
set -uo pipefail
py="$1"; lock="$2"; shift 2
variant="${TORCH_VARIANT:-cpu}"
index="${TORCH_INDEX_BASE:-https://download.pytorch.org/whl}/$variant"
log="$(mktemp)"; req="$(mktemp)"
trap 'rm -f "$log" "$req"' EXIT
torch_pin="$(grep -Eo '^torch==[^ ;#]+' "$lock" || true)"

if [ "$variant" != cpu ]; then
  [ -n "$torch_pin" ] || { echo "$lock pins no torch==...; nothing to swap for the $variant build" >&2; exit 1; }
  sed -E "s/^torch==([^+ ;#]+)(\+[A-Za-z0-9]+)?/torch==\1+$variant/" "$lock" >"$req"
  echo "installing $lock with $(grep -Eo '^torch==[^ ;#]+' "$req") from $index" >&2
  exec "$py" -m pip install -q --extra-index-url "$index" -r "$req" "$@"
fi

if "$py" -m pip install -q -r "$lock" "$@" >"$log" 2>&1; then
  cat "$log"
  exit 0
fi
if ! grep -Eq "(No matching distribution found for|satisfies the requirement) torch([=<>~! ]|$)" "$log"; then
  cat "$log" >&2
  exit 1
fi
echo "torch's CPU build (${torch_pin:-torch}) is not on the configured package indexes; retrying with --extra-index-url $index" >&2
exec "$py" -m pip install -q --extra-index-url "$index" -r "$lock" "$@"
