# Shared environment of the dev scripts (sourced, not executed).
# Build outputs live outside the clone so that a fresh clone reuses earlier builds (RocksDB's
# C++ alone takes minutes on two cores).
export AIRLOCK_CACHE="${AIRLOCK_CACHE:-$HOME/.cache/airlock}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$AIRLOCK_CACHE/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
mkdir -p "$CARGO_TARGET_DIR"

# RocksDB's and librdkafka's C/C++ through ccache (install-deps.sh installs it): cargo builds
# the build scripts' own dependencies once for `cargo build` and once for `cargo clippy`, so
# librocksdb-sys compiles its 10 minutes of C++ twice on a fresh machine; the second time the
# same sources and flags hit the cache.
if command -v ccache >/dev/null 2>&1 && [ -z "${AIRLOCK_NO_CCACHE:-}" ]; then
  export CCACHE_DIR="${CCACHE_DIR:-$AIRLOCK_CACHE/ccache}"
  export CC="${CC:-ccache gcc}"
  export CXX="${CXX:-ccache g++}"
  export CMAKE_C_COMPILER_LAUNCHER="${CMAKE_C_COMPILER_LAUNCHER:-ccache}"
  export CMAKE_CXX_COMPILER_LAUNCHER="${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}"
fi
