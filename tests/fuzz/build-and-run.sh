#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Build the libFuzzer targets with clang (libFuzzer + ASan + UBSan) and run each for a while.
#   tests/fuzz/build-and-run.sh BUILD_DIR [SECONDS [TARGET...]]   (SECONDS default 30 per target)
# Targets (default: all): metadata (sc_metadata_verify), peer (peer frame decoder and both sides
# of the hello), config (command line and environment), keys (the --key-file parser), fast (the
# fast path's PREPARE/UNPREPARE decoder, ring indices and doorbells against a hostile worker that
# also flips its doorbells' O_NONBLOCK).
# BUILD_DIR is a cmake build dir of this repo: its gen/ holds the protobuf-c code and its
# build_config.h the version (built here with `cmake --build BUILD_DIR --target sc_proto` when
# missing). Output goes to BUILD_DIR/fuzz/: seeds/<target>/ (generated first by the target's seed
# generator, from real encoders, a real hello and the --help text), corpus/<target>/ (what the
# fuzzer found), artifacts/ (crashing inputs: rerun one with BUILD_DIR/fuzz/fuzz_<target> FILE;
# once fixed, keep it in tests/fuzz/regressions/<target>/, which every run reads first).
# Exit status: 0 when no target crashed, 1 otherwise. Extra libFuzzer flags in FUZZ_FLAGS.
# scripts/test.sh runs every target for 20 s (SC_SKIP_FUZZ=1 skips); longer by hand, e.g.
#   tests/fuzz/build-and-run.sh build 600 peer
set -eu

if [ $# -lt 1 ]; then
	echo "usage: $0 BUILD_DIR [SECONDS [TARGET...]]" >&2
	exit 2
fi
BUILD=$(cd "$1" && pwd)
SECONDS_TO_RUN=${2:-30}
[ $# -ge 2 ] && shift 2 || shift $#
TARGETS=${*:-metadata peer config keys fast}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
CC=${CC:-clang}
if ! command -v "$CC" >/dev/null 2>&1; then
	CC=clang-14
fi

GEN=$BUILD/gen
PB_C=$GEN/rdma_sidecar/v1/sidecar.pb-c.c
if [ ! -f "$PB_C" ] || [ ! -f "$BUILD/build_config.h" ]; then
	cmake --build "$BUILD" --target sc_proto >/dev/null 2>&1 || true
fi
if [ ! -f "$PB_C" ]; then
	# The cmake build dir may not configure (yet); generate the code the same way it would.
	mkdir -p "$GEN"
	protoc-c --proto_path="$SRC/proto" --c_out="$GEN" "$SRC/proto/rdma_sidecar/v1/sidecar.proto"
fi

OUT=$BUILD/fuzz
mkdir -p "$OUT/artifacts"

CFLAGS="-std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -Wall -Wextra -Wno-unused-parameter
	-I$GEN -I$SRC/sidecar -I$SRC/include -I$BUILD"
S=$SRC/sidecar
status=0
for t in $TARGETS; do
	case $t in
	metadata) SOURCES="$S/base/status.c $S/meta/keys.c $S/base/base64.c $S/meta/metadata.c $S/meta/runs.c $PB_C"
		LIBS="-lprotobuf-c -lcrypto" ;;
	peer) SOURCES="$S/base/status.c $S/meta/keys.c $S/base/base64.c $S/meta/metadata.c $S/meta/runs.c $S/peer/proto.c $S/peer/tls.c $S/os/fault_guard.c $S/os/file_sig.c $S/conf/config.c $S/conf/rail_filter.c $S/base/parse.c $S/base/log.c $S/base/timer.c $PB_C"
		LIBS="-lprotobuf-c -lssl -lcrypto -lpthread" ;;
	config) SOURCES="$S/base/status.c $S/conf/config.c $S/conf/rail_filter.c $S/base/parse.c $S/base/log.c $S/base/timer.c"
		LIBS="-lcrypto -lpthread" ;;
	keys) SOURCES="$S/base/status.c $S/meta/keys.c $S/base/base64.c $S/meta/metadata.c $S/meta/runs.c $PB_C"
		LIBS="-lprotobuf-c -lcrypto" ;;
	fast) SOURCES="$S/base/status.c $S/fast/wire.c $S/fast/bell.c"
		LIBS="" ;;
	*) echo "unknown fuzz target $t (metadata, peer, config, keys, fast)" >&2; exit 2 ;;
	esac
	mkdir -p "$OUT/seeds/$t" "$OUT/corpus/$t"
	echo "== building fuzz_$t with $CC"
	# shellcheck disable=SC2086
	"$CC" $CFLAGS -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
		$SOURCES "$SRC/tests/fuzz/fuzz_$t.c" $LIBS -o "$OUT/fuzz_$t"
	# shellcheck disable=SC2086
	"$CC" $CFLAGS -DSC_FUZZ_GEN_SEEDS -fsanitize=address,undefined -fno-sanitize-recover=all \
		$SOURCES "$SRC/tests/fuzz/fuzz_$t.c" $LIBS -o "$OUT/fuzz_${t}_seeds"
	echo "== generating $t seeds"
	"$OUT/fuzz_${t}_seeds" "$OUT/seeds/$t"
	# Inputs that once crashed a target (tests/fuzz/regressions/<target>/) run first, every time.
	REGRESSIONS=
	[ -d "$SRC/tests/fuzz/regressions/$t" ] && REGRESSIONS="$SRC/tests/fuzz/regressions/$t"
	echo "== fuzzing $t for ${SECONDS_TO_RUN} s"
	rc=0
	# shellcheck disable=SC2086
	"$OUT/fuzz_$t" -max_total_time="$SECONDS_TO_RUN" -max_len=16384 -timeout=10 \
		-rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$OUT/artifacts/$t-" \
		${FUZZ_FLAGS:-} "$OUT/corpus/$t" "$OUT/seeds/$t" $REGRESSIONS >"$OUT/$t.log" 2>&1 || rc=$?
	grep -E '^stat::number_of_executed_units|^stat::new_units_added' "$OUT/$t.log" | sed "s/^/$t: /" || true
	if [ "$rc" != 0 ]; then
		echo "fuzz_$t FAILED (exit $rc): see $OUT/$t.log and $OUT/artifacts/"
		tail -40 "$OUT/$t.log"
		status=1
	else
		echo "fuzz_$t: no crash in ${SECONDS_TO_RUN} s"
	fi
done
exit $status
