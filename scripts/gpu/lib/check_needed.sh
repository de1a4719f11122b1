#!/usr/bin/env bash
# Fails unless the ELF file FILE lists each LIB among its NEEDED entries (a prefix of the soname:
# libcudart.so matches libcudart.so.13), and says what FILE links either way:
#   bash scripts/gpu/lib/check_needed.sh FILE LIB...
set -euo pipefail
file=$1
shift
needed=$(readelf -d "$file" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p' | paste -sd' ')
status=0
for lib in "$@"; do
  found=0
  for have in $needed; do
    [[ $have == "$lib"* ]] && found=1
  done
  if [ $found -eq 0 ]; then
    echo "FAIL $file does not link $lib (NEEDED: ${needed:-none})"
    status=1
  fi
done
[ $status -ne 0 ] || echo "$(basename "$file") links: $needed"
exit $status
