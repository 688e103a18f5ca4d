#!/usr/bin/env bash
# make fuzz: builds the libFuzzer binaries (clang, the `fuzz` preset) and runs
# each target for FUZZ_SECONDS, starting from its committed corpus.
#
#   FUZZ_SECONDS=60        seconds per target
#   FUZZ_TARGETS="key json" only these targets (default: every fuzz/*_fuzz.cc)
#
# New inputs that reach new code go to build/fuzz/work/<target>/ (kept between
# runs, not committed); findings go to build/fuzz/findings/ and make the run
# exit 1. A finding, once fixed, is minimised (fuzz_<target> -minimize_crash=1)
# and added to fuzz/corpus/<target>/, where every `make test` replays it.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${FUZZ_SECONDS:-60}"
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz: FUZZ_SECONDS must be a positive integer" >&2
  exit 2
fi

bash scripts/install-deps.sh --fuzz
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz

if [ -n "${FUZZ_TARGETS:-}" ]; then
  read -r -a targets <<<"$FUZZ_TARGETS"
else
  targets=()
  for source in fuzz/*_fuzz.cc; do
    name="$(basename "$source" _fuzz.cc)"
    targets+=("$name")
  done
fi

mkdir -p build/fuzz/findings
failed=()
for name in "${targets[@]}"; do
  binary="build/fuzz/fuzz/fuzz_$name"
  if [ ! -x "$binary" ] || [ ! -d "fuzz/corpus/$name" ]; then
    echo "fuzz: no target '$name' (fuzz/${name}_fuzz.cc and fuzz/corpus/$name/)" >&2
    exit 2
  fi
  work="build/fuzz/work/$name"
  mkdir -p "$work"
  echo "== $name: ${seconds}s"
  # The work directory comes first: libFuzzer writes what it finds to it and
  # only reads the committed corpus.
  if ! "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 \
      -artifact_prefix="build/fuzz/findings/$name-" \
      "$work" "fuzz/corpus/$name" 2>"build/fuzz/$name.log"; then
    failed+=("$name")
    echo "   FINDING: see build/fuzz/$name.log and build/fuzz/findings/$name-*"
  fi
  grep -E '^stat::(number_of_executed_units|new_units_added|peak_rss_mb)' "build/fuzz/$name.log" \
    | sed 's/^/   /' || true
done

if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz: findings in ${failed[*]}"
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${seconds}s each, no finding"
