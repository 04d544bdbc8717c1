#!/usr/bin/env bash
# The README's first command at two commits, side by side in one run: each run in an empty
# folder (`git archive`, so the model conversion is included), the arms alternated round after
# round so that a change in the machine's load falls on both; prints every run's wall time,
# the median per arm with its ratio, and whether the two arms printed the same trials
# (skip set, accepted length, metric, cost and verdict of every trial) and the same mapping
# entry (its skip set and figures).
#
#   bash benchmarks/readme_command_ab.sh BEFORE AFTER [ROUNDS] [-- extra overrides]
#   bash benchmarks/readme_command_ab.sh 20cc41d HEAD 2 -- threads=1
#
# PYTHON (default: python) runs both arms; their code comes from each commit (PYTHONPATH).
set -euo pipefail
BEFORE=${1:?usage: readme_command_ab.sh BEFORE AFTER [ROUNDS] [-- overrides]}
AFTER=${2:?usage: readme_command_ab.sh BEFORE AFTER [ROUNDS] [-- overrides]}
ROUNDS=${3:-2}
shift $(( $# < 3 ? $# : 3 ))
[ "${1:-}" = "--" ] && shift
PYTHON=${PYTHON:-python}
REPO=$(git rev-parse --show-toplevel)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/readme_ab.XXXXXX")

declare -A WALLS
for round in $(seq 1 "$ROUNDS"); do
  for arm in before after; do
    commit=$BEFORE; [ $arm = after ] && commit=$AFTER
    dir="$WORK/$arm.$round"
    mkdir -p "$dir"
    git -C "$REPO" archive "$commit" | tar -x -C "$dir"
    t0=$(date +%s.%N)
    (cd "$dir" && PYTHONPATH=$dir "$PYTHON" -m tss_opt +domain=summarization "$@" > out.txt 2>&1)
    wall=$(echo "$(date +%s.%N) - $t0" | bc)
    WALLS[$arm]="${WALLS[$arm]:-} $wall"
    printf 'round %d  %-6s %-10s %7.1f s  %s\n' "$round" "$arm" "$commit" "$wall" "$(grep -o '[0-9]* configurations' "$dir/out.txt" | tail -1)"
    # what the search found: every trial's figures and verdict (not its progress counters)
    grep 'trial #' "$dir/out.txt" | sed 's/^.*trial #/trial #/; s/ \[.*//' | sort > "$dir/trials.txt"
    # the mapping's figures (a newer format may add fields, e.g. the searched dtype)
    grep -E '^ *(skip_set|accept_length|metric|metric_name|cost):' "$dir/storage/mapping.yaml" > "$dir/answer.txt"
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
mb=$(echo "${WALLS[before]}" | median); ma=$(echo "${WALLS[after]}" | median)
echo
printf '| arm | commit | median wall (s) | after / before |\n|---|---|---:|---:|\n'
printf '| before | %s | %.1f | |\n| after | %s | %.1f | %.2fx |\n' "$BEFORE" "$mb" "$AFTER" "$ma" "$(echo "$ma / $mb" | bc -l)"
same=yes
for f in "$WORK"/*/trials.txt; do cmp -s "$f" "$WORK/before.1/trials.txt" || same=no; done
for f in "$WORK"/*/answer.txt; do cmp -s "$f" "$WORK/before.1/answer.txt" || same=no; done
echo "same trials and mapping in every run: $same"
grep -o 'summarization\.[a-z0-9_.]*' "$WORK/after.1/out.txt" | sort -u | head -1 | sed 's/^/study: /'
if [ $same = yes ]; then rm -rf "$WORK"; else echo "the runs' logs are kept in $WORK"; exit 1; fi
