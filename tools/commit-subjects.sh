#!/usr/bin/env bash
# Commit subjects as an index of the history: `area: what changed`, at most 72 characters, so that
# `git log --oneline -- PATH` reads as history; numbers, reasons and measurements go in the body.
# The area is a lowercase word (`readme`, `engine`, `vulkan`, `daemon-cli`) or a path (`engine-core/graph`,
# `plugins/cpu/ARM.md`), several joined by ", ", then a colon and a space.
#
#   tools/commit-subjects.sh            the commits after BASE on HEAD (merges aside), as tools/lint.sh runs it
#   tools/commit-subjects.sh MSG_FILE   one message, as a commit-msg hook:
#                                       ln -s ../../tools/commit-subjects.sh .git/hooks/commit-msg
#   tools/commit-subjects.sh --self-test  the rule on subjects it must take and refuse
#
# BASE is main at the time the rule came in (4c3c9b2): older commits are not judged. Without git history
# (a tarball, or a shallow clone that lacks BASE) there is nothing to check, and it says so.
set -euo pipefail
export LC_ALL=C.UTF-8 # lengths in characters, not bytes

BASE=4c3c9b2
MAX=72
word='[a-z0-9][a-z0-9_-]*'
path='[A-Za-z0-9_.-]*[/.][A-Za-z0-9_./-]*'
area="($word|$path)"
pattern="^$area(, $area)*: [^ ]"

# Prints why SUBJECT breaks the rule, or nothing.
problem() {
    local subject=$1
    if [ "${#subject}" -gt "$MAX" ]; then
        echo "${#subject} characters (at most $MAX; move numbers and reasons to the body)"
    elif ! [[ $subject =~ $pattern ]]; then
        echo "not \`area: what changed\` (a lowercase word or a path, a colon, a space)"
    fi
}

if [ "${1:-}" = --self-test ]; then
    # The rule itself, on subjects it must take and refuse (tools/lint.sh runs this first).
    long="docs: $(printf 'x%.0s' {1..67})"
    for ok in "readme: a user manual" "plugins/cpu/ARM.md: the runbook's package" "engine, vulkan: tensor ids" \
        "daemon-cli: say checks the text first" "${long%x}"; do
        [ -z "$(problem "$ok")" ] || { echo "commit-subjects.sh: self-test: refused '$ok'" >&2; exit 1; }
    done
    for bad in "Docs: capitalised" "docs:no space" "weights = auto: spaces in the area" "no area at all" \
        "docs: " "$long" "Merge branch 'docs'"; do
        [ -n "$(problem "$bad")" ] || { echo "commit-subjects.sh: self-test: took '$bad'" >&2; exit 1; }
    done
    exit 0
fi

if [ $# -ge 1 ]; then
    # The first line that is neither empty nor a comment; git's own fixup!/squash!/amend! prefixes and
    # merge messages pass.
    subject=$(grep -v '^#' "$1" | grep -m1 -v '^[[:space:]]*$' || true)
    [[ $subject == "Merge "* ]] && exit 0
    subject=${subject#fixup! }
    subject=${subject#squash! }
    subject=${subject#amend! }
    why=$(problem "$subject")
    if [ -n "$why" ]; then
        echo "commit subject: $why: $subject" >&2
        exit 1
    fi
    exit 0
fi

# (A hook's message file is relative to where git runs it: only this mode moves to the repository.)
cd "$(dirname "$0")/.."
if ! git rev-parse --git-dir >/dev/null 2>&1; then
    echo "commit-subjects.sh: no git history here: subjects not checked" >&2
    exit 0
fi
if ! git cat-file -e "$BASE^{commit}" 2>/dev/null; then
    echo "commit-subjects.sh: $BASE is not in this clone (shallow?): subjects not checked" >&2
    exit 0
fi

bad=0
while IFS=$'\t' read -r hash subject; do
    why=$(problem "$subject")
    if [ -n "$why" ]; then
        echo "$hash: $why: $subject" >&2
        bad=$((bad + 1))
    fi
done < <(git log --no-merges --format='%h%x09%s' "$BASE..HEAD")
if [ "$bad" -gt 0 ]; then
    echo "commit-subjects.sh: $bad subject(s) to reword (git rebase -i $BASE, then 'reword')" >&2
    exit 1
fi
