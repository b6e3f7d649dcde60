/* SPDX-License-Identifier: Apache-2.0 */
/*
 * conf/config.c: the daemon's configuration. Defaults, then RDMA_SIDECAR_<NAME> environment twins,
 * then command-line flags (the flag wins). One table (sc_options) names every option once: the
 * parser, the environment lookup and the --help text all read it, so an option cannot exist in one
 * and be missing from another. Values are checked for syntax here (the value parsers themselves,
 * HOST:PORT, sizes, durations, uid lists, are base/parse.c's); nothing is bound or opened.
 *
 * Runs on the main thread at start-up. No global state: sc_config_parse may be called any number
 * of times (the tests do). The struct sc_config owns every string it points to.
 */
#include "conf/config.h"
#include "conf/rail_filter.h"
#include "base/parse.h"

#include "build_config.h"

#include <ctype.h>
#include <stddef.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ENV_PREFIX "RDMA_SIDECAR_"
#define ID_MAX_LEN 100
/* Hostname part of the default id: pod names run to 63 characters, and a cut must never eat the
 * random suffix wherever the id is stored in a shorter field (engine/engine.h SC_ID_MAX is 40). */
#define ID_HOST_MAX 32
#define LABEL_MAX 64	/* "--max-concurrent-transfers" or "RDMA_SIDECAR_MAX_CONCURRENT_..." */

enum opt_id {
	OPT_ID,
	OPT_NATS_URL,
	OPT_GRPC_LISTEN,
	OPT_HEALTH_LISTEN,
	OPT_REFLECTION,
	OPT_GRPC_TLS_CERT,
	OPT_GRPC_TLS_KEY,
	OPT_GRPC_TLS_CLIENT_CA,
	OPT_GRPC_TOKEN_FILE,
	OPT_UNIX_SOCKET_MODE,
	OPT_ALLOWED_UIDS,
	OPT_GRPC_THREADS,
	OPT_MAX_MESSAGE_SIZE,
	OPT_FAST_PATH_SOCKET,
	OPT_FAST_PATH_MAX_SESSIONS,
	OPT_DATA_LISTEN,
	OPT_ADVERTISE,
	OPT_BACKENDS,
	OPT_SHM_DIR,
	OPT_TCP_STREAMS,
	OPT_TCP_CHUNK_SIZE,
	OPT_KEY_FILE,
	OPT_PEER_TLS_CERT,
	OPT_PEER_TLS_KEY,
	OPT_PEER_TLS_CA,
	OPT_PEER_IDENTITY,
	OPT_PEER_IDENTITY_REQUIRED,
	OPT_TLS_RELOAD_INTERVAL,
	OPT_NATS_TLS_CA,
	OPT_NATS_TLS_CERT,
	OPT_NATS_TLS_KEY,
	OPT_NATS_CREDS,
	OPT_NATS_NKEY_SEED,
	OPT_DATA_MAX_UNAUTH_PER_IP,
	OPT_DATA_MAX_UNAUTH,
	OPT_DATA_FIRST_BYTE_TIMEOUT,
	OPT_DATA_MAX_PEERS,
	OPT_DATA_IO_THREADS,
	OPT_IB_DEVICE,
	OPT_IB_DEVICES,
	OPT_WARM_PEERS,
	OPT_IB_STALL_TIMEOUT,
	OPT_IB_PORT,
	OPT_IB_GID_INDEX,
	OPT_IB_STRIPE_MIN,
	OPT_IB_SLICE_SIZE,
	OPT_IB_MAX_QPS,
	OPT_OFI_PROVIDER,
	OPT_OFI_DOMAINS,
	OPT_OFI_MAX_PEERS,
	OPT_OFI_STRIPE_MIN,
	OPT_OFI_HMEM,
	OPT_OFI_STALL_TIMEOUT,
	OPT_DEFAULT_TIMEOUT,
	OPT_RETENTION,
	OPT_CANCEL_WAIT,
	OPT_GRACE_PERIOD,
	OPT_MAX_CONCURRENT_TRANSFERS,
	OPT_MAX_INFLIGHT_BYTES,
	OPT_MAX_PROGRESS_RECORDS,
	OPT_PROGRESS_GRACE,
	OPT_MAX_REGION_SIZE,
	OPT_REGISTER_DIR,
	OPT_MAX_REGIONS,
	OPT_MAX_OPERATIONS,
	OPT_MAX_DESCRIPTORS,
	OPT_MAX_TOTAL_REGION_BYTES,
	OPT_NATS_SUBJECT_PREFIX,
	OPT_NATS_HANDOFF,
	OPT_NATS_STREAM,
	OPT_NATS_STREAM_REPLICAS,
	OPT_LOG_LEVEL,
	OPT_LOG_JSON,
	OPT_METRICS_LISTEN,
	OPT_HELP,
	OPT_VERSION,
};

enum opt_kind {
	K_CUSTOM = 0, /* apply() has a case of its own for it */
	K_STR,	      /* a string; "" leaves it unset */
	K_HOSTPORT,   /* HOST:PORT (empty_ok: "" turns it off) */
	K_BOOL,
	K_U32, /* an integer in [min, max] */
	K_INT,
	K_SIZE,	    /* a size with units in [size_min, size_max] */
	K_SIZE_ANY, /* a size with units */
	K_DURATION, /* a duration with units, in ms */
};

enum opt_arg {
	ARG_REQUIRED, /* --name VALUE or --name=VALUE */
	ARG_BOOL,     /* --name alone means true; --name=VALUE takes 1/true/yes/0/false/no */
	ARG_NONE,     /* --help, --version: no value, no environment twin */
};

struct sc_option {
	enum opt_id id;
	const char *name; /* long flag without dashes */
	char short_name;  /* 0 = none */
	enum opt_arg arg;
	const char *value; /* placeholder shown in --help */
	const char *group; /* --help heading; a new heading starts when it changes */
	const char *help;
	const char *def; /* default as shown in --help; NULL = none shown */
	/* How apply() sets it: a typed field of struct sc_config, or K_CUSTOM (its own case). */
	enum opt_kind kind;
	size_t field;	      /* offsetof(struct sc_config, ...) */
	bool empty_ok;	      /* K_HOSTPORT: "" turns it off */
	long long min, max;   /* K_U32, K_INT */
	uint64_t size_min, size_max; /* K_SIZE, with the range as the error message says it */
	const char *range;
};

/* Typed table entries (the field names of struct sc_config). */
#define T_FIELD(k, f) .kind = (k), .field = offsetof(struct sc_config, f)
#define T_STR(f) T_FIELD(K_STR, f)
#define T_HOSTPORT(f, e) T_FIELD(K_HOSTPORT, f), .empty_ok = (e)
#define T_BOOL(f) T_FIELD(K_BOOL, f)
#define T_U32(f, lo, hi) T_FIELD(K_U32, f), .min = (lo), .max = (hi)
#define T_INT(f, lo, hi) T_FIELD(K_INT, f), .min = (lo), .max = (hi)
#define T_SIZE(f, lo, hi, text) T_FIELD(K_SIZE, f), .size_min = (lo), .size_max = (hi), .range = (text)
#define T_SIZE_ANY(f) T_FIELD(K_SIZE_ANY, f)
#define T_DURATION(f) T_FIELD(K_DURATION, f)

/* One option per paragraph reads better than clang-format's one field per line. */
/* clang-format off */
static const struct sc_option sc_options[] = {
	{.id = OPT_ID, .name = "id", .arg = ARG_REQUIRED, .value = "ID", .group = "General",
	 .help = "name in metadata and logs: 1-100 of A-Z a-z 0-9 . _ -",
	 .def = "<hostname>-<6 random hex>"},
	{.id = OPT_NATS_URL, .name = "nats-url", .arg = ARG_REQUIRED, .value = "URL",
	 .group = "General",
	 .help = "NATS for metadata exchange: nats://HOST:PORT[,...]; empty = off",
	 .def = "off"},
	{.id = OPT_NATS_HANDOFF, .name = "nats-handoff", .arg = ARG_REQUIRED, .value = "MODE",
	 .group = "General",
	 .help = "how PublishMetadata hands metadata over: jetstream keeps it in a JetStream "
		 "stream until its operation ends, so a reader that subscribes later still gets "
		 "it (needs a server with JetStream, nats-server -js); core uses plain NATS "
		 "subjects: metadata published before the reader subscribes is LOST, and so is "
		 "what is published while a subscriber's NATS connection is down",
	 .def = "jetstream"},
	{.id = OPT_NATS_STREAM, T_STR(nats_stream), .name = "nats-stream", .arg = ARG_REQUIRED,
	 .value = "NAME", .group = "General",
	 .help = "JetStream stream that keeps published metadata (jetstream hand-off); created "
		 "on first use with subjects NAME.>, one message per subject, 1 GiB, file storage, "
		 "max age 7 days, unless it exists (an operator's, with one subject ROOT.>)",
	 .def = "RDMA_SIDECAR_METADATA"},
	{.id = OPT_NATS_STREAM_REPLICAS, T_U32(nats_stream_replicas, 0, 5),
	 .name = "nats-stream-replicas", .arg = ARG_REQUIRED, .value = "N", .group = "General",
	 .help = "replicas of a stream the sidecar creates, 1-5; 0 = 3 when --nats-url names "
		 "(or the server reports) at least 3 servers, else 1",
	 .def = "0"},
	{.id = OPT_WARM_PEERS, T_BOOL(warm_peers), .name = "warm-peers", .arg = ARG_BOOL,
	 .group = "General",
	 .help = "connect to the issuer of metadata received on a NATS subscription in the "
		 "background, before the worker's first transfer to it (--no-warm-peers: off)",
	 .def = "on"},
	{.id = OPT_HELP, .name = "help", .short_name = 'h', .arg = ARG_NONE, .group = "General",
	 .help = "print this help and exit"},
	{.id = OPT_VERSION, .name = "version", .short_name = 'V', .arg = ARG_NONE,
	 .group = "General", .help = "print the version and exit"},

	{.id = OPT_GRPC_LISTEN, .name = "grpc-listen", .arg = ARG_REQUIRED, .value = "ADDR",
	 .group = "gRPC",
	 .help = "for workers: unix:/ABS/PATH, HOST:PORT or [V6]:PORT; repeatable, up to 8 "
		 "(env: comma list)",
	 .def = "unix:/tmp/rdma-sidecar/sidecar.sock"},
	{.id = OPT_HEALTH_LISTEN, T_HOSTPORT(health_listen, true), .name = "health-listen", .arg = ARG_REQUIRED,
	 .value = "HOST:PORT", .group = "gRPC",
	 .help = "health-only listener for probes: grpc.health.v1.Health and nothing else",
	 .def = "off"},
	{.id = OPT_REFLECTION, T_BOOL(reflection), .name = "reflection", .arg = ARG_BOOL, .group = "gRPC",
	 .help = "gRPC server reflection (grpc.reflection.v1, v1alpha) on --grpc-listen, never on "
		 "--health-listen; --no-reflection or --reflection=false turns it off",
	 .def = "on"},
	{.id = OPT_GRPC_TLS_CERT, T_STR(grpc_tls_cert), .name = "grpc-tls-cert", .arg = ARG_REQUIRED, .value = "PEM",
	 .group = "gRPC", .help = "TLS certificate chain for the TCP --grpc-listen addresses",
	 .def = "none: plain TCP"},
	{.id = OPT_GRPC_TLS_KEY, T_STR(grpc_tls_key), .name = "grpc-tls-key", .arg = ARG_REQUIRED, .value = "PEM",
	 .group = "gRPC", .help = "private key of --grpc-tls-cert", .def = "none"},
	{.id = OPT_GRPC_TLS_CLIENT_CA, T_STR(grpc_tls_client_ca), .name = "grpc-tls-client-ca", .arg = ARG_REQUIRED,
	 .value = "PEM", .group = "gRPC",
	 .help = "CA certificates: TCP clients must present a certificate signed by one (mTLS)",
	 .def = "none"},
	{.id = OPT_GRPC_TOKEN_FILE, T_STR(grpc_token_file), .name = "grpc-token-file", .arg = ARG_REQUIRED,
	 .value = "PATH", .group = "gRPC",
	 .help = "TCP calls need metadata \"authorization: Bearer <file content>\"; SIGHUP "
		 "reloads",
	 .def = "none"},
	{.id = OPT_UNIX_SOCKET_MODE, .name = "unix-socket-mode", .arg = ARG_REQUIRED,
	 .value = "OCTAL", .group = "gRPC",
	 .help = "file mode of the unix sockets, whatever the umask (0600-0777 octal)",
	 .def = "0660"},
	{.id = OPT_ALLOWED_UIDS, .name = "allowed-uids", .arg = ARG_REQUIRED, .value = "LIST",
	 .group = "gRPC",
	 .help = "only these uids may call over the unix sockets (SO_PEERCRED), e.g. 0,1000",
	 .def = "any uid that can open the socket"},
	{.id = OPT_GRPC_THREADS, T_U32(grpc_threads, 1, 64), .name = "grpc-threads", .arg = ARG_REQUIRED, .value = "N",
	 .group = "gRPC", .help = "threads serving gRPC calls, 1-64", .def = "4"},
	{.id = OPT_MAX_MESSAGE_SIZE, T_SIZE(max_message_bytes, SC_KIB, SC_GIB, "1KiB-1GiB"), .name = "max-message-size", .arg = ARG_REQUIRED,
	 .value = "SIZE", .group = "gRPC",
	 .help = "largest gRPC message sent or received, 1KiB-1GiB", .def = "64MiB"},
	{.id = OPT_FAST_PATH_SOCKET, T_STR(fast_path_socket), .name = "fast-path-socket",
	 .arg = ARG_REQUIRED, .value = "PATH", .group = "Fast path",
	 .help = "unix socket of the shared-memory fast path for small repeated transfers (same "
		 "--unix-socket-mode and --allowed-uids as gRPC); \"off\" turns it off",
	 .def = "the first unix --grpc-listen socket + \".fast\"; off without one (or when that is "
		"too long)"},
	{.id = OPT_FAST_PATH_MAX_SESSIONS, T_U32(fast_path_max_sessions, 1, 1024),
	 .name = "fast-path-max-sessions", .arg = ARG_REQUIRED, .value = "N", .group = "Fast path",
	 .help = "fast-path sessions (worker connections, a thread each) at once, 1-1024; more are "
		 "refused with a message. With --allowed-uids each uid holds at most its share: N "
		 "over the number of listed uids, at least 1",
	 .def = "64"},

	{.id = OPT_DATA_LISTEN, .name = "data-listen", .arg = ARG_REQUIRED, .value = "HOST:PORT[,...]",
	 .group = "Data plane",
	 .help = "where peer sidecars connect; port 0 = ephemeral; a comma list (up to 4) serves "
		 "on each, one TCP path (rail) per interface",
	 .def = "0.0.0.0:0"},
	{.id = OPT_ADVERTISE, .name = "advertise", .arg = ARG_REQUIRED, .value = "HOST|if:NAME[,...]",
	 .group = "Data plane",
	 .help = "address peers dial, put into metadata; a comma list: one per --data-listen "
		 "endpoint, same order; if:NAME (e.g. if:net1) takes the address of network "
		 "interface NAME at start and follows it when it changes",
	 .def = "derived from the data listener"},
	{.id = OPT_BACKENDS, .name = "backends", .arg = ARG_REQUIRED, .value = "LIST",
	 .group = "Data plane",
	 .help = "comma list of tcp, ibverbs, libfabric, local, or all", .def = "all available"},
	{.id = OPT_SHM_DIR, .name = "shm-dir", .arg = ARG_REQUIRED, .value = "DIR",
	 .group = "Data plane", .help = "directory of region files shared with workers",
	 .def = "/dev/shm"},
	{.id = OPT_TCP_STREAMS, T_U32(tcp_streams, 1, 16), .name = "tcp-streams", .arg = ARG_REQUIRED, .value = "N",
	 .group = "Data plane",
	 .help = "parallel TCP connections per transfer, spread over its paths (at least one each), 1-16",
	 .def = "2"},
	{.id = OPT_TCP_CHUNK_SIZE, T_SIZE(tcp_chunk_bytes, 64 * SC_KIB, SC_GIB, "64KiB-1GiB"), .name = "tcp-chunk-size", .arg = ARG_REQUIRED, .value = "SIZE",
	 .group = "Data plane", .help = "bytes per TCP data chunk, 64KiB-1GiB", .def = "8MiB"},
	{.id = OPT_DATA_MAX_UNAUTH_PER_IP, T_U32(data_max_unauth_per_ip, 1, 1024), .name = "data-max-unauth-per-ip", .arg = ARG_REQUIRED,
	 .value = "N", .group = "Data plane",
	 .help = "data connections one address may hold before its hello, 1-1024", .def = "16"},
	{.id = OPT_DATA_MAX_UNAUTH, T_U32(data_max_unauth, 1, 1024), .name = "data-max-unauth", .arg = ARG_REQUIRED, .value = "N",
	 .group = "Data plane",
	 .help = "data connections before their hello, all addresses, 1-1024; when full, the "
		 "oldest silent one is closed for a new one",
	 .def = "64"},
	{.id = OPT_DATA_FIRST_BYTE_TIMEOUT, .name = "data-first-byte-timeout", .arg = ARG_REQUIRED,
	 .value = "DURATION", .group = "Data plane",
	 .help = "a data connection that sends nothing for this long after it is accepted is "
		 "closed, 10ms-60s (its TLS handshake and hello then have 2s more)",
	 .def = "1s"},

	{.id = OPT_DATA_MAX_PEERS, T_U32(data_max_peers, 1, 65536), .name = "data-max-peers", .arg = ARG_REQUIRED,
	 .value = "N", .group = "Data plane",
	 .help = "authenticated peer connections served at once, 1-65536; at the limit the "
		 "longest idle one is closed for a new peer, and only when all are busy is it refused",
	 .def = "1024"},
	{.id = OPT_DATA_IO_THREADS, T_U32(data_io_threads, 1, 256), .name = "data-io-threads",
	 .arg = ARG_REQUIRED, .value = "N", .group = "Data plane",
	 .help = "threads waiting for peer requests, 1-256; idle peer connections hold none (epoll). "
		 "While all are busy one more starts per request in progress; extra ones end when idle",
	 .def = "4"},
	{.id = OPT_KEY_FILE, T_STR(key_file), .name = "key-file", .arg = ARG_REQUIRED, .value = "PATH",
	 .group = "Security",
	 .help = "metadata keys, lines KEY_ID:BASE64KEY; first signs, all verify; SIGHUP reloads",
	 .def = "none: transfers inside this sidecar only"},
	{.id = OPT_REGISTER_DIR, .name = "register-dir", .arg = ARG_REQUIRED, .value = "DIR",
	 .group = "Security",
	 .help = "RegisterRegion may also map files beneath DIR (besides --shm-dir); repeatable, "
		 "up to 16 (env: comma list)",
	 .def = "none"},
	{.id = OPT_NATS_SUBJECT_PREFIX, .name = "nats-subject-prefix", .arg = ARG_REQUIRED,
	 .value = "PREFIX", .group = "Security",
	 .help = "Publish/SubscribeMetadata subjects must start with PREFIX (e.g. team-a.)",
	 .def = "any subject"},
	{.id = OPT_PEER_TLS_CERT, T_STR(peer_tls_cert), .name = "peer-tls-cert", .arg = ARG_REQUIRED, .value = "PEM",
	 .group = "Security",
	 .help = "this sidecar's certificate (chain) for TLS 1.3 on the peer data channel; needs "
		 "--peer-tls-key and --peer-tls-ca",
	 .def = "none: peer data in clear text"},
	{.id = OPT_PEER_TLS_KEY, T_STR(peer_tls_key), .name = "peer-tls-key", .arg = ARG_REQUIRED, .value = "PEM",
	 .group = "Security", .help = "private key of --peer-tls-cert", .def = "none"},
	{.id = OPT_PEER_TLS_CA, T_STR(peer_tls_ca), .name = "peer-tls-ca", .arg = ARG_REQUIRED, .value = "PEM",
	 .group = "Security",
	 .help = "cluster CA: peers must present a certificate it signed (both directions)",
	 .def = "none"},
	{.id = OPT_PEER_IDENTITY, .name = "peer-identity", .arg = ARG_REQUIRED, .value = "SOURCE",
	 .group = "Security",
	 .help = "with peer TLS, the name in a peer's certificate that is its sidecar id: spiffe "
		 "(URI SAN spiffe://TRUST-DOMAIN/.../ID, same trust domain as ours), dns (a DNS SAN), "
		 "cn (subject CN) or off (the id its hello claims)",
	 .def = "spiffe"},
	{.id = OPT_PEER_IDENTITY_REQUIRED, T_BOOL(peer_identity_required), .name = "peer-identity-required",
	 .arg = ARG_BOOL, .group = "Security",
	 .help = "refuse peers whose certificate names no identity, and start only with peer TLS "
		 "and a certificate of our own that names --id",
	 .def = "off: such peers are served as the id they claim"},
	{.id = OPT_TLS_RELOAD_INTERVAL, T_DURATION(tls_reload_interval_ms), .name = "tls-reload-interval",
	 .arg = ARG_REQUIRED, .value = "DURATION", .group = "Security",
	 .help = "how often the peer and gRPC certificate, key and CA files are checked for "
		 "changes and reloaded; 0 = only on SIGHUP",
	 .def = "10s"},
	{.id = OPT_NATS_TLS_CA, T_STR(nats_tls_ca), .name = "nats-tls-ca", .arg = ARG_REQUIRED, .value = "PEM",
	 .group = "Security", .help = "CA that signed the NATS server's certificate; turns on TLS",
	 .def = "none"},
	{.id = OPT_NATS_TLS_CERT, T_STR(nats_tls_cert), .name = "nats-tls-cert", .arg = ARG_REQUIRED, .value = "PEM",
	 .group = "Security", .help = "client certificate for NATS (with --nats-tls-key)",
	 .def = "none"},
	{.id = OPT_NATS_TLS_KEY, T_STR(nats_tls_key), .name = "nats-tls-key", .arg = ARG_REQUIRED, .value = "PEM",
	 .group = "Security", .help = "private key of --nats-tls-cert", .def = "none"},
	{.id = OPT_NATS_CREDS, T_STR(nats_creds), .name = "nats-creds", .arg = ARG_REQUIRED, .value = "FILE",
	 .group = "Security", .help = "NATS credentials file (user JWT + NKey seed)",
	 .def = "none"},
	{.id = OPT_NATS_NKEY_SEED, T_STR(nats_nkey_seed), .name = "nats-nkey-seed", .arg = ARG_REQUIRED, .value = "FILE",
	 .group = "Security", .help = "NATS NKey seed file (user NKey authentication)",
	 .def = "none"},

	{.id = OPT_IB_DEVICE, T_STR(ib_device), .name = "ib-device", .arg = ARG_REQUIRED, .value = "NAME",
	 .group = "RDMA", .help = "one RDMA device, e.g. mlx5_0 (the same as --ib-devices NAME)",
	 .def = "first active"},
	{.id = OPT_IB_DEVICES, .name = "ib-devices", .arg = ARG_REQUIRED, .value = "LIST",
	 .group = "RDMA",
	 .help = "RDMA ports that are rails: auto, a list in rail order (mlx5_0,mlx5_1:1) or "
		 "^LIST to leave those out",
	 .def = "auto"},
	{.id = OPT_IB_PORT, T_INT(ib_port, 1, 255), .name = "ib-port", .arg = ARG_REQUIRED, .value = "N", .group = "RDMA",
	 .help = "device port, 1-255", .def = "first active"},
	{.id = OPT_IB_STALL_TIMEOUT, T_DURATION(ib_stall_ms), .name = "ib-stall-timeout", .arg = ARG_REQUIRED,
	 .value = "DURATION", .group = "RDMA",
	 .help = "an RDMA transfer none of whose work requests completes for this long has a "
		 "stalled path: it stops, and goes on over tcp when the peer offers it; 0 = never",
	 .def = "10s"},
	{.id = OPT_IB_GID_INDEX, T_INT(ib_gid_index, -1, 255), .name = "ib-gid-index", .arg = ARG_REQUIRED, .value = "N",
	 .group = "RDMA", .help = "GID table index, 0-255, or -1 to pick", .def = "-1, first RoCEv2"},
	{.id = OPT_IB_STRIPE_MIN, T_SIZE_ANY(ib_stripe_min_bytes), .name = "ib-stripe-min", .arg = ARG_REQUIRED, .value = "SIZE",
	 .group = "RDMA", .help = "transfers this large are striped over every usable rail; smaller ones take one (0: never stripe)",
	 .def = "4MiB"},
	{.id = OPT_IB_SLICE_SIZE, T_SIZE(ib_slice_bytes, 64 * SC_KIB, SC_GIB, "64KiB-1GiB"), .name = "ib-slice-size", .arg = ARG_REQUIRED, .value = "SIZE",
	 .group = "RDMA", .help = "bytes per slice of a striped transfer, 64KiB-1GiB", .def = "1MiB"},
	{.id = OPT_IB_MAX_QPS, T_U32(ib_max_qps, 1, 65536), .name = "ib-max-qps", .arg = ARG_REQUIRED, .value = "N",
	 .group = "RDMA",
	 .help = "RDMA queue pairs per rail, 1-65536, for each direction (one per peer that reads or "
		 "writes here, one per peer this sidecar reads or writes); at the cap the least "
		 "recently used idle one is destroyed for a new peer, and only when all are in use is "
		 "the peer refused; incoming ones idle for 180 s expire. Each costs about 16 KiB of "
		 "host memory outgoing (work-request records and notice buffers), 2 KiB incoming, "
		 "plus the NIC's queues and 32 completion-queue entries per incoming QP",
	 .def = "1024"},
	{.id = OPT_OFI_PROVIDER, T_STR(ofi_provider), .name = "ofi-provider", .arg = ARG_REQUIRED, .value = "NAME",
	 .group = "libfabric",
	 .help = "the libfabric provider of the libfabric backend (FI_EP_RDM with FI_RMA): efa, cxi, "
		 "verbs, tcp, or a full fi_info name such as \"tcp;ofi_rxm\". Without it the best "
		 "fabric provider is chosen (efa, cxi, opx, psm3, ...); tcp and sockets (reported as "
		 "TCP-emulating) and verbs (which the ibverbs backend drives natively) only when named",
	 .def = "best available, never tcp/sockets"},
	{.id = OPT_OFI_DOMAINS, T_STR(ofi_domains), .name = "ofi-domains", .arg = ARG_REQUIRED, .value = "LIST",
	 .group = "libfabric",
	 .help = "the provider's domains that are rails, in rail order, comma-separated (EFA: "
		 "rdmap16s27-rdm,...; tcp: interface names such as eth0,eth1); one domain, "
		 "endpoint, address vector and completion queue each",
	 .def = "every domain of the provider, loopback (lo) only when named"},
	{.id = OPT_OFI_MAX_PEERS, T_U32(ofi_max_peers, 1, 1000000), .name = "ofi-max-peers", .arg = ARG_REQUIRED, .value = "N",
	 .group = "libfabric",
	 .help = "address-vector entries per rail, 1-1000000 (one per peer sidecar this one reads "
		 "from or writes to); at the cap the least recently used idle entry is removed "
		 "(fi_av_remove) for a new peer",
	 .def = "1024"},
	{.id = OPT_OFI_STRIPE_MIN, T_SIZE_ANY(ofi_stripe_min_bytes), .name = "ofi-stripe-min", .arg = ARG_REQUIRED, .value = "SIZE",
	 .group = "libfabric",
	 .help = "libfabric transfers this large are striped over every usable rail; smaller ones "
		 "take one (0: never stripe)",
	 .def = "4MiB"},
	{.id = OPT_OFI_HMEM, T_STR(ofi_hmem), .name = "ofi-hmem", .arg = ARG_REQUIRED, .value = "MODE",
	 .group = "libfabric",
	 .help = "GPU memory with libfabric: auto (FI_HMEM_CUDA registration when the provider "
		 "offers FI_HMEM, else staged through host buffers over tcp, with the reason in "
		 "GetInfo) or off (always staged)",
	 .def = "auto"},
	{.id = OPT_OFI_STALL_TIMEOUT, T_DURATION(ofi_stall_ms), .name = "ofi-stall-timeout", .arg = ARG_REQUIRED,
	 .value = "DURATION", .group = "libfabric",
	 .help = "a rail of a libfabric transfer none of whose messages completes for this long "
		 "is given up on for that transfer: its messages go again on the other rails (a cut "
		 "link); the last rail's end the transfer UNAVAILABLE, saying the rail stalled, or, "
		 "when the provider fails them all and the peer offers tcp, the transfer goes on over "
		 "tcp (Operation.backend_reason says so); 0 = never",
	 .def = "5s"},

	{.id = OPT_DEFAULT_TIMEOUT, .name = "default-timeout", .arg = ARG_REQUIRED,
	 .value = "DURATION", .group = "Limits",
	 .help = "operation deadline when a request gives none", .def = "60s"},
	{.id = OPT_RETENTION, T_DURATION(retention_ms), .name = "retention", .arg = ARG_REQUIRED, .value = "DURATION",
	 .group = "Limits", .help = "how long finished operations stay queryable", .def = "5m"},
	{.id = OPT_CANCEL_WAIT, .name = "cancel-wait", .arg = ARG_REQUIRED, .value = "DURATION",
	 .group = "Limits",
	 .help = "how long CancelOperation waits for a moving transfer to stop before it answers "
		 "FAILED_PRECONDITION (the cancel stays under way), 0-30s",
	 .def = "1s"},
	{.id = OPT_GRACE_PERIOD, T_DURATION(grace_ms), .name = "grace-period", .arg = ARG_REQUIRED, .value = "DURATION",
	 .group = "Limits", .help = "on SIGTERM, how long live transfers may finish", .def = "10s"},
	{.id = OPT_MAX_CONCURRENT_TRANSFERS, T_U32(max_concurrent_transfers, 1, UINT32_MAX), .name = "max-concurrent-transfers",
	 .arg = ARG_REQUIRED, .value = "N", .group = "Limits",
	 .help = "transfers moving bytes at once; more wait as SCHEDULED", .def = "64"},
	{.id = OPT_MAX_INFLIGHT_BYTES, T_SIZE(max_inflight_bytes, 1, UINT64_MAX, "at least 1 byte"), .name = "max-inflight-bytes", .arg = ARG_REQUIRED,
	 .value = "SIZE", .group = "Limits", .help = "bytes of running transfers at once",
	 .def = "4GiB"},
	{.id = OPT_MAX_PROGRESS_RECORDS, T_U32(max_progress_records, 1, UINT32_MAX), .name = "max-progress-records",
	 .arg = ARG_REQUIRED, .value = "N", .group = "Limits",
	 .help = "ReportProgress records kept at once (one per request id, about 0.5 KiB each); "
		 "beyond N the oldest that no operation waits on is dropped, logged",
	 .def = "65536"},
	{.id = OPT_PROGRESS_GRACE, T_DURATION(progress_grace_ms), .name = "progress-grace", .arg = ARG_REQUIRED,
	 .value = "DURATION", .group = "Limits",
	 .help = "how long a request's progress is kept once no operation waits on it (for "
		 "operations that arrive after their progress)",
	 .def = "30s"},
	{.id = OPT_MAX_REGION_SIZE, T_SIZE(max_region_bytes, 1, UINT64_MAX, "at least 1 byte"), .name = "max-region-size", .arg = ARG_REQUIRED, .value = "SIZE",
	 .group = "Limits", .help = "largest region a worker may create or register",
	 .def = "64GiB"},
	{.id = OPT_MAX_REGIONS, T_U32(max_regions, 1, UINT32_MAX), .name = "max-regions", .arg = ARG_REQUIRED, .value = "N",
	 .group = "Limits", .help = "regions (created + registered) at once", .def = "4096"},
	{.id = OPT_MAX_OPERATIONS, T_U32(max_operations, 1, UINT32_MAX), .name = "max-operations", .arg = ARG_REQUIRED, .value = "N",
	 .group = "Limits", .help = "operations kept at once, live and retained", .def = "16384"},
	{.id = OPT_MAX_DESCRIPTORS, T_U32(max_descriptors, 1, SC_MAX_DESCRIPTORS), .name = "max-descriptors", .arg = ARG_REQUIRED, .value = "N",
	 .group = "Limits", .help = "descriptors per operation (plain or expanded from compact lists), "
		 "1-1048576; each costs about 64 bytes while its operation lives",
	 .def = "65536"},
	{.id = OPT_MAX_TOTAL_REGION_BYTES, T_SIZE_ANY(max_total_region_bytes), .name = "max-total-region-bytes", .arg = ARG_REQUIRED,
	 .value = "SIZE", .group = "Limits",
	 .help = "bytes of all regions together; 0 = unlimited (CreateRegion is still bounded "
		 "by the free space of --shm-dir)",
	 .def = "0"},

	{.id = OPT_LOG_LEVEL, .name = "log-level", .arg = ARG_REQUIRED, .value = "LEVEL",
	 .group = "Logging and metrics", .help = "debug, info, warn, error or off", .def = "info"},
	{.id = OPT_LOG_JSON, T_BOOL(log_json), .name = "log-json", .arg = ARG_BOOL, .group = "Logging and metrics",
	 .help = "JSON log lines: ts, level, area, msg, then the keys op, peer, backend, rail, bytes, code, "
		 "key_id and trace_id where a line has them (the text form writes them key=value after "
		 "the message; docs/operations/logs.md) (env: 1/true/yes or 0/false/no)", .def = "off"},
	{.id = OPT_METRICS_LISTEN, T_HOSTPORT(metrics_listen, true), .name = "metrics-listen", .arg = ARG_REQUIRED,
	 .value = "HOST:PORT", .group = "Logging and metrics",
	 .help = "serve Prometheus metrics over HTTP here", .def = "off"},
};
/* clang-format on */

#define N_OPTIONS (sizeof(sc_options) / sizeof(sc_options[0]))

/* "grpc-listen" -> "RDMA_SIDECAR_GRPC_LISTEN". */
static void env_name(const struct sc_option *opt, char *buf, size_t cap)
{
	size_t n = (size_t)snprintf(buf, cap, "%s", ENV_PREFIX);
	for (const char *p = opt->name; *p && n + 1 < cap; p++)
		buf[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
	buf[n < cap ? n : cap - 1] = '\0';
}

/* Rewrite err->msg as "<label> <old message>", e.g. `--data-listen "foo": expected ...`. */
static int label_err(struct sc_err *err, const char *label)
{
	if (!err)
		return -1;
	size_t cap = sizeof(err->msg), n = strlen(label) + 1;
	if (n >= cap)
		return -1;
	err->msg[cap - 1] = '\0';
	memmove(err->msg + n, err->msg, cap - n - 1); /* the old text, cut to fit */
	err->msg[cap - 1] = '\0';
	memcpy(err->msg, label, n - 1);
	err->msg[n - 1] = ' ';
	return -1;
}

/* ---- per-option checks ---- */

/* The index of the first character of s[0..n) that an id may not hold, or n. */
static size_t id_bad_char(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (!isalnum(c) && c != '.' && c != '_' && c != '-')
			return i;
	}
	return n;
}

bool sc_config_id_valid(const char *s, size_t len)
{
	return len > 0 && len <= ID_MAX_LEN && id_bad_char(s, len) == len;
}

static int check_id(const char *v, struct sc_err *err)
{
	size_t n = strlen(v);
	if (n == 0 || n > ID_MAX_LEN)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "\"%.*s\": an id has 1-%d characters (got %zu)", SC_VALUE_SHOWN, v,
				  ID_MAX_LEN, n);
	size_t bad = id_bad_char(v, n);
	if (bad < n)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "\"%.*s\": character %zu is not allowed, use only "
				  "A-Z a-z 0-9 . _ -",
				  SC_VALUE_SHOWN, v, bad + 1);
	return 0;
}

/* unix:/abs/path, HOST:PORT or [V6]:PORT. */
static int check_grpc_addr(const char *v, struct sc_err *err)
{
	if (strncmp(v, "unix:", 5) == 0) {
		const char *path = v + 5;
		if (path[0] != '/')
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "\"%.*s\": a unix socket needs an absolute path, e.g. "
					  "unix:/tmp/rdma-sidecar/sidecar.sock",
					  SC_VALUE_SHOWN, v);
		if (strlen(path) >= 108) /* sizeof(sockaddr_un.sun_path) */
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "\"%.*s\": a unix socket path has at most 107 characters",
					  SC_VALUE_SHOWN, v);
		return 0;
	}
	if (strchr(v, ':'))
		return sc_parse_hostport(v, NULL, 0, NULL, err);
	return sc_err_set(err, SC_INVALID_ARGUMENT,
			  "\"%.*s\": expected unix:/ABS/PATH, HOST:PORT or [V6]:PORT (e.g. "
			  "127.0.0.1:50051)",
			  SC_VALUE_SHOWN, v);
}

/* HOST without port: a hostname, an IPv4 address, or an IPv6 address with or without brackets;
 * or if:NAME, a network interface whose address the data plane resolves at start and follows
 * (peer/server.c with net/ifaddr.c; here only the name's syntax is checked). */
static int check_advertise(const char *v, char **out, struct sc_err *err)
{
	size_t n = strlen(v);
	const char *h = v;
	if (strncmp(v, "if:", 3) == 0) {
		const char *name = v + 3;
		size_t len = n - 3;
		bool ok = len > 0 && len < 16 && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
		for (size_t i = 0; ok && i < len; i++)
			ok = name[i] != '/' && name[i] != ':' && (unsigned char)name[i] > ' ' &&
			     (unsigned char)name[i] < 0x7f;
		if (!ok)
			return sc_err_set(
			    err, SC_INVALID_ARGUMENT,
			    "\"%.*s\": expected if:NAME with a network interface name "
			    "of 1 to 15 characters (e.g. if:net1)",
			    SC_VALUE_SHOWN, v);
		*out = strdup(v);
		return *out ? 0 : sc_err_set(err, SC_INTERNAL, "out of memory");
	}
	if (n >= 2 && v[0] == '[' && v[n - 1] == ']') {
		h = v + 1;
		n -= 2;
		if (!sc_valid_ipv6(h, n))
			goto bad;
	} else if (strchr(v, ':')) {
		if (!sc_valid_ipv6(h, n))
			return sc_err_set(
			    err, SC_INVALID_ARGUMENT,
			    "\"%.*s\": expected a HOST without a port (e.g. 10.0.0.5 "
			    "or node1.example); the data port comes from --data-listen",
			    SC_VALUE_SHOWN, v);
	} else if (n == 0 || n > SC_HOST_MAX_LEN || !sc_valid_hostname(h, n)) {
		goto bad;
	}
	*out = strndup(h, n);
	if (!*out)
		return sc_err_set(err, SC_INTERNAL, "out of memory");
	return 0;
bad:
	return sc_err_set(err, SC_INVALID_ARGUMENT,
			  "\"%.*s\": expected a hostname or an IP address (e.g. 10.0.0.5)",
			  SC_VALUE_SHOWN, v);
}

/* --advertise: a comma list of hosts (check_advertise each), one per --data-listen endpoint;
 * stored without brackets, comma-joined. */
static int set_advertise(struct sc_config *cfg, const char *v, struct sc_err *err)
{
	size_t cap = strlen(v) + 1, used = 0;
	char *joined = calloc(1, cap);
	if (!joined)
		return sc_err_set(err, SC_INTERNAL, "out of memory");
	for (const char *p = v;;) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		char *one = strndup(p, len), *h = NULL;
		int rc = one ? check_advertise(one, &h, err)
			     : sc_err_set(err, SC_INTERNAL, "out of memory");
		free(one);
		if (rc != 0) {
			free(joined);
			return -1;
		}
		used += (size_t)snprintf(joined + used, cap - used, "%s%s", used ? "," : "", h);
		free(h);
		if (!comma)
			break;
		p = comma + 1;
	}
	free(cfg->advertise);
	cfg->advertise = joined;
	return 0;
}

/* Show a URL without its user:password@ part. */
static void redact_url(const char *url, size_t len, char *buf, size_t cap)
{
	const char *at = memrchr(url, '@', len);
	if (!at) {
		snprintf(buf, cap, "%.*s", (int)(len > SC_VALUE_SHOWN ? SC_VALUE_SHOWN : len), url);
		return;
	}
	const char *scheme_end = strstr(url, "://");
	size_t keep = scheme_end && scheme_end < at ? (size_t)(scheme_end - url) + 3 : 0;
	size_t rest = len - (size_t)(at + 1 - url);
	snprintf(buf, cap, "%.*s<redacted>@%.*s", (int)keep, url,
		 (int)(rest > SC_VALUE_SHOWN ? SC_VALUE_SHOWN : rest), at + 1);
}

/* One NATS server: nats://[USER[:PASS]@]HOST[:PORT] (also tls://). */
static int check_nats_one(const char *u, size_t len, struct sc_err *err)
{
	char shown[SC_VALUE_SHOWN + 64];
	char buf[SC_HOST_MAX_LEN + 16];
	redact_url(u, len, shown, sizeof(shown));
	size_t skip;
	if (len > 7 && strncasecmp(u, "nats://", 7) == 0)
		skip = 7;
	else if (len > 6 && strncasecmp(u, "tls://", 6) == 0)
		skip = 6;
	else
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "\"%s\": expected nats://HOST:PORT (e.g. nats://127.0.0.1:4222)",
				  shown);
	const char *hp = u + skip;
	const char *at = memrchr(hp, '@', len - skip);
	if (at)
		hp = at + 1;
	size_t hplen = len - (size_t)(hp - u);
	if (hplen > 0 && hp[hplen - 1] == '/')
		hplen--; /* "nats://host:4222/" */
	if (hplen == 0 || hplen >= sizeof(buf) - 8)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "\"%s\": bad host, expected nats://HOST:PORT (e.g. "
				  "nats://127.0.0.1:4222)",
				  shown);
	memcpy(buf, hp, hplen);
	buf[hplen] = '\0';
	/* Without a port nats.c uses 4222; add it so one parser checks the host. */
	const char *last_colon = strrchr(buf, ':');
	const char *close = strrchr(buf, ']');
	if (!last_colon || (close && close > last_colon) ||
	    (buf[0] != '[' && memchr(buf, ':', (size_t)(last_colon - buf))))
		strcat(buf, ":4222");
	uint16_t port;
	if (sc_parse_hostport(buf, NULL, 0, &port, err) != 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "\"%s\": expected nats://HOST:PORT (e.g. nats://127.0.0.1:4222)",
				  shown);
	if (port == 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "\"%s\": port 0 cannot be dialled",
				  shown);
	return 0;
}

static int check_nats_url(const char *v, struct sc_err *err)
{
	const char *p = v;
	for (;;) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		if (len == 0)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "has an empty entry in its comma-separated list");
		if (check_nats_one(p, len, err) != 0)
			return -1;
		if (!comma)
			return 0;
		p = comma + 1;
	}
}

static int parse_backends(const char *v, unsigned *out, struct sc_err *err)
{
	static const struct {
		const char *name;
		unsigned bit;
	} names[] = {
	    {"tcp", SC_BACKEND_BIT_TCP},
	    {"ibverbs", SC_BACKEND_BIT_IBVERBS},
	    {"local", SC_BACKEND_BIT_LOCAL},
	    {"libfabric", SC_BACKEND_BIT_LIBFABRIC},
	};
	unsigned bits = 0;
	bool all = false;
	const char *p = v;
	for (;;) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		bool found = false;
		if (len == 3 && strncasecmp(p, "all", 3) == 0) {
			all = true;
			found = true;
		}
		for (size_t i = 0; !found && i < sizeof(names) / sizeof(names[0]); i++) {
			if (strlen(names[i].name) == len &&
			    strncasecmp(p, names[i].name, len) == 0) {
				bits |= names[i].bit;
				found = true;
			}
		}
		if (!found)
			return sc_err_set(
			    err, SC_INVALID_ARGUMENT,
			    "\"%.*s\": unknown backend \"%.*s\" (valid: tcp, ibverbs, "
			    "libfabric, local, all; comma-separated)",
			    SC_VALUE_SHOWN, v, (int)(len > SC_VALUE_SHOWN ? SC_VALUE_SHOWN : len), p);
		if (!comma)
			break;
		p = comma + 1;
	}
	*out = all ? 0 : bits;
	return 0;
}

static int parse_size_range(const char *v, uint64_t min, uint64_t max, const char *range,
			    uint64_t *out, struct sc_err *err)
{
	uint64_t n;
	if (sc_parse_size(v, &n, err) != 0)
		return -1;
	if (n < min || n > max)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "\"%.*s\": must be %s", SC_VALUE_SHOWN, v,
				  range);
	*out = n;
	return 0;
}

/* An octal file mode for a socket: 0600-0777 (the owner always reads and writes). */
static int parse_mode(const char *v, uint32_t *out, struct sc_err *err)
{
	unsigned long m = 0;
	size_t n = strlen(v);
	bool ok = n >= 1 && n <= 4;
	for (size_t i = 0; ok && i < n; i++) {
		ok = v[i] >= '0' && v[i] <= '7';
		m = m * 8 + (unsigned long)(v[i] - '0');
	}
	if (!ok || m > 0777 || (m & 0600) != 0600)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "\"%.*s\": expected an octal mode from 0600 to 0777 (e.g. 0660: "
				  "owner and group may connect)",
				  SC_VALUE_SHOWN, v);
	*out = (uint32_t)m;
	return 0;
}

/*
 * --fast-path-socket: "off" -> NULL (no fast path); unset -> the first unix --grpc-listen path +
 * ".fast" (NULL without a unix listener: the fast path is local, like the unix socket).
 */
static int resolve_fast_path_socket(struct sc_config *cfg, struct sc_err *err)
{
	char *p = cfg->fast_path_socket;
	if (p && strcmp(p, "off") == 0) {
		free(p);
		cfg->fast_path_socket = NULL;
		return 0;
	}
	if (!p) {
		for (size_t i = 0; i < cfg->n_grpc_listen && !p; i++) {
			const char *a = cfg->grpc_listen[i];
			if (a && strncmp(a, "unix:", 5) == 0 && asprintf(&p, "%s.fast", a + 5) < 0)
				return sc_err_set(err, SC_INTERNAL, "out of memory");
		}
		/* A gRPC socket path near the limit leaves no room for ".fast": no fast path then
		 * (the flag names one that fits). */
		if (p && strlen(p) >= 108) {
			free(p);
			p = NULL;
		}
		cfg->fast_path_socket = p;
		if (!p)
			return 0;
	}
	if (p[0] != '/' || strlen(p) >= 108)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "--fast-path-socket \"%.*s\": expected an absolute path shorter than "
				  "108 bytes (a unix socket's limit), or \"off\"",
				  SC_VALUE_SHOWN, p);
	return 0;
}

/* TLS files come as a set: cert and key together; a client CA needs both. */
static int check_tls_set(const struct sc_config *cfg, struct sc_err *err)
{
	if (!cfg->grpc_tls_cert != !cfg->grpc_tls_key)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "--grpc-tls-cert and --grpc-tls-key go together: give both "
				  "(certificate chain and its private key, PEM) or neither");
	if (cfg->grpc_tls_client_ca && !cfg->grpc_tls_cert)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "--grpc-tls-client-ca needs --grpc-tls-cert and --grpc-tls-key "
				  "(the server's own certificate for mTLS)");
	if (cfg->peer_identity_required &&
	    (!cfg->peer_tls_cert || !cfg->peer_tls_key || !cfg->peer_tls_ca))
		return sc_err_set(
		    err, SC_INVALID_ARGUMENT,
		    "--peer-identity-required needs peer TLS (--peer-tls-cert, "
		    "--peer-tls-key and --peer-tls-ca): a sidecar's identity comes from "
		    "its certificate");
	if (cfg->peer_identity_required && cfg->peer_identity == SC_PEER_IDENTITY_OFF)
		return sc_err_set(
		    err, SC_INVALID_ARGUMENT,
		    "--peer-identity-required needs --peer-identity spiffe, dns or cn, "
		    "not off");
	return 0;
}

static const char *const peer_identity_names[] = {
    [SC_PEER_IDENTITY_SPIFFE] = "spiffe",
    [SC_PEER_IDENTITY_DNS] = "dns",
    [SC_PEER_IDENTITY_CN] = "cn",
    [SC_PEER_IDENTITY_OFF] = "off",
};

const char *sc_peer_identity_name(enum sc_peer_identity s)
{
	return (unsigned)s < sizeof(peer_identity_names) / sizeof(peer_identity_names[0])
		   ? peer_identity_names[s]
		   : "unknown";
}

static int parse_peer_identity(const char *v, enum sc_peer_identity *out, struct sc_err *err)
{
	for (unsigned i = 0; i < sizeof(peer_identity_names) / sizeof(peer_identity_names[0]);
	     i++) {
		if (strcmp(v, peer_identity_names[i]) == 0) {
			*out = (enum sc_peer_identity)i;
			return 0;
		}
	}
	return sc_err_set(err, SC_INVALID_ARGUMENT, "\"%.*s\": expected spiffe, dns, cn or off",
			  SC_VALUE_SHOWN, v);
}

/* ---- applying one value ---- */

/* Parse state that must not outlive one sc_config_parse call. */
struct parse_state {
	bool listen_from_flags; /* the first --grpc-listen flag replaces the env/default list */
	bool dirs_from_flags;   /* the first --register-dir flag replaces the env list */
};

static void free_register_dirs(struct sc_config *cfg)
{
	for (size_t i = 0; i < cfg->n_register_dirs; i++) {
		free(cfg->register_dirs[i]);
		cfg->register_dirs[i] = NULL;
	}
	cfg->n_register_dirs = 0;
}

static int add_register_dir(struct sc_config *cfg, const char *v, size_t len, bool from_env,
			    struct sc_err *err)
{
	if (len == 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "empty directory: expected an absolute directory path");
	if (v[0] != '/')
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "\"%.*s\": expected an absolute directory path (e.g. /data/models)",
				  (int)(len > SC_VALUE_SHOWN ? SC_VALUE_SHOWN : len), v);
	if (cfg->n_register_dirs >= SC_MAX_REGISTER_DIRS)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  from_env ? "lists more than %d directories" : "given more than %d times",
				  SC_MAX_REGISTER_DIRS);
	char *s = strndup(v, len);
	if (!s)
		return sc_err_set(err, SC_INTERNAL, "out of memory");
	cfg->register_dirs[cfg->n_register_dirs++] = s;
	return 0;
}

/* --register-dir repeats; its env twin is a comma list that the first flag replaces. */
static int apply_register_dirs(struct sc_config *cfg, struct parse_state *st, const char *v,
			       bool from_env, struct sc_err *err)
{
	if (!from_env) {
		if (!st->dirs_from_flags) {
			free_register_dirs(cfg);
			st->dirs_from_flags = true;
		}
		return add_register_dir(cfg, v, strlen(v), false, err);
	}
	free_register_dirs(cfg);
	for (const char *p = v;;) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		if (add_register_dir(cfg, p, len, true, err) != 0)
			return -1;
		if (!comma)
			return 0;
		p = comma + 1;
	}
}

/* A subject prefix: NATS tokens without wildcards or spaces, e.g. "team-a." or "team-a". */
static int check_subject_prefix(const char *v, struct sc_err *err)
{
	for (const char *p = v; *p; p++) {
		unsigned char c = (unsigned char)*p;
		if (c == '*' || c == '>' || c <= ' ' || c >= 0x7f)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "\"%.*s\": a subject prefix has no wildcards (* >), "
					  "spaces or control characters, e.g. team-a.",
					  SC_VALUE_SHOWN, v);
	}
	if (v[0] == '.' || strstr(v, ".."))
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "\"%.*s\": empty subject token, e.g. use team-a.", SC_VALUE_SHOWN, v);
	return 0;
}

static void free_listen(struct sc_config *cfg)
{
	for (size_t i = 0; i < cfg->n_grpc_listen; i++) {
		free(cfg->grpc_listen[i]);
		cfg->grpc_listen[i] = NULL;
	}
	cfg->n_grpc_listen = 0;
}

static int add_listen(struct sc_config *cfg, const char *v, size_t len, bool from_env,
		      struct sc_err *err)
{
	if (cfg->n_grpc_listen >= SC_MAX_GRPC_LISTENERS)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  from_env ? "lists more than %d addresses; at most %d gRPC "
					     "addresses are served"
					   : "given more than %d times; at most %d gRPC addresses "
					     "are served",
				  SC_MAX_GRPC_LISTENERS, SC_MAX_GRPC_LISTENERS);
	char *s = strndup(v, len);
	if (!s)
		return sc_err_set(err, SC_INTERNAL, "out of memory");
	if (check_grpc_addr(s, err) != 0) {
		free(s);
		return -1;
	}
	cfg->grpc_listen[cfg->n_grpc_listen++] = s;
	return 0;
}

/* Replace *slot with a copy of v; an empty v clears it to NULL when allow_empty. */
static int set_str(char **slot, const char *v, bool allow_empty, struct sc_err *err)
{
	char *s = NULL;
	if (!*v && !allow_empty)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "\"\": must not be empty");
	if (*v) {
		s = strdup(v);
		if (!s)
			return sc_err_set(err, SC_INTERNAL, "out of memory");
	}
	free(*slot);
	*slot = s;
	return 0;
}

static int set_hostport(char **slot, const char *v, bool allow_empty, struct sc_err *err)
{
	if (!*v && allow_empty)
		return set_str(slot, v, true, err);
	if (sc_parse_hostport(v, NULL, 0, NULL, err) != 0)
		return -1;
	return set_str(slot, v, false, err);
}

/* --data-listen: a comma list of HOST:PORT, one per data endpoint (at most SC_CONFIG_MAX_DATA_ENDPOINTS);
 * stored as given. */
static int set_data_listen(struct sc_config *cfg, const char *v, struct sc_err *err)
{
	size_t n = 0;
	for (const char *p = v;; n++) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		if (n == SC_CONFIG_MAX_DATA_ENDPOINTS)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "\"%.*s\": at most %d data endpoints", SC_VALUE_SHOWN, v,
					  SC_CONFIG_MAX_DATA_ENDPOINTS);
		char *one = strndup(p, len);
		if (!one)
			return sc_err_set(err, SC_INTERNAL, "out of memory");
		int rc = sc_parse_hostport(one, NULL, 0, NULL, err);
		free(one);
		if (rc != 0)
			return -1;
		if (!comma)
			break;
		p = comma + 1;
	}
	return set_str(&cfg->data_listen, v, false, err);
}

/*
 * Apply one value. label is "--name" or "RDMA_SIDECAR_NAME", for messages; from_env tells
 * list-valued options to split on commas. On error err names the label, the value and the fix.
 */
/* A typed option: parse v into its field (the table says which and how). */
static int apply_typed(struct sc_config *cfg, const struct sc_option *opt, const char *v,
		       struct sc_err *err)
{
	void *field = (char *)cfg + opt->field;
	long long n;
	int rc = 0;
	switch (opt->kind) {
	case K_STR:
		return set_str(field, v, true, err);
	case K_HOSTPORT:
		return set_hostport(field, v, opt->empty_ok, err);
	case K_BOOL:
		return sc_parse_bool(v, field, err);
	case K_U32:
		rc = sc_parse_int_range(v, opt->min, opt->max, &n, err);
		if (rc == 0)
			*(uint32_t *)field = (uint32_t)n;
		return rc;
	case K_INT:
		rc = sc_parse_int_range(v, opt->min, opt->max, &n, err);
		if (rc == 0)
			*(int *)field = (int)n;
		return rc;
	case K_SIZE:
		return parse_size_range(v, opt->size_min, opt->size_max, opt->range, field, err);
	case K_SIZE_ANY:
		return sc_parse_size(v, field, err);
	case K_DURATION:
		return sc_parse_duration_ms(v, field, err);
	case K_CUSTOM:
		break;
	}
	return 0;
}

/* Set one option from a flag or its environment twin: typed ones from the table, the rest here. */
static int apply(struct sc_config *cfg, struct parse_state *st, const struct sc_option *opt,
		 const char *v, const char *label, bool from_env, struct sc_err *err)
{
	int rc = 0;
	if (opt->kind != K_CUSTOM) {
		rc = apply_typed(cfg, opt, v, err);
		return rc == 0 ? 0 : label_err(err, label);
	}
	switch (opt->id) {
	case OPT_ID:
		rc = check_id(v, err);
		if (rc == 0)
			rc = set_str(&cfg->id, v, false, err);
		break;
	case OPT_NATS_URL:
		rc = *v ? check_nats_url(v, err) : 0;
		if (rc == 0)
			rc = set_str(&cfg->nats_url, v, true, err);
		break;
	case OPT_GRPC_LISTEN:
		if (from_env) {
			free_listen(cfg);
			const char *p = v;
			for (;;) {
				const char *comma = strchr(p, ',');
				size_t len = comma ? (size_t)(comma - p) : strlen(p);
				if (len == 0) {
					rc = sc_err_set(
					    err, SC_INVALID_ARGUMENT,
					    "\"%.*s\": empty entry in the comma-separated "
					    "list",
					    SC_VALUE_SHOWN, v);
					break;
				}
				rc = add_listen(cfg, p, len, true, err);
				if (rc != 0 || !comma)
					break;
				p = comma + 1;
			}
		} else {
			if (!st->listen_from_flags) {
				free_listen(cfg);
				st->listen_from_flags = true;
			}
			rc = add_listen(cfg, v, strlen(v), false, err);
		}
		break;
	case OPT_UNIX_SOCKET_MODE:
		rc = parse_mode(v, &cfg->unix_socket_mode, err);
		break;
	case OPT_ALLOWED_UIDS:
		rc = sc_parse_uid_list(v, cfg->allowed_uids, SC_MAX_ALLOWED_UIDS,
				       &cfg->n_allowed_uids, err);
		break;
	case OPT_DATA_LISTEN:
		rc = set_data_listen(cfg, v, err);
		break;
	case OPT_ADVERTISE:
		rc = *v ? set_advertise(cfg, v, err) : set_str(&cfg->advertise, v, true, err);
		break;
	case OPT_BACKENDS:
		rc = parse_backends(v, &cfg->backends, err);
		break;
	case OPT_IB_DEVICES: {
		struct sc_rail_filter f;
		rc = sc_rail_filter_parse(v, &f, err);
		if (rc == 0)
			rc = set_str(&cfg->ib_devices, v, true, err);
		break;
	}
	case OPT_SHM_DIR:
		if (v[0] != '/')
			rc = sc_err_set(
			    err, SC_INVALID_ARGUMENT,
			    "\"%.*s\": expected an absolute directory path (e.g. /dev/shm)",
			    SC_VALUE_SHOWN, v);
		else
			rc = set_str(&cfg->shm_dir, v, false, err);
		break;
	case OPT_DEFAULT_TIMEOUT:
		rc = sc_parse_duration_ms(v, &cfg->default_timeout_ms, err);
		if (rc == 0 && cfg->default_timeout_ms == 0)
			rc = sc_err_set(err, SC_INVALID_ARGUMENT,
					"\"%.*s\": must be longer than 0 (e.g. 60s)", SC_VALUE_SHOWN,
					v);
		break;
	case OPT_DATA_FIRST_BYTE_TIMEOUT:
		rc = sc_parse_duration_ms(v, &cfg->data_first_byte_timeout_ms, err);
		if (rc == 0 && (cfg->data_first_byte_timeout_ms < 10 ||
				cfg->data_first_byte_timeout_ms > 60 * 1000))
			rc = sc_err_set(err, SC_INVALID_ARGUMENT,
					"\"%.*s\": expected a duration from 10ms to 60s (e.g. 1s)",
					SC_VALUE_SHOWN, v);
		break;
	case OPT_CANCEL_WAIT:
		rc = sc_parse_duration_ms(v, &cfg->cancel_wait_ms, err);
		if (rc == 0 && cfg->cancel_wait_ms > 30 * 1000)
			rc = sc_err_set(err, SC_INVALID_ARGUMENT,
					"\"%.*s\": at most 30s (CancelOperation answers promptly; "
					"WaitOperation waits as long as asked)",
					SC_VALUE_SHOWN, v);
		break;
	case OPT_REGISTER_DIR:
		rc = apply_register_dirs(cfg, st, v, from_env, err);
		break;
	case OPT_NATS_HANDOFF:
		if (strcmp(v, "core") == 0)
			cfg->nats_handoff_core = true;
		else if (strcmp(v, "jetstream") == 0)
			cfg->nats_handoff_core = false;
		else
			rc = sc_err_set(err, SC_INVALID_ARGUMENT,
					"\"%.*s\": expected jetstream or core", SC_VALUE_SHOWN, v);
		break;
	case OPT_NATS_SUBJECT_PREFIX:
		rc = check_subject_prefix(v, err);
		if (rc == 0)
			rc = set_str(&cfg->nats_subject_prefix, v, true, err);
		break;
	case OPT_PEER_IDENTITY:
		rc = parse_peer_identity(v, &cfg->peer_identity, err);
		break;
	case OPT_LOG_LEVEL:
		if (!sc_log_level_parse(v, &cfg->log_level))
			rc = sc_err_set(err, SC_INVALID_ARGUMENT,
					"\"%.*s\": expected debug, info, warn, error or off",
					SC_VALUE_SHOWN, v);
		break;
	default: /* OPT_HELP, OPT_VERSION; the typed ones returned above */
		break;
	}
	return rc == 0 ? 0 : label_err(err, label);
}

/* ---- defaults, environment, flags ---- */

static int set_defaults(struct sc_config *cfg, struct sc_err *err)
{
	/* Only the unix socket: a TCP listener serving the full API needs authentication
	 * (--grpc-tls-* or --grpc-token-file), which has no default. */
	static const char *const listen[] = {"unix:/tmp/rdma-sidecar/sidecar.sock"};
	memset(cfg, 0, sizeof(*cfg));
	for (size_t i = 0; i < sizeof(listen) / sizeof(listen[0]); i++) {
		cfg->grpc_listen[i] = strdup(listen[i]);
		if (!cfg->grpc_listen[i])
			return sc_err_set(err, SC_INTERNAL, "out of memory");
		cfg->n_grpc_listen++;
	}
	cfg->data_listen = strdup("0.0.0.0:0");
	cfg->shm_dir = strdup("/dev/shm");
	if (!cfg->data_listen || !cfg->shm_dir)
		return sc_err_set(err, SC_INTERNAL, "out of memory");
	cfg->backends = 0;
	cfg->ib_port = 0;
	cfg->ib_gid_index = -1;
	cfg->log_level = SC_LOG_INFO;
	cfg->log_json = false;
	cfg->reflection = true;
	cfg->warm_peers = true;
	cfg->ib_stall_ms = 10 * 1000;
	cfg->default_timeout_ms = 60 * 1000;
	cfg->retention_ms = 300 * 1000;
	cfg->grace_ms = 10 * 1000;
	cfg->cancel_wait_ms = 1000;
	cfg->max_concurrent_transfers = 64;
	cfg->max_inflight_bytes = 4 * SC_GIB;
	cfg->max_progress_records = 65536;
	cfg->progress_grace_ms = 30 * 1000;
	cfg->max_message_bytes = 64 * SC_MIB;
	cfg->grpc_threads = 4;
	cfg->tcp_streams = 2;
	cfg->tcp_chunk_bytes = 8 * SC_MIB;
	cfg->ib_stripe_min_bytes = 4 * SC_MIB;
	cfg->ib_slice_bytes = SC_MIB;
	cfg->ib_max_qps = 1024;
	cfg->ofi_max_peers = 1024;
	cfg->ofi_stripe_min_bytes = 4 * SC_MIB;
	cfg->ofi_stall_ms = 5000;
	cfg->data_max_unauth_per_ip = 16;
	cfg->data_max_unauth = 64;
	cfg->data_first_byte_timeout_ms = 1000;
	cfg->data_max_peers = 1024;
	cfg->data_io_threads = 4;
	cfg->fast_path_max_sessions = 64;
	cfg->max_region_bytes = 64 * SC_GIB;
	cfg->max_regions = 4096;
	cfg->max_operations = 16384;
	cfg->max_descriptors = 65536;
	cfg->max_total_region_bytes = 0;
	cfg->unix_socket_mode = 0660;
	cfg->peer_identity = SC_PEER_IDENTITY_SPIFFE;
	cfg->peer_identity_required = false;
	cfg->tls_reload_interval_ms = 10 * 1000;
	return 0;
}

/* "<hostname>-<6 random hex>", the hostname cut and cleaned so the id stays valid. */
static int default_id(struct sc_config *cfg, struct sc_err *err)
{
	char host[SC_HOST_MAX_LEN + 1];
	unsigned char rnd[3];
	if (gethostname(host, sizeof(host)) != 0 || !host[0])
		snprintf(host, sizeof(host), "sidecar");
	host[sizeof(host) - 1] = '\0';
	host[ID_HOST_MAX] = '\0'; /* room for "-xxxxxx" */
	for (char *p = host; *p; p++)
		if (!isalnum((unsigned char)*p) && *p != '.' && *p != '_' && *p != '-')
			*p = '-';
	if (RAND_bytes(rnd, sizeof(rnd)) != 1)
		return sc_err_set(err, SC_INTERNAL,
				  "no random bytes for the default id (OpenSSL RAND_bytes "
				  "failed); pass --id");
	char id[ID_MAX_LEN + 1];
	snprintf(id, sizeof(id), "%.*s-%02x%02x%02x", ID_HOST_MAX, host, rnd[0], rnd[1], rnd[2]);
	cfg->id = strdup(id);
	if (!cfg->id)
		return sc_err_set(err, SC_INTERNAL, "out of memory");
	return 0;
}

static const char *env_lookup(char **envp, const char *name)
{
	size_t n = strlen(name);
	for (char **e = envp; e && *e; e++)
		if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
			return *e + n + 1;
	return NULL;
}

/*
 * Every RDMA_SIDECAR_<NAME> in envp; an empty value counts as unset. Other RDMA_SIDECAR_* names
 * are ignored, not refused: Kubernetes injects RDMA_SIDECAR_SERVICE_HOST, RDMA_SIDECAR_PORT... for
 * a Service named rdma-sidecar.
 */
static int apply_env(struct sc_config *cfg, struct parse_state *st, char **envp, struct sc_err *err)
{
	char name[LABEL_MAX];
	for (size_t i = 0; i < N_OPTIONS; i++) {
		const struct sc_option *opt = &sc_options[i];
		if (opt->arg == ARG_NONE)
			continue;
		env_name(opt, name, sizeof(name));
		const char *v = env_lookup(envp, name);
		if (!v || !*v)
			continue;
		if (apply(cfg, st, opt, v, name, true, err) != 0)
			return -1;
	}
	return 0;
}

static const struct sc_option *find_long(const char *name, size_t len)
{
	for (size_t i = 0; i < N_OPTIONS; i++)
		if (strlen(sc_options[i].name) == len &&
		    strncmp(sc_options[i].name, name, len) == 0)
			return &sc_options[i];
	return NULL;
}

static const struct sc_option *find_short(char c)
{
	for (size_t i = 0; i < N_OPTIONS; i++)
		if (sc_options[i].short_name && sc_options[i].short_name == c)
			return &sc_options[i];
	return NULL;
}

enum flag_outcome { FLAG_DONE, FLAG_HELP, FLAG_VERSION, FLAG_ERROR };

/*
 * Walk argv. With dry set, only check its shape (known options, values present, no positional
 * arguments) and stop at --help or --version, in order as getopt would; otherwise apply each value.
 */
static enum flag_outcome walk_flags(struct sc_config *cfg, struct parse_state *st, int argc,
				    char **argv, bool dry, struct sc_err *err)
{
	int i;
	for (i = 1; i < argc; i++) {
		const char *a = argv[i];
		const struct sc_option *opt = NULL;
		const char *value = NULL;
		char label[LABEL_MAX];

		if (strcmp(a, "--") == 0) {
			if (++i < argc)
				goto positional;
			break;
		}
		if (a[0] == '-' && a[1] == '-') {
			const char *name = a + 2;
			const char *eq = strchr(name, '=');
			size_t len = eq ? (size_t)(eq - name) : strlen(name);
			opt = find_long(name, len);
			if (!opt && !eq && len > 3 && strncmp(name, "no-", 3) == 0) {
				/* --no-NAME for a yes/no option: NAME=false. */
				opt = find_long(name + 3, len - 3);
				if (opt && opt->arg != ARG_BOOL)
					opt = NULL;
				if (opt)
					value = "false";
			}
			if (!opt) {
				sc_err_set(err, SC_INVALID_ARGUMENT,
					   "unknown option --%.*s (see --help)",
					   (int)(len > SC_VALUE_SHOWN ? SC_VALUE_SHOWN : len), name);
				return FLAG_ERROR;
			}
			if (eq)
				value = eq + 1;
		} else if (a[0] == '-' && a[1]) {
			opt = a[2] ? NULL : find_short(a[1]);
			if (!opt) {
				sc_err_set(err, SC_INVALID_ARGUMENT,
					   "unknown option %.*s (see --help)", SC_VALUE_SHOWN, a);
				return FLAG_ERROR;
			}
		} else {
			goto positional;
		}

		snprintf(label, sizeof(label), "--%s", opt->name);
		switch (opt->arg) {
		case ARG_NONE:
			if (value) {
				sc_err_set(err, SC_INVALID_ARGUMENT, "%s takes no value", label);
				return FLAG_ERROR;
			}
			return opt->id == OPT_HELP ? FLAG_HELP : FLAG_VERSION;
		case ARG_BOOL:
			if (!value)
				value = "true";
			break;
		case ARG_REQUIRED:
			if (!value) {
				if (i + 1 >= argc) {
					sc_err_set(err, SC_INVALID_ARGUMENT,
						   "%s needs a value, e.g. %s %s (see --help)",
						   label, label, opt->value);
					return FLAG_ERROR;
				}
				value = argv[++i];
			}
			break;
		}
		if (!dry && apply(cfg, st, opt, value, label, false, err) != 0)
			return FLAG_ERROR;
	}
	return FLAG_DONE;

positional:
	sc_err_set(err, SC_INVALID_ARGUMENT,
		   "unexpected argument \"%.*s\": rdma-sidecar takes only options (see --help)",
		   SC_VALUE_SHOWN, argv[i]);
	return FLAG_ERROR;
}

enum sc_config_result sc_config_parse(struct sc_config *cfg, int argc, char **argv, char **envp,
				      struct sc_err *err)
{
	struct parse_state st = {.listen_from_flags = false, .dirs_from_flags = false};
	sc_err_clear(err);
	if (set_defaults(cfg, err) != 0)
		return SC_CONFIG_ERROR;

	/* Shape first, so --help and --version answer even when a value or the env is bad. */
	switch (walk_flags(cfg, &st, argc, argv, true, err)) {
	case FLAG_ERROR:
		return SC_CONFIG_ERROR;
	case FLAG_HELP:
		sc_config_usage(stdout, argc > 0 ? argv[0] : NULL);
		return SC_CONFIG_EXIT;
	case FLAG_VERSION:
		printf("rdma-sidecar %s\n", SC_VERSION);
		return SC_CONFIG_EXIT;
	case FLAG_DONE:
		break;
	}
	if (apply_env(cfg, &st, envp, err) != 0)
		return SC_CONFIG_ERROR;
	if (walk_flags(cfg, &st, argc, argv, false, err) != FLAG_DONE)
		return SC_CONFIG_ERROR;
	if (!cfg->id && default_id(cfg, err) != 0)
		return SC_CONFIG_ERROR;
	if (check_tls_set(cfg, err) != 0)
		return SC_CONFIG_ERROR;
	if (resolve_fast_path_socket(cfg, err) != 0)
		return SC_CONFIG_ERROR;
	if (cfg->ib_device && cfg->ib_device[0] && cfg->ib_devices && cfg->ib_devices[0] &&
	    strcmp(cfg->ib_devices, "auto") != 0) {
		sc_err_set(err, SC_INVALID_ARGUMENT,
			   "--ib-device %s and --ib-devices %s both choose the RDMA devices: give one "
			   "(--ib-devices %s alone means the same as --ib-device)",
			   cfg->ib_device, cfg->ib_devices, cfg->ib_device);
		return SC_CONFIG_ERROR;
	}
	return SC_CONFIG_OK;
}

void sc_config_free(struct sc_config *cfg)
{
	if (!cfg)
		return;
	free(cfg->id);
	for (size_t i = 0; i < SC_MAX_GRPC_LISTENERS; i++)
		free(cfg->grpc_listen[i]);
	free(cfg->data_listen);
	free(cfg->advertise);
	free(cfg->shm_dir);
	free(cfg->nats_url);
	free(cfg->key_file);
	free(cfg->peer_tls_cert);
	free(cfg->peer_tls_key);
	free(cfg->peer_tls_ca);
	free(cfg->nats_tls_ca);
	free(cfg->nats_tls_cert);
	free(cfg->nats_tls_key);
	free(cfg->nats_creds);
	free(cfg->nats_nkey_seed);
	free(cfg->ib_device);
	free(cfg->ib_devices);
	free(cfg->ofi_provider);
	free(cfg->ofi_domains);
	free(cfg->ofi_hmem);
	free(cfg->metrics_listen);
	for (size_t i = 0; i < SC_MAX_REGISTER_DIRS; i++)
		free(cfg->register_dirs[i]);
	free(cfg->nats_subject_prefix);
	free(cfg->nats_stream);
	free(cfg->health_listen);
	free(cfg->grpc_tls_cert);
	free(cfg->grpc_tls_key);
	free(cfg->grpc_tls_client_ca);
	free(cfg->grpc_token_file);
	free(cfg->fast_path_socket);
	memset(cfg, 0, sizeof(*cfg));
}

void sc_config_usage(FILE *f, const char *argv0)
{
	const char *group = NULL;
	char env[LABEL_MAX];
	fprintf(f,
		"Usage: %s [OPTION]...\n"
		"Sidecar daemon that moves memory between ML workers over RDMA (ibverbs) or TCP.\n"
		"Workers talk gRPC to it; peers exchange signed metadata, optionally over NATS.\n"
		"\n"
		"Every option also reads an environment variable (shown as env); the flag wins.\n"
		"An empty variable counts as unset. Options take --name VALUE or --name=VALUE.\n"
		"SIZE: bytes with optional K, M, G, T (powers of 1024), e.g. 8MiB.\n"
		"DURATION: a number with ms, s, m or h; a plain number is ms, e.g. 30s.\n",
		argv0 && *argv0 ? argv0 : "rdma-sidecar");
	for (size_t i = 0; i < N_OPTIONS; i++) {
		const struct sc_option *opt = &sc_options[i];
		char flag[64];
		if (!group || strcmp(group, opt->group) != 0) {
			group = opt->group;
			fprintf(f, "\n%s:\n", group);
		}
		if (opt->short_name)
			snprintf(flag, sizeof(flag), "-%c, --%s", opt->short_name, opt->name);
		else
			snprintf(flag, sizeof(flag), "--%s%s%s", opt->name, opt->value ? " " : "",
				 opt->value ? opt->value : "");
		fprintf(f, "  %-28s  %s", flag, opt->help);
		if (opt->arg == ARG_NONE) {
			fputc('\n', f);
			continue;
		}
		env_name(opt, env, sizeof(env));
		fprintf(f, " (env %s, default %s)\n", env, opt->def ? opt->def : "none");
	}
	fprintf(f, "\nGPU memory: %s\n",
		SC_HAVE_CUDA_H ? "supported; the CUDA driver (libcuda.so.1) is loaded at run time, so "
				 "hosts without a GPU work too (GetInfo says what was found)"
			       : "off: this build had no CUDA headers (cuda.h); CUDA regions are refused");
	fprintf(f, "\nExit status: 0 after --help/--version or a clean shutdown, 2 for a bad "
		   "configuration.\n");
}
