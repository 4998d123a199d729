#!/bin/sh
# sessionbox's bootstrap for OpenSandbox's docker runtime. The server copies this file and /execd
# out of runtime.execd_image into /opt/opensandbox/ of every sandbox and makes this script the
# container's entrypoint, with the sandbox's own entrypoint as arguments.
#
# It starts sessionbox-agent (our execd) in the background on the port OpenSandbox expects
# (44772), serving /workspace, then runs the sandbox entrypoint as the container's main process.
set -e
dir=$(dirname "$0")
mkdir -p /workspace
"$dir/execd" --listen tcp:0.0.0.0:44772 --root /workspace &
if [ "$#" -eq 0 ]; then
  set -- tail -f /dev/null
fi
exec "$@"
