#!/usr/bin/env bash
# Before/after: runs reliable-queue's own benchmarks of a base revision and of the working
# tree alternately, several rounds, and prints the median of each side and their ratio.
#
#   scripts/compare.sh BASE_REV [ROUNDS] [BENCH:FILTER ...]
#
#   scripts/compare.sh e53f049                      # 5 rounds of the default set below
#   scripts/compare.sh e53f049 6 durable:1024-tasks/1-item-tx/reliable-queue
#
# Each BENCH:FILTER runs `benches/BENCH.rs` with criterion filter FILTER. The default set is
# every reliable-queue benchmark of `inmemory`, `durable` and `contention`. Extra criterion
# options go in CRITERION_ARGS (e.g. CRITERION_ARGS="--measurement-time 10"); cargo features
# for both builds in FEATURES (FEATURES=postgres for `benches/postgres.rs`, which starts its
# own server).
#
# The base revision is checked out with `git worktree` under target/compare/<rev> and built
# there with a target directory of its own. Run on a quiet machine: nothing else may run, and
# the disk's fsync latency still moves the durable figures by 10-20% between runs, which is
# why the sides alternate and the medians are compared.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# -lt 1 ]]; then
    echo "usage: $0 BASE_REV [ROUNDS] [BENCH:FILTER ...]" >&2
    exit 2
fi
base_rev=$1
rounds=${2:-5}
shift $(( $# >= 2 ? 2 : 1 ))
specs=("$@")
if [[ ${#specs[@]} -eq 0 ]]; then
    specs=(inmemory:reliable-queue durable:reliable-queue contention:contention)
fi

here=$PWD
base_dir=$here/target/compare/$(git rev-parse --short "$base_rev")
if [[ ! -d $base_dir ]]; then
    git worktree add --detach "$base_dir" "$base_rev" >&2
fi
out=$here/target/compare/results-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"

echo "building both sides" >&2
features=()
[[ -n ${FEATURES:-} ]] && features=(--features "$FEATURES")
(cd "$base_dir" && CARGO_TARGET_DIR=$base_dir/target cargo bench --no-run "${features[@]}" >/dev/null 2>&1)
cargo bench --no-run "${features[@]}" >/dev/null 2>&1

bench_bin() { # DIR BENCH: the newest bench executable of that name
    ls -t "$1"/target/release/deps/"$2"-* | grep -v '\.d$' | head -n 1
}

for round in $(seq 1 "$rounds"); do
    for side in before after; do
        dir=$here
        [[ $side == before ]] && dir=$base_dir
        for spec in "${specs[@]}"; do
            bench=${spec%%:*}
            filter=${spec#*:}
            echo "round $round, $side, $bench $filter (load $(cut -d' ' -f1 /proc/loadavg))" >&2
            # shellcheck disable=SC2086 # CRITERION_ARGS is a list of options
            (cd "$dir" && "$(bench_bin "$dir" "$bench")" --bench "$filter" --noplot \
                ${CRITERION_ARGS:-}) >"$out/$side-$bench-$round.txt" 2>&1
        done
    done
done

# Criterion prints an id (on its own line or first on the `time:` line), then
# `thrpt: [low median high]`; a later `thrpt:` with percentages is the change line. A
# benchmark that sets no throughput is compared by operations per second, 1 / its time.
awk '
    function per_second(v, u) {
        if (u ~ /^K/) return v * 1e3
        if (u ~ /^M/) return v * 1e6
        if (u ~ /^G/) return v * 1e9
        return v
    }
    function median(list,    n, a, i, j, t) {
        n = split(list, a, " ")
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    FNR == 1 { side = FILENAME; sub(/^.*\//, "", side); sub(/-.*$/, "", side) }
    /^Benchmarking/ { next }
    /^[^ ]/ && NF == 1 { last = $1; next }
    function in_ns(v, u) {
        if (u == "ps") return v / 1e3
        if (u == "ns") return v
        if (u == "µs" || u == "us") return v * 1e3
        if (u == "ms") return v * 1e6
        if (u == "s") return v * 1e9
        return -1
    }
    /time:/ {
        id = ($1 == "time:") ? last : $1
        t = $0; sub(/^.*time: *\[/, "", t); split(t, f, " ")
        ns = in_ns(f[3], f[4])
        if (ns > 0) {
            if (!(id in seen)) { seen[id] = 1; ids[++n] = id }
            times[side, id] = times[side, id] " " ns
        }
        next
    }
    /thrpt:/ {
        sub(/^.*thrpt: *\[/, ""); split($0, f, " ")
        if (f[4] !~ /\/s$/) next
        if (!(id in seen)) { seen[id] = 1; ids[++n] = id }
        runs[side, id] = runs[side, id] " " per_second(f[3], f[4])
    }
    END {
        print "| benchmark | before (items/s, median) | after (items/s, median) | after ÷ before | runs |"
        print "|---|---:|---:|---:|---:|"
        for (i = 1; i <= n; i++) {
            id = ids[i]; b = runs["before", id]; a = runs["after", id]
            # A benchmark without a throughput: operations per second from its time.
            if (b == "" && a == "" && times["before", id] != "" && times["after", id] != "") {
                split(times["before", id], tb, " "); split(times["after", id], ta, " ")
                for (k in tb) b = b " " 1e9 / tb[k]
                for (k in ta) a = a " " 1e9 / ta[k]
            }
            if (b == "" || a == "") continue
            mb = median(b); ma = median(a)
            printf "| %s | %.0f | %.0f | %.3f | %d/%d |\n", id, mb, ma, ma / mb, split(b, x, " "), split(a, y, " ")
        }
    }' "$out"/*.txt | tee "$out/summary.md"
echo "results in $out" >&2
