#!/usr/bin/env bash
# Baseline for the Soft-RoCE VM: runs perftest's ib_write_bw and ib_read_bw
# (server and client on the same rxe device, as the VM has one) for the given
# message sizes and prints one perftest-style line per size:
#   size_bytes  iterations  GB/s  msg_rate_Mpps
# GB/s is 10^9 bytes/s, converted from perftest's "BW average[MB/sec]" (which
# is 2^20 bytes/s); msg_rate_Mpps is that average over the message size
# (what perftest prints as MsgRate, which it rounds to 1e-6). Meant to run
# inside the VM (tests/vm/run-in-vm.sh bench/vm-perftest.sh [ARGS]),
# standalone or sourced (then call vmperf_main ARGS or vmperf_run OP SIZE ITERS).
#
# Usage: vm-perftest.sh [-d DEV] [-x GID_INDEX] [-a ADDR] [-o OPS] [SIZE[:ITERS]...]
#   -d DEV        RDMA device (default $RXE_DEV, else rxe0)
#   -x GID_INDEX  GID index (default $RXE_GID_INDEX, else 1)
#   -a ADDR       address the client connects to (default $RXE_IP, else 10.99.0.1)
#   -o OPS        comma-separated from write,read (default write,read)
#   SIZE          bytes, or with a K/M/G suffix (binary); ITERS (perftest
#                 accepts 5 or more) defaults to what moves about 64 MiB,
#                 at least 5, at most 1000
# Default sizes: 1M:20 64M:5 (TCG Soft-RoCE moves about 30-40 MB/s, so
# 64M:5 takes about 10 s per op).
# VMPERF_TIMEOUT: seconds per perftest process (default: 30 + 1 s per 4 MiB).
# Exits non-zero if any run fails.

vmperf_log() {
    printf 'vm-perftest: %s\n' "$*" >&2
}

# Bytes from "64M", "1K", "4096".
vmperf_bytes() {
    local s="$1" n mult=1
    case "$s" in
    *[kK]) n="${s%?}" mult=1024 ;;
    *[mM]) n="${s%?}" mult=$((1024 * 1024)) ;;
    *[gG]) n="${s%?}" mult=$((1024 * 1024 * 1024)) ;;
    *) n="$s" ;;
    esac
    [[ "$n" =~ ^[0-9]+$ ]] || return 1
    echo $((n * mult))
}

# Waits (at most 20 s) until something listens on TCP port $1; gives up at
# once when process $2 (the server) has exited.
vmperf_wait_listen() {
    local port="$1" pid="$2" deadline=$((SECONDS + 20))
    while ((SECONDS < deadline)); do
        kill -0 "$pid" 2>/dev/null || return 1
        if ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}

vmperf_port=18515

# vmperf_run OP SIZE ITERS: one perftest server+client pair; prints the line.
vmperf_run() {
    local op="$1" size="$2" iters="$3"
    local tool="ib_${op}_bw" port limit dir spid rc=0 line
    local dev="${VMPERF_DEV:-${RXE_DEV:-rxe0}}" gid="${VMPERF_GID:-${RXE_GID_INDEX:-1}}"
    local addr="${VMPERF_ADDR:-${RXE_IP:-10.99.0.1}}"
    local common=(-d "$dev" -x "$gid" -i 1 -F -s "$size" -n "$iters")

    port=$vmperf_port
    vmperf_port=$((vmperf_port + 1))
    limit="${VMPERF_TIMEOUT:-$((30 + size * iters / (4 * 1024 * 1024)))}"
    dir="$(mktemp -d "${TMPDIR:-/tmp}/vm-perftest.XXXXXX")"

    timeout -k 5 "$limit" "$tool" "${common[@]}" -p "$port" >"$dir/server" 2>&1 &
    spid=$!
    if ! vmperf_wait_listen "$port" "$spid"; then
        vmperf_log "$tool server did not listen on port $port"
        rc=1
    elif ! timeout -k 5 "$limit" "$tool" "${common[@]}" -p "$port" "$addr" >"$dir/client" 2>&1; then
        vmperf_log "$tool client failed (size $size, iterations $iters, limit ${limit}s)"
        rc=1
    fi
    wait "$spid" || {
        vmperf_log "$tool server failed"
        rc=1
    }
    if ((rc == 0)); then
        # The result row follows the "#bytes" header: bytes iters peak avg Mpps.
        line="$(awk '/#bytes/ { hdr = 1; next }
            hdr && $1 ~ /^[0-9]+$/ && NF >= 5 {
                bps = $4 * 1048576
                printf "%12d  %10d  %10.4f  %13.8f\n", $1, $2, bps / 1e9, bps / $1 / 1e6
                exit
            }' "$dir/client")"
        if [[ -n "$line" ]]; then
            printf '%s\n' "$line"
        else
            vmperf_log "$tool: no result row in the client output"
            rc=1
        fi
    fi
    if ((rc != 0)); then
        for f in server client; do
            [[ -f "$dir/$f" ]] || continue
            vmperf_log "---- $tool $f output (tail)"
            tail -n 20 "$dir/$f" >&2
        done
    fi
    rm -rf "$dir"
    return "$rc"
}

vmperf_main() {
    local ops=write,read opt OPTIND=1 spec size iters op i failed=0
    local -a specs sizes=() counts=() oplist
    while getopts 'd:x:a:o:h' opt; do
        case "$opt" in
        d) VMPERF_DEV="$OPTARG" ;;
        x) VMPERF_GID="$OPTARG" ;;
        a) VMPERF_ADDR="$OPTARG" ;;
        o) ops="$OPTARG" ;;
        *)
            sed -n '2,/^$/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
            return 2
            ;;
        esac
    done
    shift $((OPTIND - 1))
    specs=("$@")
    ((${#specs[@]} > 0)) || specs=(1M:20 64M:5)

    # Check every argument before running anything.
    IFS=, read -r -a oplist <<<"$ops"
    for op in "${oplist[@]}"; do
        case "$op" in
        write | read) ;;
        *)
            vmperf_log "unknown op '$op' (write, read)"
            return 2
            ;;
        esac
    done
    for spec in "${specs[@]}"; do
        if ! size="$(vmperf_bytes "${spec%%:*}")" || ((size == 0)); then
            vmperf_log "bad size in '$spec'"
            return 2
        fi
        if [[ "$spec" == *:* ]]; then
            iters="${spec#*:}"
        else
            iters=$((64 * 1024 * 1024 / size))
            ((iters >= 5)) || iters=5
            ((iters <= 1000)) || iters=1000
        fi
        if ! [[ "$iters" =~ ^[0-9]+$ ]] || ((iters < 5)); then
            vmperf_log "bad iterations in '$spec' (perftest needs 5 or more)"
            return 2
        fi
        sizes+=("$size")
        counts+=("$iters")
    done

    for op in "${oplist[@]}"; do
        printf '# ib_%s_bw dev=%s gid_index=%s (GB/s = 1e9 bytes/s)\n' "$op" \
            "${VMPERF_DEV:-${RXE_DEV:-rxe0}}" "${VMPERF_GID:-${RXE_GID_INDEX:-1}}"
        printf '# %10s  %10s  %10s  %13s\n' size_bytes iterations GB/s msg_rate_Mpps
        for i in "${!sizes[@]}"; do
            vmperf_run "$op" "${sizes[$i]}" "${counts[$i]}" || failed=1
        done
    done
    return "$failed"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    set -euo pipefail
    vmperf_main "$@"
fi
