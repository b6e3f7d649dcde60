/* SPDX-License-Identifier: Apache-2.0 */
/*
 * conf/config.h: the daemon's configuration, from flags with RDMA_SIDECAR_<NAME> environment twins
 * (the flag wins; --grpc-listen may repeat, its env twin is comma-separated).
 * Parsed once on the main thread at start-up; read-only afterwards, so any thread may read it.
 */
#ifndef SC_CONFIG_H
#define SC_CONFIG_H

#include "base/log.h"
#include "base/parse.h" /* sc_parse_hostport, sc_parse_size, ...: long found here */
#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Backend bits for --backends. */
enum {
	SC_BACKEND_BIT_TCP = 1u << 0,
	SC_BACKEND_BIT_IBVERBS = 1u << 1,
	SC_BACKEND_BIT_LOCAL = 1u << 2,
	SC_BACKEND_BIT_LIBFABRIC = 1u << 3,
};

#define SC_MAX_GRPC_LISTENERS 8
/* The largest --max-descriptors (descriptors per operation, plain or expanded). */
#define SC_MAX_DESCRIPTORS 1048576
#define SC_MAX_REGISTER_DIRS 16
#define SC_MAX_ALLOWED_UIDS 32

/* --peer-identity: which name in a peer's verified certificate is its sidecar id. */
enum sc_peer_identity {
	SC_PEER_IDENTITY_SPIFFE = 0, /* URI SAN spiffe://TRUST-DOMAIN/.../ID: the last segment */
	SC_PEER_IDENTITY_DNS,        /* a DNS SAN equal to the id */
	SC_PEER_IDENTITY_CN,         /* the subject CN */
	SC_PEER_IDENTITY_OFF,        /* the id claimed in the hello */
};
/* "spiffe", "dns", "cn", "off". */
const char *sc_peer_identity_name(enum sc_peer_identity s);
/* Is s[0..len) a sidecar id (--id): 1-100 of A-Z a-z 0-9 . _ -? */
bool sc_config_id_valid(const char *s, size_t len);

/* The data endpoints --data-listen may name (meta/metadata.h's SC_MAX_ENDPOINTS, asserted there). */
#define SC_CONFIG_MAX_DATA_ENDPOINTS 4

struct sc_config {
	char *id;                                     /* --id; default "<hostname>-<6 hex>" */
	char *grpc_listen[SC_MAX_GRPC_LISTENERS];     /* --grpc-listen, repeatable */
	size_t n_grpc_listen;                         /* default: the unix socket only */
	char *health_listen;                          /* --health-listen HOST:PORT; NULL = off */
	bool reflection;                              /* --reflection (default on) */
	bool warm_peers;                              /* --warm-peers (default on) */
	char *grpc_tls_cert;                          /* --grpc-tls-cert PEM; NULL = plain TCP */
	char *grpc_tls_key;                           /* --grpc-tls-key PEM */
	char *grpc_tls_client_ca;                     /* --grpc-tls-client-ca PEM; mTLS */
	char *grpc_token_file;                        /* --grpc-token-file; NULL = no token */
	uint32_t unix_socket_mode;                    /* --unix-socket-mode, 0660 */
	uint32_t allowed_uids[SC_MAX_ALLOWED_UIDS];   /* --allowed-uids 0,1000 (SO_PEERCRED) */
	size_t n_allowed_uids;                        /* 0 = any uid that can open the socket */
	/* --data-listen HOST:PORT[,...] (default "0.0.0.0:0"): at most SC_CONFIG_MAX_DATA_ENDPOINTS
	 * data endpoints, each a TCP path; --advertise HOST[,...]: one host per endpoint, same
	 * order (brackets dropped); NULL = derived. */
	char *data_listen;
	char *advertise;
	char *shm_dir;                                /* --shm-dir, "/dev/shm" */
	char *nats_url;                               /* --nats-url; NULL/"" = NATS off */
	char *key_file;                               /* --key-file; NULL = no signing */
	unsigned backends;                            /* --backends tcp,ibverbs; 0 = all available */
	char *ib_device;                              /* --ib-device; NULL = first active */
	char *ib_devices;                             /* --ib-devices; NULL = auto (conf/rail_filter.h) */
	int ib_port;                                  /* --ib-port; 0 = first active */
	int ib_gid_index;                             /* --ib-gid-index; -1 = first RoCEv2 */
	uint64_t ib_stall_ms;                         /* --ib-stall-timeout, 10000; 0 = never */
	uint64_t ib_stripe_min_bytes;                 /* --ib-stripe-min, 4 MiB; 0 = never stripe */
	uint64_t ib_slice_bytes;                      /* --ib-slice-size, 1 MiB */
	uint32_t ib_max_qps;                          /* --ib-max-qps, 1024 (each way, per rail) */
	char *ofi_provider;                           /* --ofi-provider; NULL = best non-TCP-emulating */
	char *ofi_domains;                            /* --ofi-domains LIST; NULL = every domain but lo */
	uint32_t ofi_max_peers;                       /* --ofi-max-peers, 1024 AV entries per rail */
	uint64_t ofi_stripe_min_bytes;                /* --ofi-stripe-min, 4 MiB; 0 = never stripe */
	char *ofi_hmem;                               /* --ofi-hmem auto|off (CUDA registration) */
	uint64_t ofi_stall_ms;                        /* --ofi-stall-timeout, 5000; 0 = never */
	enum sc_log_level log_level;                  /* --log-level, info */
	bool log_json;                                /* --log-json */
	char *metrics_listen;                         /* --metrics-listen HOST:PORT; NULL = off */
	uint64_t default_timeout_ms;                  /* --default-timeout, 60000 */
	uint64_t retention_ms;                        /* --retention, 300000 */
	uint64_t grace_ms;                            /* --grace-period, 10000 */
	uint64_t cancel_wait_ms;                      /* --cancel-wait, 1000 */
	uint32_t max_concurrent_transfers;            /* --max-concurrent-transfers, 64 */
	uint64_t max_inflight_bytes;                  /* --max-inflight-bytes, 4 GiB */
	uint32_t max_progress_records;                /* --max-progress-records, 65536 */
	uint64_t progress_grace_ms;                   /* --progress-grace, 30000 */
	uint64_t max_message_bytes;                   /* --max-message-size, 64 MiB (gRPC) */
	uint32_t grpc_threads;                        /* --grpc-threads, 4 */
	uint32_t tcp_streams;                         /* --tcp-streams, parallel data conns, 2 */
	uint64_t tcp_chunk_bytes;                     /* --tcp-chunk-size, 8 MiB */
	uint64_t max_region_bytes;                    /* --max-region-size, 64 GiB */
	char *register_dirs[SC_MAX_REGISTER_DIRS];    /* --register-dir, repeatable; + shm_dir */
	size_t n_register_dirs;                       /* default: none (only --shm-dir) */
	uint32_t max_regions;                         /* --max-regions, 4096 */
	uint32_t max_operations;                      /* --max-operations (live + retained), 16384 */
	uint32_t max_descriptors;                     /* --max-descriptors per operation, 65536 */
	uint64_t max_total_region_bytes;              /* --max-total-region-bytes; 0 = unlimited */
	char *nats_subject_prefix;                    /* --nats-subject-prefix; NULL = any */
	bool nats_handoff_core;                       /* --nats-handoff core (default jetstream) */
	char *nats_stream;                            /* --nats-stream; NULL = RDMA_SIDECAR_METADATA */
	uint32_t nats_stream_replicas;                /* --nats-stream-replicas; 0 = auto */
	char *peer_tls_cert;                          /* --peer-tls-cert; NULL = no peer TLS */
	char *peer_tls_key;                           /* --peer-tls-key */
	char *peer_tls_ca;                            /* --peer-tls-ca */
	enum sc_peer_identity peer_identity;          /* --peer-identity, spiffe */
	bool peer_identity_required;                  /* --peer-identity-required */
	uint64_t tls_reload_interval_ms;              /* --tls-reload-interval, 10000; 0 = SIGHUP */
	char *nats_tls_ca;                            /* --nats-tls-ca; NULL = plain NATS */
	char *nats_tls_cert;                          /* --nats-tls-cert */
	char *nats_tls_key;                           /* --nats-tls-key */
	char *nats_creds;                             /* --nats-creds */
	char *nats_nkey_seed;                         /* --nats-nkey-seed */
	uint32_t data_max_unauth_per_ip;              /* --data-max-unauth-per-ip, 16 */
	uint32_t data_max_unauth;                     /* --data-max-unauth, 64 */
	uint64_t data_first_byte_timeout_ms;          /* --data-first-byte-timeout, 1000 */
	uint32_t data_max_peers;                      /* --data-max-peers, 1024 */
	uint32_t data_io_threads;                     /* --data-io-threads, 4 */
	char *fast_path_socket;                       /* --fast-path-socket; NULL = derived, "off" */
	uint32_t fast_path_max_sessions;              /* --fast-path-max-sessions, 64 */
};

/* Result of sc_config_parse. */
enum sc_config_result {
	SC_CONFIG_OK = 0,   /* run the daemon */
	SC_CONFIG_EXIT = 1, /* --help or --version was printed to stdout: exit 0 */
	SC_CONFIG_ERROR = 2 /* bad configuration: err says what and how to fix; exit 2 */
};

/*
 * Fill cfg from argv and the environment (envp: NULL-terminated "NAME=value" array, usually
 * `environ`). cfg is fully initialised with defaults first; on any result call sc_config_free().
 * Validates syntax (addresses, numbers, backend names, level); does not bind sockets.
 */
enum sc_config_result sc_config_parse(struct sc_config *cfg, int argc, char **argv, char **envp,
				      struct sc_err *err);
void sc_config_free(struct sc_config *cfg);

/* Print the --help text (every option, its env twin and its default) to f. */
void sc_config_usage(FILE *f, const char *argv0);

#endif
