#!/usr/bin/env bash
# Fails when two tracked paths (files or the folders that hold them) differ only by case: on a
# case-insensitive file system (the macOS default) they would be one, and a clone there breaks.
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files | awk -F/ '{
    path = ""
    for (i = 1; i <= NF; i++) { path = (i == 1 ? $1 : path "/" $i); print path }
}' | sort -u | awk '{
    lower = tolower($0)
    if ((lower in seen) && seen[lower] != $0) { print "paths differ only by case: " seen[lower] " and " $0; bad = 1 }
    else seen[lower] = $0
} END { exit bad }'
echo "no two tracked paths differ only by case"
