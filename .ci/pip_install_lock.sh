#!/usr/bin/env bash
# Install a lock file whose torch pin is a PyTorch build (torch==X+cpu) on any machine.
#
#   [TORCH_VARIANT=cpu|cu128|...] .ci/pip_install_lock.sh PYTHON LOCKFILE [pip args...]
#
# cpu (the default) takes the first of three sources that serves torch's pin:
#   1. the configured indexes and find-links as they are (a wheel house or a mirror that carries the
#      CPU build: nothing leaves the machine);
#   2. PyTorch's CPU index as an extra index (download.pytorch.org/whl/cpu);
#   3. PyPI's default build of the same version (torch==X, no local tag): on Linux x86_64 that is the
#      CUDA build, a few GB with its nvidia-* wheels, which runs on the CPU all the same.
# Each source is asked for torch's pin alone first (pip resolves that one requirement, installs nothing: a second
# or two), then the lock is installed once from the source that has it. (Installing the whole lock from each source
# in turn took 53 s and 138 s to fail on a machine that reaches PyPI only: pip retries an unreachable index with
# backoff for every requirement.) The order matters where PyTorch's index is unreachable: it is asked only when the
# configured indexes lack the build. The last line printed says which build was taken and where from (make venv
# shows it in the install summary; it is kept in $VENV/.torch-source).
# Any other variant (a CUDA build, e.g. cu128): the lock with torch==X+<variant>, from that index.
# With --no-deps (a complete lock, such as the vLLM environment's), source 3 installs the lock without its torch
# line, then torch==X with the dependencies of that build, then the lock once more (pins torch's install moved).
#
# The installs go through uv (pinned below, installed into the venv by pip) where it can honour pip's settings: the
# configured index-url, extra-index-url, find-links, no-index and cert (SSL_CERT_FILE) are handed to it, and any
# other pip setting or pip argument (or SBI_INSTALLER=pip) keeps pip. uv fetches and unpacks in parallel and compiles
# the bytecode on every core: the lock with PyPI's CUDA torch went in in 58 s against pip's 216 s (2 cores). A
# failed uv install is tried again with pip, so the worst case is pip's time. A --dry-run is always pip's.
set -uo pipefail
py="$1"; lock="$2"; shift 2
variant="${TORCH_VARIANT:-cpu}"
index="${TORCH_INDEX_BASE:-https://download.pytorch.org/whl}/$variant"
uv_version="${SBI_UV_VERSION:-0.13.9}"
log="$(mktemp)"; req="$(mktemp)"
trap 'rm -f "$log" "$req" "$req.rest"' EXIT
torch_pin="$(grep -Eo '^torch==[^ ;#]+' "$lock" || true)"
venv_dir="$(dirname "$(dirname "$py")")"

dry_run=0; no_deps=0; uv_ok="${SBI_INSTALLER:-uv}"
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry_run=1; uv_ok=pip ;;
    --no-deps) no_deps=1 ;;
    *) uv_ok=pip ;;  # a pip argument uv might read otherwise: pip installs
  esac
done

took() {  # the summary line, also kept beside the venv (.torch-source) for make venv's summary
  if [ "$dry_run" = 1 ]; then
    echo "torch: would install from $1" >&2
    return
  fi
  local installed
  installed="$("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '?')"
  echo "torch: installed $installed from $1 (with $installer)" | tee "$venv_dir/.torch-source" >&2
}

serves_torch() {  # does this source (pip arguments) serve the lock's torch pin? Resolves that pin alone.
  [ -z "$torch_pin" ] && return 0
  "$py" -m pip install -q --dry-run --no-deps --ignore-installed "$@" "$torch_pin" >"$log" 2>&1
}

# pip's index settings as uv's arguments (line 1: the cert, line 2: the arguments); exits non-zero on a setting
# uv would not honour the same way
read -r -d '' uv_settings_py <<'PY'
import shlex, subprocess, sys
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links"}
# settings that change nothing uv does here (uv has its own timeouts, retries and output)
harmless = {"default-timeout", "timeout", "retries", "disable-pip-version-check", "progress-bar", "quiet",
            "no-cache-dir", "root-user-action", "no-color", "no-input", "cache-dir", "config-file"}
args, cert = [], ""
for line in listed.stdout.splitlines():
    key, _, value = line.partition("=")
    section, _, name = key.partition(".")
    value = value.strip().strip("'\"")
    if section not in ("global", "install", ":env:"):
        continue
    if name in flags:
        for v in value.split():
            args += [flags[name], v]
    elif name == "no-index":
        if value.lower() in ("1", "true", "yes", "on"):
            args.append("--no-index")
    elif name == "cert":
        cert = value
    elif name not in harmless:
        sys.exit(f"pip setting {key} has no uv equivalent here")
print(cert)
print(shlex.join(args))
PY

uv=""; uv_args=()
uv_setup() {  # uv and pip's index settings as its arguments; fails (pip installs) where it cannot honour them
  [ "$uv_ok" = uv ] || return 1
  local settings
  settings="$("$py" -c "$uv_settings_py" 2>"$log")" || { echo "installing with pip: $(tail -1 "$log")" >&2; return 1; }
  local cert
  cert="$(sed -n 1p <<<"$settings")"
  eval "uv_args=($(sed -n 2p <<<"$settings"))"
  [ -n "$cert" ] && export SSL_CERT_FILE="${SSL_CERT_FILE:-$cert}"
  uv="$venv_dir/bin/uv"
  [ -x "$uv" ] || "$py" -m pip install -q "uv==$uv_version" >"$log" 2>&1 \
    || { echo "installing with pip: uv==$uv_version could not be installed ($(tail -1 "$log"))" >&2; uv=""; return 1; }
  return 0
}

installer=pip
install() {  # install a requirements file (then pip arguments): with uv where it can, else (or on its failure) pip
  local file="$1"; shift
  if [ -n "$uv" ] || uv_setup; then
    if "$uv" pip install -q --python "$py" --compile-bytecode --index-strategy unsafe-best-match \
        "${uv_args[@]}" -r "$file" "$@"; then
      installer=uv; return 0
    fi
    echo "uv could not install $file; installing it with pip instead" >&2
  fi
  installer=pip
  "$py" -m pip install -q -r "$file" "$@"
}
install_req() {  # one requirement (then pip arguments), the same way
  printf '%s\n' "$1" >"$req.one"; shift
  install "$req.one" "$@"; local rc=$?
  rm -f "$req.one"; return $rc
}
pip_args=("$@")  # where uv installs, at most --no-deps (any other argument keeps pip)

if [ "$variant" != cpu ]; then
  [ -n "$torch_pin" ] || { echo "$lock pins no torch==...; nothing to swap for the $variant build" >&2; exit 1; }
  sed -E "s/^torch==([^+ ;#]+)(\+[A-Za-z0-9]+)?/torch==\1+$variant/" "$lock" >"$req"
  echo "installing $lock with $(grep -Eo '^torch==[^ ;#]+' "$req") from $index" >&2
  install "$req" --extra-index-url "$index" "${pip_args[@]}" || exit 1
  took "PyTorch's $variant index ($index)"
  exit 0
fi

# 1. the configured indexes
if serves_torch "$@"; then
  install "$lock" "${pip_args[@]}" || exit 1
  took "the configured package indexes (${torch_pin:-torch})"; exit 0
fi

# 2. PyTorch's CPU index
echo "torch's CPU build (${torch_pin}) is not on the configured package indexes; trying --extra-index-url $index" >&2
if serves_torch --retries "${TORCH_INDEX_RETRIES:-2}" --extra-index-url "$index" "$@"; then
  install "$lock" --extra-index-url "$index" "${pip_args[@]}" || exit 1
  took "PyTorch's CPU index ($index)"; exit 0
fi

# 3. PyPI's default build of the same version
sed -E "s/^torch==([^+ ;#]+)\+[A-Za-z0-9]+/torch==\1/" "$lock" >"$req"
plain="$(grep -Eo '^torch==[^ ;#]+' "$req")"
echo "PyTorch's CPU index cannot serve ${torch_pin} here either; installing $plain, the package indexes' default build (on Linux x86_64 the CUDA build: a few GB, runs on the CPU all the same)" >&2
grep -Ev '^torch==|^[[:space:]]*(#|$)' "$req" >"$req.rest" || true
if [ "$no_deps" = 1 ] && [ "$dry_run" = 0 ] && [ -s "$req.rest" ]; then
  # A complete lock installed --no-deps (the vLLM one) pins torch's CPU build and leaves out what that build
  # does not need: the default build's own dependencies (its nvidia-* wheels) come with it, then the lock again
  # puts back every pin the torch install moved (setuptools).
  install "$req.rest" "${pip_args[@]}" || exit 1
  install_req "$plain" || exit 1
  install "$req.rest" "${pip_args[@]}" || exit 1
  took "the package indexes' default build ($plain with its own dependencies; PyTorch's CPU build unavailable here)"
  exit 0
fi
install "$req" "${pip_args[@]}" || exit 1
took "the package indexes' default build ($plain; PyTorch's CPU build unavailable here)"
