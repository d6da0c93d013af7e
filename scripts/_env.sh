# Shared by scripts/demo and scripts/test: make .venv and install the project into it.
# Re-running is cheap: the install is skipped while pyproject.toml is unchanged.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"

# ensure_venv [EXTRAS]: .venv with llmfabric installed (editable) with EXTRAS (default dev:
# everything the tests use). The demo asks only for `fast` (180 MB: about a minute from a
# fresh clone to a running demo), where dev brings torch, playwright and the rest (minutes,
# 2 GB); a venv installed with dev has every extra, so it serves both.
ensure_venv() {
    local extras="${1:-dev}"
    if [ ! -x "$VENV/bin/python" ]; then
        "$PY" -m venv "$VENV"
        "$VENV/bin/python" -m pip install -q --upgrade pip
    fi
    local stamp
    for stamp in "$VENV/.llmfabric-installed-dev" "$VENV/.llmfabric-installed-$extras"; do
        if [ -f "$stamp" ] && [ ! "$ROOT/pyproject.toml" -nt "$stamp" ]; then
            return 0
        fi
    done
    "$VENV/bin/python" -m pip install -q -e "$ROOT[$extras]"
    touch "$VENV/.llmfabric-installed-$extras"
}

# System packages the e2e and browser tests use; installed only when missing and we are root.
ensure_system_packages() {
    local missing=()
    command -v ip >/dev/null 2>&1 || missing+=(iproute2)
    command -v iptables >/dev/null 2>&1 || missing+=(iptables)
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    # The Postgres accounts tests start a throwaway server with initdb/pg_ctl.
    compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || command -v initdb >/dev/null 2>&1 \
        || missing+=(postgresql)
    if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing system packages: ${missing[*]}" >&2
        apt-get update -qq >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 \
            || echo "warning: could not install ${missing[*]}; tests that need them will skip" >&2
    fi
}
