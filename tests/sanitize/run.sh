#!/usr/bin/env bash
# compute-sanitizer's four tools over small calls of each kernel family (calls.py): any
# reported error fails the run. Usage, on a GPU machine with flashcute installed:
#   bash tests/sanitize/run.sh [FAMILY ...]     # default: every family this GPU runs
# (kvcache: the KV-cache and merge corpus of kvcache_calls.py, fuzzed page tables and lengths;
# hopper-fp8: FP8 calls with descales, and the variable-length corpus)
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
families=("$@")
if [ ${#families[@]} -eq 0 ]; then  # the families this GPU runs and this build has
  read -r -a families < <(python -c '
import flashcute, flashcute._C as c
b = flashcute.build_info()["backends"]
f = ["ampere-fwd", "ampere-bwd", "ampere-bwd-deterministic"]
if c.device_capability(0) == 90:
    f += ["hopper-fwd"] * bool(b["hopper"]["head_dims"]) + ["hopper-bwd"] * bool(b["hopper"]["backward_head_dims"])
    f += ["hopper-fp8"] * bool(b["hopper"].get("fp8_head_dims"))
f += ["kvcache"] * hasattr(c, "kvcache_forward")
print(" ".join(f))')
fi
failed=0
for family in "${families[@]}"; do
  for tool in memcheck racecheck synccheck initcheck; do
    log=$(mktemp)
    # initcheck does not count TMA (bulk tensor) stores as writes, so it calls every element
    # of a Hopper-path forward's output uninitialized when the backward reads it; under
    # initcheck the backward families take out and lse from the Ampere-path forward.
    extra=()
    if [ "$tool" = initcheck ] && [[ "$family" == *bwd* ]]; then extra=(--forward-from ampere); fi
    compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 10 \
      python "$here/calls.py" "$family" ${extra[@]+"${extra[@]}"} >"$log" 2>&1
    rc=$?
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1)
    echo "$family $tool: exit $rc; ${summary:-no summary}"
    if [ $rc -ne 0 ]; then
      failed=1
      sed -n '1,40p' "$log"
    fi
    rm -f "$log"
  done
done
exit $failed
