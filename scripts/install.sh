# Sourced by scripts/serve and scripts/test: make .venv hold this checkout's dependencies.
# Re-installs only when pyproject.toml changed since the last install (a stamp in .venv).
ensure_venv() {
    local extras="$1"
    local python="${PYTHON:-python3}"
    local stamp=".venv/.gangway-install-${extras:-base}"
    local wanted
    wanted="$(sha256sum pyproject.toml | cut -d' ' -f1)"
    if [ ! -x .venv/bin/python ]; then
        "$python" -m venv .venv
        .venv/bin/pip install --quiet --upgrade pip
    fi
    if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
        echo "installing gangway${extras:+[$extras]} into .venv (torch==2.13.0 CPU, ray 2.60.0) ..."
        .venv/bin/pip install --quiet -e ".${extras:+[$extras]}"
        echo "$wanted" > "$stamp"
    fi
}

# Debian package $2, which provides command $1, installed as root with apt-get when the
# command is missing ($3 says what it is for); elsewhere $4 says what will not work.
ensure_debian_package() {
    local command=$1 package=$2 purpose=$3 without=$4
    if command -v "$command" > /dev/null; then
        return
    fi
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get > /dev/null; then
        echo "no $package, and no root apt-get to install it: $without" >&2
        return
    fi
    echo "installing Debian's $package for $purpose ..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" > /dev/null
}

# The status page's browser test drives Debian's Chromium (tests/e2e/test_status_page.py);
# without it the test is skipped (failed under CI).
ensure_chromium() {
    ensure_debian_package chromium chromium "the status page's browser test" \
        "the browser test will not run"
}

# `scripts/cluster slow --loss-pct` drops packets on an emulated host with nftables.
ensure_nftables() {
    ensure_debian_package nft nftables "emulated lossy links" \
        "scripts/cluster slow --loss-pct will refuse"
}

# Rank programs run in a bubblewrap sandbox (workers/supervisor/sandbox.py); without it the
# service runs ranks unsandboxed and says so (and, with auth on, refuses to start unless
# GANGWAY_SANDBOX=preferred or off).
ensure_bubblewrap() {
    ensure_debian_package bwrap bubblewrap "the rank sandbox" "ranks will not be sandboxed"
}
