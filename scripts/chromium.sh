#!/usr/bin/env bash
# Make sure Debian's chromium is installed for the browser tests (tests/web), as services.sh does for
# PostgreSQL: installed only when missing, never downloaded from anywhere but Debian's archive.
#   source scripts/chromium.sh && chromium_ensure   # exports PARITY_CHROMIUM
chromium_ensure() {
  local bin
  bin="$(command -v chromium || command -v chromium-browser || true)"
  if [ -z "$bin" ]; then
    echo "chromium: missing; installing Debian's chromium package" >&2
    if [ "$(id -u)" -ne 0 ]; then echo "chromium: need root to apt-get install chromium" >&2; return 1; fi
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >&2
    bin="$(command -v chromium || true)"
    [ -n "$bin" ] || { echo "chromium: installed but not on PATH" >&2; return 1; }
  fi
  export PARITY_CHROMIUM="$bin"
  echo "chromium: $("$bin" --version 2>/dev/null | head -n 1)" >&2
}
