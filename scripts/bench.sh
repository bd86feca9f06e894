#!/usr/bin/env bash
# Runs every benchmark that BENCHMARKS.md reports, on this machine, and collects the figures.
#
#   scripts/bench.sh            # the full run (about 20 minutes on 2 CPUs; RQ_BENCH_10M=1 adds more)
#   scripts/bench.sh --quick    # a smoke run: shorter criterion measurements, smaller stores
#
# Environment:
#   RQ_BENCH_DIR          where stores are created (default: the system temporary directory);
#                         must be on the disk being measured, not a tmpfs
#   RQ_BENCH_10M=1        also measure recovery of a 10M-item store (GBs of disk, long build)
#   RQ_BENCH_RECOVERY_ITEMS, RQ_BENCH_CHURN_ITEMS, RQ_BENCH_DISK_PQ, RQ_BENCH_PEERS
#                         see benches/recovery.rs and benches/disk.rs
#   RQ_BENCH_OUT          directory for the results (default: <target dir>/bench-results/<time>)
#   RQ_BENCH_MEMORY_SIZES smaller stores the recovery bench also builds and opens, for the chart
#                         of memory per item against queue length (default "10000 100000";
#                         quick: "10000 50000"; empty: none)
#   RQ_BENCH_REDIS=0|1    run benches/redis.rs (the Redis engine, a redis-rs loop by hand,
#                         PostgreSQL and sled); default 1 when redis-server is installed or
#                         RQ_TEST_REDIS_URL names a server
#   RQ_BENCH_POSTGRES=0|1 run benches/pg_soak.rs, and PostgreSQL beside Redis in
#                         benches/redis.rs; default 1 when PostgreSQL's binaries are under
#                         /usr/lib/postgresql/*/bin (set it to 1 to use RQ_TEST_POSTGRES_URL's)
#   RQ_BENCH_CHARTS=0     do not draw the charts
#   RQ_BENCH_CHARTS_DIR   where the charts go (default: docs/charts)
#
# Everything printed goes to one file per bench in the results directory; `summary.md` there
# holds the machine, the median of every criterion benchmark with its ratio to reliable-queue
# in the same group, the figures printed by the recovery and disk benches, the latency
# table, and the Redis and soak figures when those ran. At the end the chart generator
# (scripts/charts, a program of its own outside the workspace) draws SVG charts from the
# results and criterion's estimates into docs/charts, the ones BENCHMARKS.md shows.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
if [[ ${1:-} == --quick ]]; then
    quick=1
elif [[ $# -gt 0 ]]; then
    echo "usage: $0 [--quick]" >&2
    exit 2
fi

target=${CARGO_TARGET_DIR:-target}
out=${RQ_BENCH_OUT:-$target/bench-results/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
bench_dir=${RQ_BENCH_DIR:-${TMPDIR:-/tmp}}

criterion_args=()
latency_seconds=10
memory_sizes=${RQ_BENCH_MEMORY_SIZES-10000 100000}
redis_args=()
soak_args=()
if ((quick)); then
    criterion_args=(--warm-up-time 0.5 --measurement-time 2)
    export RQ_BENCH_RECOVERY_ITEMS=${RQ_BENCH_RECOVERY_ITEMS:-200000}
    export RQ_BENCH_CHURN_ITEMS=${RQ_BENCH_CHURN_ITEMS:-500000}
    latency_seconds=3
    redis_args=(--quick)
    memory_sizes=${RQ_BENCH_MEMORY_SIZES-10000 50000}
    soak_args=(--backlog 20000 --seconds 60 --window 5)
fi

# The server benches run when their server is installed, unless switched off.
have_redis=0
if command -v redis-server >/dev/null 2>&1 || [[ -n ${RQ_TEST_REDIS_URL:-} ]]; then
    have_redis=1
fi
have_postgres=0
if compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null; then
    have_postgres=1
fi
run_redis=${RQ_BENCH_REDIS:-$have_redis}
run_postgres=${RQ_BENCH_POSTGRES:-$have_postgres}
server_features=()
((run_postgres)) && server_features+=(postgres)
((run_redis)) && server_features+=(redis)
server_features=$(IFS=,; echo "${server_features[*]}")

step() { printf '\n=== %s (%s)\n' "$1" "$(date +%T)"; }

step "machine"
{
    echo "date:    $(date -u +%FT%TZ)"
    echo "commit:  $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
    echo "cpu:     $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs" \
        "($(lscpu | sed -n 's/^Thread(s) per core: *//p') thread(s) per core)"
    echo "memory:  $(free -g | awk '/^Mem:/ {print $2 " GiB"}')"
    echo "kernel:  $(uname -sr)"
    echo "disk:    $(df -hT "$bench_dir" | awk 'NR == 2 {print $1 ", " $2 ", " $3 " (bench dir: '"$bench_dir"')"}')"
    echo "rustc:   $(rustc --version)"
    echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min) before the run"
    echo "mode:    $( ((quick)) && echo "quick (smoke run)" || echo full)"
    echo "servers: Redis bench $( ((run_redis)) && echo on || echo off)," \
        "PostgreSQL (soak, beside Redis) $( ((run_postgres)) && echo on || echo off)"
} | tee "$out/machine.txt"

step "build"
cargo bench --no-run 2>&1 | tail -n 3
cargo build --release --example latency 2>&1 | tail -n 1
if [[ -n $server_features ]]; then
    # One build for both server benches: the same features, so the library is built once.
    cargo bench --features "$server_features" --no-run 2>&1 | tail -n 1
fi

run_bench() {
    local name=$1
    shift
    step "cargo bench --bench $name $*"
    cargo bench --bench "$name" -- "$@" 2>&1 | tee "$out/$name.txt"
}

run_bench inmemory "${criterion_args[@]}"
run_bench durable "${criterion_args[@]}"
if [[ -f benches/contention.rs ]]; then
    run_bench contention "${criterion_args[@]}"
else
    echo "benches/contention.rs is missing: contention not measured" | tee "$out/contention.txt"
fi
run_bench recovery "${criterion_args[@]}"
for items in $memory_sizes; do
    # The same bench at smaller sizes: its `figure` lines give memory per item against
    # queue length (the chart); its open times are criterion's too, under recovery/<size>.
    step "RQ_BENCH_RECOVERY_ITEMS=$items cargo bench --bench recovery"
    RQ_BENCH_RECOVERY_ITEMS=$items cargo bench --bench recovery -- "${criterion_args[@]}" 2>&1 |
        tee "$out/recovery-$items.txt"
done
run_bench disk

step "cargo run --release --example latency -- --seconds $latency_seconds"
cargo run --release --example latency -- --seconds "$latency_seconds" 2>&1 | tee "$out/latency.txt"

# A failure of a server bench (its server would not start, say) is reported, and the run goes
# on: the other benches' figures and charts are still worth having.
# server_bench ON NAME WHAT WHY_OFF [ARGS...]: runs benches/NAME.rs into NAME.txt when ON is 1.
server_bench() {
    local on=$1 name=$2 what=$3 why_off=$4
    shift 4
    if ((on)); then
        step "cargo bench --features $server_features --bench $name $*"
        if ! cargo bench --features "$server_features" --bench "$name" -- "$@" 2>&1 |
            tee "$out/$name.txt"; then
            echo "the $what FAILED: see $out/$name.txt"
        fi
    else
        echo "$what off ($why_off)" | tee "$out/$name.skipped"
    fi
}
server_bench "$run_redis" redis "Redis bench" "no redis-server, or RQ_BENCH_REDIS=0" \
    "${redis_args[@]}"
server_bench "$run_postgres" pg_soak "PostgreSQL soak" \
    "no PostgreSQL binaries, or RQ_BENCH_POSTGRES=0" "${soak_args[@]}"

step "summary"
summarize() {
    # Criterion prints an id on its own line (or first on the `time:` line), then
    # `time: [low median high]` and, when a throughput is set, `thrpt: [low median high]`.
    awk '
        function seconds(v, u) {
            if (u == "ps") return v / 1e12
            if (u == "ns") return v / 1e9
            if (u == "ms") return v / 1e3
            if (u == "s") return v
            return v / 1e6 # µs
        }
        function per_second(v, u) {
            if (u ~ /^K/) return v * 1e3
            if (u ~ /^M/) return v * 1e6
            if (u ~ /^G/) return v * 1e9
            return v
        }
        function human(x) {
            if (x >= 1e6) return sprintf("%.2f M", x / 1e6)
            if (x >= 1e3) return sprintf("%.1f k", x / 1e3)
            return sprintf("%.0f ", x)
        }
        function human_time(t) {
            if (t >= 1) return sprintf("%.2f s", t)
            if (t >= 1e-3) return sprintf("%.1f ms", t * 1e3)
            if (t >= 1e-6) return sprintf("%.1f µs", t * 1e6)
            return sprintf("%.1f ns", t * 1e9)
        }
        /^Benchmarking/ { next }
        /^[^ ]/ && NF == 1 { last = $1; next }
        /time:/ {
            id = ($1 == "time:") ? last : $1
            sub(/^.*time: *\[/, ""); split($0, f, " ")
            if (f[2] !~ /^(ps|ns|µs|us|ms|s)$/) next # a "change:" line
            n++; ids[n] = id; secs[id] = seconds(f[3], f[4]); next
        }
        /thrpt:/ {
            sub(/^.*thrpt: *\[/, ""); split($0, f, " ")
            if (f[4] !~ /\/s$/) next # a "change:" line
            rate[ids[n]] = per_second(f[3], f[4]); next
        }
        END {
            for (i = 1; i <= n; i++) {
                id = ids[i]; g = id; sub(/\/[^\/]*$/, "", g)
                if (id ~ /\/reliable-queue$/) ours[g] = id
            }
            print "| benchmark | time per iteration (median) | items/s | reliable-queue ÷ this |"
            print "|---|---:|---:|---:|"
            for (i = 1; i <= n; i++) {
                id = ids[i]; g = id; sub(/\/[^\/]*$/, "", g)
                ratio = ""
                if (g in ours && ours[g] != id) {
                    o = ours[g]
                    if ((o in rate) && (id in rate) && rate[id] > 0) ratio = sprintf("%.2fx", rate[o] / rate[id])
                    else if (secs[o] > 0) ratio = sprintf("%.2fx", secs[id] / secs[o])
                }
                r = (id in rate) ? human(rate[id]) : ""
                printf "| %s | %s | %s | %s |\n", id, human_time(secs[id]), r, ratio
            }
        }' "$@"
}
{
    echo "# Benchmark results"
    echo
    echo '```text'
    cat "$out/machine.txt"
    echo '```'
    echo
    echo "## Criterion benchmarks (median of each)"
    echo
    echo "For throughput benchmarks the ratio is reliable-queue's items/s over the peer's; for"
    echo "time-only ones (recovery) it is the peer's time over reliable-queue's. Above 1: ours is faster."
    echo
    summarize "$out/inmemory.txt" "$out/durable.txt" "$out/contention.txt" "$out/recovery.txt"
    echo
    echo "## Figures printed by the benches"
    echo
    echo '```text'
    { cat "$out"/recovery*.txt "$out/disk.txt" 2>/dev/null || true; } | sed -n 's/^figure //p'
    echo '```'
    echo
    echo "## Commit latency (examples/latency.rs)"
    echo
    grep -E '^(commit latency|\|)' "$out/latency.txt"
    if [[ -f $out/redis.txt ]]; then
        echo
        echo "## The Redis engine and its peers (benches/redis.rs)"
        echo
        grep -E '^(machine:|\|)' "$out/redis.txt" || echo "(no table: see redis.txt)"
    fi
    if [[ -f $out/pg_soak.txt ]]; then
        echo
        echo "## PostgreSQL soak (benches/pg_soak.rs)"
        echo
        echo '```text'
        grep -E '^(pg_soak|[ ]*t\(s\)|[ ]*[0-9]+ )' "$out/pg_soak.txt" || echo "(no windows: see pg_soak.txt)"
        echo '```'
    fi
} > "$out/summary.md"
cat "$out/summary.md"
echo

charts_status=0
if [[ ${RQ_BENCH_CHARTS:-1} != 0 ]]; then
    step "charts"
    cargo run --quiet --release --manifest-path scripts/charts/Cargo.toml -- \
        "$out" "${RQ_BENCH_CHARTS_DIR:-docs/charts}" --criterion "$target/criterion" ||
        charts_status=$?
fi
echo
echo "results in $out"
exit "$charts_status"
