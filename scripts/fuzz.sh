#!/usr/bin/env bash
# The long fuzz run (issue 17): every format's fuzz tests with enough cases that each format gets
# at least 10,000 checksum-recomputed structural mutations, each tally written as JSON to the
# report folder, then a per-format summary (printed, and written as summary.md beside the JSON).
#
# Structural cases per format (SEQKV_FUZZ_CASES is per test and original, see the tests):
#   .skv format 3         9 originals x 1,112  = 10,008  (tests/test_fuzz_skv*.py)
#   dictionary format 2   3 originals x 3,334  = 10,002  (tests/test_fuzz_dictionary.py)
#   store span records    ~80% of 12,700       ~ 10,160  (tests/test_fuzz_record.py; the report
#                                                          gives the exact structural count)
#   store metadata        2 backends x 1,000 seeded row, parent, count and index damages, plus
#                         each named damage once per backend (tests/test_fuzz_store.py)
# Override a count with SEQKV_FUZZ_CASES_SKV, _DICTIONARY, _STORE or _METADATA; the seed with
# SEQKV_FUZZ_SEED; the folder with SEQKV_FUZZ_REPORT (default reports/fuzz). SEQKV_PYTHON names
# an interpreter whose environment already has seqkv (then scripts/setup.sh is not run).
# Each test file runs under a wall-clock limit (SEQKV_FUZZ_TIMEOUT seconds, default 7200): a file
# that hits it is reported as a hang. Runs for tens of minutes on a 2-core CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${SEQKV_PYTHON:-}" ]; then
  scripts/setup.sh || exit 1
  python_bin=.venv/bin/python
else
  python_bin=$SEQKV_PYTHON
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HYPOTHESIS_PROFILE=ci
report=${SEQKV_FUZZ_REPORT:-reports/fuzz}
export SEQKV_FUZZ_REPORT=$report SEQKV_FUZZ_SEED=${SEQKV_FUZZ_SEED:-0}
rm -rf "$report"
mkdir -p "$report"
limit=${SEQKV_FUZZ_TIMEOUT:-7200}
status=0
run() {  # format, cases, pytest arguments
  local name=$1 cases=$2
  shift 2
  echo "== $name: SEQKV_FUZZ_CASES=$cases $*"
  local started=$SECONDS rc=0
  SEQKV_FUZZ_CASES=$cases timeout "$limit" "$python_bin" -m pytest -q -p no:cacheprovider "$@" \
    > "$report/$name.log" 2>&1 || rc=$?
  tail -n 3 "$report/$1.log"
  if [ "$rc" = 124 ]; then
    echo "   HANG: $* ran past ${limit} s"
  fi
  echo "   exit $rc after $((SECONDS - started)) s"
  [ "$rc" = 0 ] || status=1
}
run dictionary "${SEQKV_FUZZ_CASES_DICTIONARY:-3334}" tests/test_fuzz_dictionary.py
# The format-3 structural cases run one test per original (tests/test_fuzz_skv_each.py), so that
# one tally over its budget does not stop the others.
run skv "${SEQKV_FUZZ_CASES_SKV:-1112}" tests/test_fuzz_skv_each.py tests/test_fuzz_skv.py \
  -k "test_fuzz_skv_each or not test_fuzz_format_3_structure"
run store "${SEQKV_FUZZ_CASES_STORE:-12700}" tests/test_fuzz_record.py
run metadata "${SEQKV_FUZZ_CASES_METADATA:-1000}" tests/test_fuzz_store.py
"$python_bin" scripts/fuzz_summary.py "$report" | tee "$report/summary.md"
exit $status
