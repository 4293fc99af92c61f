#!/usr/bin/env bash
# Prepares the TypeScript client (clients/typescript) for its tests: its npm dependencies are
# installed once per change of clients/typescript/package-lock.json into
# $AIRLOCK_CACHE/typescript/deps-<hash> (outside the clone; `npm ci`, registry access only the
# first time), linked as the package's node_modules, and the package is compiled by tsc into
# its dist/ (skipped when the sources have not changed since the last build). node_modules and
# dist/ are ignored by git.
#
# Knobs: AIRLOCK_CACHE (default $HOME/.cache/airlock). Prints the package's directory, ready
# for `npm test` or `node --test dist/test/...` there.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=deploy/dev/env.sh
source "$here/env.sh"

pkg="$root/clients/typescript"
cache="$AIRLOCK_CACHE/typescript"
mkdir -p "$cache"
command -v node >/dev/null || { echo "typescript.sh: node (20 or later) is not installed" >&2; exit 1; }
command -v npm >/dev/null || { echo "typescript.sh: npm is not installed" >&2; exit 1; }
node_major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$node_major" -lt 20 ]; then
  echo "typescript.sh: node $(node --version) is too old; the client needs 20 or later" >&2
  exit 1
fi

# One preparation at a time (parallel test runs share the cache and the clone's dist/).
exec 9>"$cache/.lock"
flock 9

lock_hash="$(sha256sum "$pkg/package-lock.json" | cut -c1-16)"
deps="$cache/deps-$lock_hash"
if [ ! -d "$deps/node_modules" ]; then
  tmp="$(mktemp -d "$cache/.install.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  cp "$pkg/package.json" "$pkg/package-lock.json" "$tmp/"
  # --ignore-scripts: nothing of the package itself is there to build yet.
  (cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
  rm -rf "$deps"
  mv "$tmp" "$deps"
  trap - EXIT
  # Installs of other lock files unused for two weeks go (another clone may still use a
  # recent one: each links its own).
  find "$cache" -maxdepth 1 -name 'deps-*' ! -name "deps-$lock_hash" -mtime +14 \
    -exec rm -rf {} + 2>/dev/null || true
fi
touch "$deps"

# The package's node_modules is the cached one. A real directory (a manual `npm install`,
# which may not match the lock file) is moved aside, never deleted.
if [ "$(readlink "$pkg/node_modules" 2>/dev/null)" != "$deps/node_modules" ]; then
  if [ -d "$pkg/node_modules" ] && [ ! -L "$pkg/node_modules" ]; then
    aside="$pkg/node_modules.moved-$(date +%s)"
    mv "$pkg/node_modules" "$aside"
    echo "typescript.sh: moved clients/typescript/node_modules aside to $aside" >&2
  fi
  rm -f "$pkg/node_modules"
  ln -s "$deps/node_modules" "$pkg/node_modules"
fi

# Compiled again only when a source, a test, the compiler's settings or the dependencies
# changed.
sources="$(cd "$pkg" && find src test tsconfig.json package.json package-lock.json -type f -print0 \
  | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)"
if [ "$(cat "$pkg/dist/.sources" 2>/dev/null)" != "$sources" ]; then
  rm -rf "$pkg/dist"
  (cd "$pkg" && node_modules/.bin/tsc -p . >&2)
  echo "$sources" >"$pkg/dist/.sources"
fi
echo "$pkg"
