#!/usr/bin/env bash
# Throughput of `da3 batch` spread over several devices: the local CPU (the batch process,
# one thread, pinned to core 0) alone, with one loopback `da3 rpc-server` (pinned to core 1),
# and with two (the second pinned to core 0), plus the servers alone. Images per second over
# the batch (summary.json's `seconds`: after the models are loaded, sessions and graphs
# included), median of RUNS runs. Needs ffmpeg (for the test images) and taskset.
#
#   cargo build --release -p da3-cli && bash benches/multi_device.sh
#
# Environment: DA3 (binary), MODEL (a GGUF; default the built-in da3-tiny), N (images, 48),
# RES (process resolution, 252), RUNS (3).
set -euo pipefail
DA3=${DA3:-target/release/da3}
N=${N:-48}
RES=${RES:-252}
RUNS=${RUNS:-3}
MODEL_ARGS=()
if [[ -n "${MODEL:-}" ]]; then MODEL_ARGS=(--model "$MODEL"); fi

work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

mkdir "$work/in"
ffmpeg -nostdin -loglevel error -f lavfi -i "testsrc=size=320x240:rate=$N" -frames:v "$N" \
    "$work/in/%03d.png"

server() { # core, output file; the endpoint is the output's first line
    taskset -c "$1" "$DA3" rpc-server --port 0 --threads 1 --max-connections 64 \
        >"$2" 2>/dev/null &
    pids+=($!)
}
endpoint() { # output file -> endpoint
    for _ in $(seq 100); do
        if [[ -s "$1" ]]; then awk '{print $NF; exit}' "$1"; return; fi
        sleep 0.1
    done
    echo "rpc-server did not start" >&2
    exit 1
}
server 1 "$work/server1"
server 0 "$work/server2"
s1=$(endpoint "$work/server1")
s2=$(endpoint "$work/server2")

grep -m1 'model name' /proc/cpuinfo
echo "cores: $(nproc); model: ${MODEL:-built-in da3-tiny}; $N images 320x240 at --process-res $RES"
configs=(cpu "cpu,rpc:$s1" "cpu,rpc:$s1,rpc:$s2" "rpc:$s1" "rpc:$s1,rpc:$s2")
declare -A rates
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
# Runs interleaved across the configurations, so that other load drifts over all of them.
for run in $(seq "$RUNS"); do
    for devices in "${configs[@]}"; do
        rm -rf "$work/out"
        taskset -c 0 "$DA3" -q batch "$work/in" "${MODEL_ARGS[@]}" --out-dir "$work/out" \
            --outputs pfm --process-res "$RES" --device "$devices" --threads 1 >/dev/null
        rates[$devices]+="$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print("%.2f" % (s["ok"] / s["seconds"]))' "$work/out/summary.json") "
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-48s %10s %s\n' "devices" "median" "runs (images/s)"
for devices in "${configs[@]}"; do
    median=$(printf '%s\n' ${rates[$devices]} | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    printf '%-48s %10s %s\n' "$devices" "$median" "${rates[$devices]}"
done
