#!/bin/sh
# Speaks a text through Kazeia's D-Bus API with busctl and waits until it has been said: an example client.
#
#   kazeia_say.sh TEXT [PRIORITY]      (PRIORITY: important, message, text (default), notification, progress)
#
# Watches the daemon's messages (`busctl monitor`) before calling org.kazeia.Speech1.Speak, so a short
# utterance cannot end unseen, then waits for the Finished signal of its id and prints the reason (done,
# stopped, cancelled, shutdown or "error: ..."). Exit status: 0 when the utterance ended, 1 on an error reply
# (busctl prints it), 2 when the daemon reported an error while speaking. See docs/dbus-api.md.
set -eu

text=${1?usage: kazeia_say.sh TEXT [PRIORITY]}
priority=${2:-text}
bus="busctl --user"
log=$(mktemp)
$bus monitor --json=short org.kazeia.Speech >"$log" 2>/dev/null &
monitor=$!
trap 'kill $monitor 2>/dev/null; rm -f "$log"' EXIT

# The monitor is listening once it has seen traffic: ping the daemon (this also starts it) until it has.
tries=0
while [ ! -s "$log" ]; do
    $bus call org.kazeia.Speech /org/kazeia/Speech org.freedesktop.DBus.Peer Ping >/dev/null
    tries=$((tries + 1))
    if [ $tries -gt 100 ]; then
        echo "kazeia_say.sh: busctl monitor saw nothing" >&2
        exit 1
    fi
    sleep 0.1
done

# Speak replies "t ID".
reply=$($bus call org.kazeia.Speech /org/kazeia/Speech org.kazeia.Speech1 Speak 'sa{sv}' \
    "$text" 1 priority s "$priority") || exit 1
id=${reply#t }

# Finished(t id, s reason), one JSON line per message: ..."payload":{"type":"ts","data":[ID,"REASON"]}...
while :; do
    reason=$(sed -n "s/.*\"member\":\"Finished\".*\"data\":\[$id,\"\([^\"]*\)\".*/\1/p" "$log")
    [ -n "$reason" ] && break
    kill -0 $monitor 2>/dev/null || { echo "kazeia_say.sh: busctl monitor ended" >&2; exit 1; }
    sleep 0.05
done
echo "$reason"
case $reason in error*) exit 2 ;; esac
