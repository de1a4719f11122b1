#!/bin/sh
# Container entrypoint. MEDUSA_ROLE=worker: serve one model, restoring MEDUSA_ARTIFACT (a normal
# start, with the reason logged, if the artifact does not fit this device). MEDUSA_ROLE=gateway:
# serve the catalog in MEDUSA_CONFIG. Extra arguments go to the command.
set -e
case "${MEDUSA_ROLE:-worker}" in
  worker)
    if [ -d "${MEDUSA_ARTIFACT:-}" ]; then set -- --artifact "$MEDUSA_ARTIFACT" "$@"; fi
    exec medusa run --host 0.0.0.0 --port "${PORT:-8000}" "$@" ;;
  gateway)
    exec medusa gateway --config "${MEDUSA_CONFIG:-/etc/medusa/models.yaml}" --host 0.0.0.0 \
      --port "${PORT:-9000}" "$@" ;;
  materialize)
    exec medusa materialize --out "${MEDUSA_ARTIFACT:-/artifacts/smollm2-sim}" "$@" ;;
  *) echo "MEDUSA_ROLE must be worker, gateway or materialize (got ${MEDUSA_ROLE})" >&2; exit 2 ;;
esac
