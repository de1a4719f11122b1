#!/usr/bin/env bash
# The kit the lent GPU machine needs (it has no network): run here, on a machine with PyPI,
#   bash scripts/gpu/kit.sh .gpukit                # wheels + SmolLM2 in two parts; prints the
#                                                 # carry list and bytes of each device call
#   bash scripts/gpu/kit.sh .gpukit --carry-only   # those lists again (the tree may have grown)
#   bash scripts/gpu/kit.sh split FILE DIR         # FILE in two parts + sha256 manifest
#   bash scripts/gpu/kit.sh join MANIFEST OUT PART1 PART2   # refuses a corrupt part
# Details: scripts/gpu/lib/kit.py; the image's package list: scripts/gpu/device-image.txt.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
case ${1:-} in
  split | join) exec python3 "$here/lib/kit_parts.py" "$@" ;;
esac
exec "${PYTHON:-python3}" "$here/lib/kit.py" "$@"
