#!/usr/bin/env bash
# Per kernel and SASS arch in libflashcute: tensor-core instructions (HMMA on the Ampere path,
# HGMMA/QGMMA on the Hopper path), local-memory traffic (LDL/STL: spills) and the width of
# global loads/stores (TMA on the Hopper path), and whether ptxas serialized a kernel's WGMMAs
# (every HGMMA then closes its own group, gsb0, and is waited for at once).
# Usage: benchmarks/check_sass.sh [path/to/libflashcute.so]
set -euo pipefail
lib=${1:-$(python -c "import flashcute, os; print(os.path.join(flashcute.cmake_prefix_path(), 'lib', 'libflashcute.so'))")}
cuobjdump=$(command -v cuobjdump || echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump")
"$cuobjdump" --dump-sass "$lib" | awk '
  /arch = sm_/          { arch = $3 }
  /Function :/          { if (fn != "") report(); fn = $3; fn_arch = arch; hmma = gmma = gsb = ldl = stl = ldg128 = stg128 = ldgsts = tmald = tmast = 0 }
  /HMMA/                { hmma++ }
  /HGMMA|QGMMA/         { gmma++; if (/gsb0/) gsb++ }
  /[^A-Z]LDL[. ]/       { ldl++ }
  /[^A-Z]STL[. ]/       { stl++ }
  /LDGSTS.*\.128/     { ldgsts++ }
  /STG.E.128/           { stg128++ }
  /UTMALDG/             { tmald++ }
  /UTMASTG/             { tmast++ }
  function report() {
    serial = gmma >= 8 && gsb == gmma
    printf "%-7s %-72.72s HMMA=%-4d GMMA=%-4d LDGSTS.128=%-4d STG.128=%-4d UTMALDG=%-3d UTMASTG=%-3d LDL=%d STL=%d%s\n", fn_arch, fn, hmma, gmma, ldgsts, stg128, tmald, tmast, ldl, stl, serial ? " GMMA-SERIALIZED" : ""
    bad += ldl + stl
    serialized += serial
  }
  END {
    if (fn != "") report()
    if (bad) print "local memory traffic found"
    if (serialized) print "serialized WGMMAs found"
    if (bad || serialized) exit 1
  }'
