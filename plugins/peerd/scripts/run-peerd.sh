#!/bin/sh
# How the peerd plugin runs peerd, for its MCP server and its hooks:
#   sh run-peerd.sh mcp                              the MCP server (bound to $PEERD_ROLE, $PEERD_INSTANCE)
#   sh run-peerd.sh hook session-start|prompt-submit  the hook (quiet without $PEERD_ROLE)
# It runs the `peerd` on PATH (or in ~/.local/bin, where `uv tool install` puts it); else
# `uv run --directory CLONE peerd`, CLONE being the clone of peerd the plugin came from: the one
# around this plugin folder (`claude --plugin-dir CLONE/plugins/peerd`), or the marketplace it was
# installed from (`claude plugin marketplace add CLONE`: Claude Code copies the plugin into its
# cache, and names the marketplace's folder in plugins/known_marketplaces.json). When neither
# works it says why where Claude Code shows it: on the MCP server's stderr (exit 1), and at session
# start as a systemMessage.
root=$(CDPATH='' cd -- "$(dirname -- "$0")/.." && pwd)
what=${1:-mcp}
[ $# -gt 0 ] && shift

is_clone() {  # a peerd source tree uv can run
  [ -f "$1/pyproject.toml" ] && [ -f "$1/plugins/peerd/.claude-plugin/plugin.json" ]
}

find_tool() {  # $1 on PATH, else in the folders installers put it
  command -v "$1" 2>/dev/null && return
  for dir in "$HOME/.local/bin" "$HOME/.cargo/bin"; do
    [ -x "$dir/$1" ] && { echo "$dir/$1"; return; }
  done
}

marketplace_folder() {  # the folder of the marketplace this copy of the plugin was installed from
  plugins=$(CDPATH='' cd -- "$root/../../../.." 2>/dev/null && pwd)  # of <config>/plugins/cache/MARKET/PLUGIN/VERSION
  market=$(basename -- "$(dirname -- "$(dirname -- "$root")")")
  if [ -d "$plugins/marketplaces/$market" ]; then echo "$plugins/marketplaces/$market"; return; fi
  [ -f "$plugins/known_marketplaces.json" ] || return
  awk -v key="\"$market\": {" '
    index($0, key) == 3 { inside = 1; next }
    inside && /^  }/ { exit }
    inside && /"installLocation": "/ {
      sub(/^[^:]*: *"/, ""); sub(/",?[ \r]*$/, ""); gsub(/\\"/, "\""); gsub(/\\\\/, "\\"); print; exit
    }' "$plugins/known_marketplaces.json"
}

say() {  # why peerd cannot run, where Claude Code shows it
  echo "peerd plugin: $1" >&2
  if [ "$what" = hook ] && [ "$event" = session-start ]; then
    text=$(printf 'peerd plugin: %s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g')
    printf '{"systemMessage": "%s"}\n' "$text"
  fi
}

event=${1:-prompt-submit}
case $what in
  mcp) set -- mcp ${PEERD_ROLE:+--role "$PEERD_ROLE"} ${PEERD_INSTANCE:+--instance "$PEERD_INSTANCE"} ;;
  hook) set -- hook --event "$event" ${PEERD_ROLE:+--role "$PEERD_ROLE"} ${PEERD_INSTANCE:+--instance "$PEERD_INSTANCE"} ;;
  *) echo "usage: sh run-peerd.sh mcp | hook session-start|prompt-submit" >&2; exit 1 ;;
esac

peerd=$(find_tool peerd)
clone=
if [ -z "$peerd" ]; then
  up=$(CDPATH='' cd -- "$root/../.." && pwd)
  if is_clone "$up"; then clone=$up; else clone=$(marketplace_folder); fi
  if [ -z "$clone" ] || ! is_clone "$clone"; then
    say "peerd is not on PATH, and no clone of peerd was found for this plugin (${clone:-no marketplace folder}): \
install it with \`uv tool install /path/to/peerd\` in a clone, or add the marketplace from a clone \
(\`claude plugin marketplace add /path/to/peerd\`), then restart Claude Code."
    [ "$what" = hook ] && exit 0
    exit 1
  fi
  uv=$(find_tool uv)
  if [ -z "$uv" ]; then
    say "peerd is not on PATH, and running it from the clone at $clone needs uv, which is not on PATH either: \
install uv (https://docs.astral.sh/uv/) or peerd (\`uv tool install $clone\`), then restart Claude Code."
    [ "$what" = hook ] && exit 0
    exit 1
  fi
fi
[ "$what" = hook ] && [ -z "$PEERD_ROLE" ] && exit 0  # a session with no role: nothing to show
if [ -n "$peerd" ]; then exec "$peerd" "$@"; fi
exec "$uv" run --quiet --directory "$clone" peerd "$@"
