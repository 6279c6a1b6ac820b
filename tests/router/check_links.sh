#!/usr/bin/env bash
# The router's binary carries no engine, model, server or transfer code (issue #17): every tern namespace
# among its symbols is one of the router's own libraries' (core, net, router) or the command's (tools).
# Usage: check_links.sh TERN_ROUTE_BINARY
set -euo pipefail
bin=$1
allowed="tern::log:: tern::net:: tern::router:: tern::tools::"
found=$(nm -C "$bin" | grep -oE 'tern::[a-z_]+::' | sort -u)
bad=$(comm -23 <(echo "$found") <(tr ' ' '\n' <<<"$allowed" | sort -u))
if [[ -n $bad ]]; then
  echo "$bin holds symbols of namespaces it must not link:" $bad
  for ns in $bad; do nm -C "$bin" | grep -F "$ns" | head -3; done
  exit 1
fi
echo "$bin: tern namespaces $(echo $found) (allowed: $allowed); $(nm "$bin" | wc -l) symbols"
