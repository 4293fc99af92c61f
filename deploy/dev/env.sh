# Shared environment of the dev scripts (sourced, not executed).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/airlock/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# librocksdb-sys builds RocksDB with both cores; bindgen finds libclang through this.
export LIBCLANG_PATH="${LIBCLANG_PATH:-$(ls -d /usr/lib/llvm-*/lib 2>/dev/null | sort -V | tail -n 1)}"
mkdir -p "$CARGO_TARGET_DIR"
