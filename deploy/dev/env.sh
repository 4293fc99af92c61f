# Shared environment of the dev scripts (sourced, not executed).
# Build outputs live outside the clone so that a fresh clone reuses earlier builds (RocksDB's
# C++ alone takes minutes on two cores).
export AIRLOCK_CACHE="${AIRLOCK_CACHE:-$HOME/.cache/airlock}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$AIRLOCK_CACHE/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
mkdir -p "$CARGO_TARGET_DIR"
