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
# The agent listens on loopback only unless told otherwise, and refuses another address without
# an access token unless --insecure-no-token says so. Here the address is the container's own,
# reached only through the OpenSandbox server (its proxy, or the port it publishes on
# 127.0.0.1), which in docker mode hands out no execd token: so every interface, explicitly.
# An EXECD_ACCESS_TOKEN in the sandbox's environment is still required of every request.
"$dir/execd" --listen tcp:0.0.0.0:44772 --root /workspace --insecure-no-token &
if [ "$#" -eq 0 ]; then
  set -- tail -f /dev/null
fi
exec "$@"
