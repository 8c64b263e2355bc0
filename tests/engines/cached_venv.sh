# Sourced by venv_<engine>.sh: one cached venv per engine under ${FRT_ENV_CACHE:-$HOME/.cache/frt-mirror/envs},
# named <engine>-<key>, where the key hashes what the caller says it holds plus the scripts that build it.

# frt-mirror's runtime dependencies, from pyproject.toml (tomllib: python >= 3.11, which both engines need).
frt_deps() {
  "$1" - "$root/pyproject.toml" <<'PYEOF'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
PYEOF
}

# pip's noise that says nothing here: this machine's pip config names index folders that lack most
# projects (a warning per project), and --no-deps installs leave pins unmet on purpose.
quiet_pip() {
  { grep -v -e "is ignored: it is neither a file nor a directory" -e "^[a-z0-9_-]* [0-9.]* requires" \
    -e "dependency resolver does not currently take into account" || true; } >&2
}

# venv_open ENGINE KEY_MATERIAL: sets $venv and holds its lock (one creator at a time: two CI jobs on one
# cache) until the caller exits. Returns 0 when the caller must build it (created empty, $py's venv),
# 1 when a complete one is there. An interrupted build has no .complete and is redone.
venv_open() {
  local cache="${FRT_ENV_CACHE:-$HOME/.cache/frt-mirror/envs}" key
  key="$(printf '%s\n%s\n%s\n' "$2" "$(sha256sum < "$0")" "$(sha256sum < "${BASH_SOURCE[0]}")" \
    | sha256sum | cut -c1-16)"
  venv="$cache/$1-$key"
  mkdir -p "$cache"
  exec 9>"$venv.lock"
  flock 9
  [ -f "$venv/.complete" ] && return 1
  rm -rf "$venv"
  echo "venv_$1: creating $venv (cold: a few minutes)" >&2
  "$py" -m venv "$venv"
  return 0
}
