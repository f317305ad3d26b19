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

# The status page's browser test drives Debian's Chromium (tests/e2e/test_status_page.py).
# Installed here, as root, when missing; elsewhere the test is skipped (failed under CI).
ensure_chromium() {
    if command -v chromium > /dev/null; then
        return
    fi
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get > /dev/null; then
        echo "no chromium, and no root apt-get to install it: the browser test will not run" >&2
        return
    fi
    echo "installing Debian's chromium for the status page's browser test ..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium > /dev/null
}

# nftables: `scripts/cluster slow --loss-pct` drops packets with it on an emulated host.
ensure_nftables() {
    if command -v nft > /dev/null; then
        return
    fi
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get > /dev/null; then
        echo "no nftables, and no root apt-get to install it: scripts/cluster slow --loss-pct will refuse" >&2
        return
    fi
    echo "installing Debian's nftables for emulated lossy links ..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables > /dev/null
}

# Rank programs run in a bubblewrap sandbox (workers/supervisor/sandbox.py). Installed here,
# as root, when missing; elsewhere the service runs ranks unsandboxed and says so (and,
# with auth on, refuses to start unless GANGWAY_SANDBOX=preferred or off).
ensure_bubblewrap() {
    if command -v bwrap > /dev/null; then
        return
    fi
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get > /dev/null; then
        echo "no bubblewrap, and no root apt-get to install it: ranks will not be sandboxed" >&2
        return
    fi
    echo "installing Debian's bubblewrap for the rank sandbox ..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap > /dev/null
}
