#!/bin/sh
# sessionbox's bootstrap for OpenSandbox's docker runtime. The server copies this file and /execd
# out of runtime.execd_image into /opt/opensandbox/ of every sandbox and makes this script the
# container's entrypoint, with the sandbox's own entrypoint as arguments.
#
# It starts sessionbox-agent (our execd) in the background on the port OpenSandbox expects
# (44772), serving /workspace, then runs the sandbox entrypoint as the container's main process.
#
# Hardening (the 1.1.1 server can neither run a container as another user than its image's
# nor mark its root file system read-only, so the agent does it): started as root, the agent
# becomes SESSIONBOX_SANDBOX_USER (default 1000:1000) with no capability, not even in its
# bounding set, and no_new_privs, and confines itself with Landlock to writing beneath
# /workspace, /tmp and /dev/shm only. Every command and file operation runs so. The agent
# refuses to serve when it cannot apply either.
set -e
dir=$(dirname "$0")
user="${SESSIONBOX_SANDBOX_USER:-1000:1000}"
mkdir -p /workspace
confine="--writable /workspace --writable /tmp"
[ -d /dev/shm ] && confine="$confine --writable /dev/shm"
if [ "$(id -u)" = 0 ]; then
  # The workspace belongs to the sandbox user (the top directory only: a resumed sandbox's
  # files keep their owners).
  chown "$user" /workspace
  confine="$confine --user $user"
fi
# The agent listens on loopback only unless told otherwise, and refuses another address without
# an access token unless --insecure-no-token says so. Here the address is the container's own,
# reached only through the OpenSandbox server (its proxy, or the port it publishes on
# 127.0.0.1), which in docker mode hands out no execd token: so every interface, explicitly.
# An EXECD_ACCESS_TOKEN in the sandbox's environment (sessionbox sets one per conversation) is
# then required of every request: another container on the bridge cannot use this agent.
# shellcheck disable=SC2086 # $confine is a list of options
"$dir/execd" --listen tcp:0.0.0.0:44772 --root /workspace --insecure-no-token $confine &
if [ "$#" -eq 0 ]; then
  set -- tail -f /dev/null
fi
# The container's main process is confined the same way: nothing in the sandbox keeps root.
# The agent's token is the agent's alone: not in the main process's environment (the agent,
# which is not dumpable, took its copy and removed it from its own).
unset EXECD_ACCESS_TOKEN
# shellcheck disable=SC2086
exec "$dir/execd" confined-exec $confine -- "$@"
