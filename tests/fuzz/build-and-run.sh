#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Build the metadata fuzzer with clang (libFuzzer + ASan + UBSan) and run it.
#   tests/fuzz/build-and-run.sh BUILD_DIR [SECONDS]      (SECONDS default 30)
# BUILD_DIR is a cmake build dir of this repo: its gen/ holds the protobuf-c code (built here with
# `cmake --build BUILD_DIR --target sc_proto` when missing). Output goes to BUILD_DIR/fuzz/:
# seeds/ (valid texts and payloads generated first), corpus/ (what the fuzzer found), artifacts/
# (crashing inputs). Exit status: 0 when no crash, libFuzzer's status otherwise.
# Extra libFuzzer flags may be passed in FUZZ_FLAGS (e.g. FUZZ_FLAGS=-jobs=4).
set -eu

if [ $# -lt 1 ]; then
	echo "usage: $0 BUILD_DIR [SECONDS]" >&2
	exit 2
fi
BUILD=$(cd "$1" && pwd)
SECONDS_TO_RUN=${2:-30}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
CC=${CC:-clang}
if ! command -v "$CC" >/dev/null 2>&1; then
	CC=clang-14
fi

GEN=$BUILD/gen
PB_C=$GEN/rdma_sidecar/v1/sidecar.pb-c.c
if [ ! -f "$PB_C" ]; then
	cmake --build "$BUILD" --target sc_proto >/dev/null 2>&1 || true
fi
if [ ! -f "$PB_C" ]; then
	# The cmake build dir may not configure (yet); generate the code the same way it would.
	mkdir -p "$GEN"
	protoc-c --proto_path="$SRC/proto" --c_out="$GEN" "$SRC/proto/rdma_sidecar/v1/sidecar.proto"
fi

OUT=$BUILD/fuzz
mkdir -p "$OUT/seeds" "$OUT/corpus" "$OUT/artifacts"

SOURCES="$SRC/sidecar/status.c $SRC/sidecar/keys.c $SRC/sidecar/base64.c $SRC/sidecar/metadata.c"
CFLAGS="-std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -Wall -Wextra -Wno-unused-parameter
	-I$GEN -I$SRC/sidecar"
LIBS="-lprotobuf-c -lcrypto"

echo "== building fuzz_metadata with $CC"
# shellcheck disable=SC2086
"$CC" $CFLAGS -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	$SOURCES "$PB_C" "$SRC/tests/fuzz/fuzz_metadata.c" $LIBS -o "$OUT/fuzz_metadata"
# shellcheck disable=SC2086
"$CC" $CFLAGS -DSC_FUZZ_GEN_SEEDS -fsanitize=address,undefined -fno-sanitize-recover=all \
	$SOURCES "$PB_C" "$SRC/tests/fuzz/fuzz_metadata.c" $LIBS -o "$OUT/fuzz_metadata_seeds"

echo "== generating seeds"
"$OUT/fuzz_metadata_seeds" "$OUT/seeds"

echo "== fuzzing for ${SECONDS_TO_RUN} s"
# shellcheck disable=SC2086
"$OUT/fuzz_metadata" -max_total_time="$SECONDS_TO_RUN" -max_len=16384 -timeout=10 \
	-rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$OUT/artifacts/" \
	${FUZZ_FLAGS:-} "$OUT/corpus" "$OUT/seeds"
