#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ and runs each for N seconds (default 30):
#   scripts/fuzz.sh [SECONDS] [TARGET...]
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`); without them it says so
# and exits 0, so that it can sit in a pipeline that has neither. Seeds come from the current
# formats (crates/protocol/examples/fuzz_seeds.rs); findings land in fuzz/artifacts/<target>/.
set -euo pipefail

seconds="${1:-30}"
shift || true
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz.sh: no nightly toolchain (rustup toolchain install nightly); not fuzzing"
    exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: cargo-fuzz missing (cargo install cargo-fuzz); not fuzzing"
    exit 0
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cd fuzz && cargo +nightly fuzz list)
fi

cargo run -q -p cuinterpose-protocol --example fuzz_seeds -- fuzz/seeds
(cd fuzz && cargo +nightly fuzz build)

failed=0
for target in "${targets[@]}"; do
    echo "fuzz.sh: $target for ${seconds}s"
    mkdir -p "fuzz/corpus/$target" "fuzz/seeds/$target"
    if (cd fuzz && cargo +nightly fuzz run "$target" "corpus/$target" "seeds/$target" -- \
            -max_total_time="$seconds" -rss_limit_mb=4096 -print_final_stats=1); then
        echo "fuzz.sh: $target ok"
    else
        echo "fuzz.sh: $target FAILED (see fuzz/artifacts/$target/)"
        failed=1
    fi
done
exit "$failed"
