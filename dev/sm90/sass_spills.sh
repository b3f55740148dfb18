#!/bin/bash
# Where a kernel spills: the local-memory stores and loads (STL / LDL) in the SASS of the kernels of LIB whose
# mangled names contain PATTERN, with their line numbers in the function, and its counts of R2UR (vector to
# uniform register moves, e.g. of wgmma descriptors ptxas could not prove warp-uniform) and HGMMA (on the device
# machine: cuobjdump is not on the build machine). The SASS goes to $OUT/sass.txt.gz.
# Usage: bash dev/sm90/sass_spills.sh build-wg/libflashattn.so 'Li64ELi128ELi3E'
set -u
lib=$1 pattern=$2
OUT=${OUT:-/tmp}
cuobjdump -sass "$lib" >"$OUT/sass.txt" 2>&1
python3 - "$OUT/sass.txt" "$pattern" <<'PY'
import re, sys
text, pattern = open(sys.argv[1]).read(), sys.argv[2]
for func in re.split(r"\n\s*Function : ", text)[1:]:
    name, _, body = func.partition("\n")
    if pattern not in name:
        continue
    lines = body.split("\n")
    spills = [(i, l.strip()[:100]) for i, l in enumerate(lines) if re.search(r"\b(STL|LDL)\b", l)]
    r2ur, hgmma = (sum(1 for l in lines if re.search(rf"\b{op}\b", l)) for op in ("R2UR", "HGMMA"))
    print(f"{name}: {len(lines)} lines, {len(spills)} STL/LDL, {r2ur} R2UR, {hgmma} HGMMA")
    for i, l in spills:
        print(f"  {i:6d} {l}")
PY
gzip -f "$OUT/sass.txt"
