#!/usr/bin/env bash
# Compares the sm_90a PTX of every .cu file at two commits, symbol names
# normalised, so that a refactor can show it left the kernels alone: each
# file's mangled names (and the path hash of its anonymous namespace) are
# numbered in order of first use, comments dropped. Needs nvcc and a Python
# with jaxlib (the FFI headers); no GPU.
#   usage: scripts/compare_ptx.sh BASE [HEAD]   (HEAD: the working tree)
#   PYTHON picks the interpreter (default python3); exit status 1 on any
#   difference, which it prints.
set -euo pipefail
base=$1 head=${2:-}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=${PYTHON:-python3}
inc=$("$py" -c 'import jaxlib, os; print(os.path.join(os.path.dirname(jaxlib.__file__), "include"))')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# tree REV DIR: the files of REV (or of the working tree) in DIR.
tree() {
  mkdir -p "$2"
  if [ -n "$1" ]; then
    git archive "$1" | tar -x -C "$2"
  else
    { git ls-files; git ls-files --others --exclude-standard; } | tar -cf - -T - | tar -xf - -C "$2"
  fi
}

# ptx DIR OUT: one normalised PTX file per .cu of DIR, named by its path.
ptx() {
  mkdir -p "$2"
  (cd "$1" && find . -name '*.cu' | sort) | while read -r f; do
    local name
    name=$(echo "${f#./}" | tr / _)
    (cd "$1" && nvcc -std=c++17 -O3 --expt-relaxed-constexpr -ptx \
      -gencode=arch=compute_90a,code=compute_90a -Iffi -Ibenchmarks/ffi -isystem "$inc" \
      "$f" -o "$2/$name.raw")
    "$py" - "$2/$name.raw" > "$2/$name" <<'EOF'
import re, sys
names = {}
def number(m):
    return names.setdefault(m.group(0), f"SYM{len(names)}")
for line in open(sys.argv[1]):
    if line.lstrip().startswith("//"):
        continue
    line = re.sub(r"_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+", "_GLOBAL__N_", line)
    print(re.sub(r"\b_Z\w+", number, line), end="")
EOF
    rm "$2/$name.raw"
  done
}

tree "$base" "$work/a"
tree "$head" "$work/b"
ptx "$work/a" "$work/a.ptx"
ptx "$work/b" "$work/b.ptx"
if diff -r "$work/a.ptx" "$work/b.ptx"; then
  echo "PTX identical up to symbol names: $(ls "$work/b.ptx" | wc -l) files (${base} vs ${head:-working tree})"
else
  exit 1
fi
