#!/bin/sh
# `docker run` entry of the GPU image (Kubeflow tasks replace it with their own command).
# Keeps the run's DVC state on the mounted volume, so a new container carries on where the last
# one stopped: the DVC cache and dvc.lock live under $LONGTURN_STATE; mount data/ as well
# (docs/docker-image.md). DVC writes dvc.lock through the link; it cannot follow a linked data/.
set -eu
cd "$(dirname "$0")/.."  # the image's working copy, /opt/longturn
state="${LONGTURN_STATE:-/models/longturn-state}"
mkdir -p "$state/dvc-cache"
if [ ! -s "$state/dvc.lock" ]; then
    printf "schema: '2.0'\nstages: {}\n" > "$state/dvc.lock"
fi
ln -sfn "$state/dvc.lock" dvc.lock
dvc cache dir --local "$state/dvc-cache"
exec "$@"
