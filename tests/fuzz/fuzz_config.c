/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_config.c: libFuzzer target for the command line and environment parser (sc_config_parse,
 * sidecar/conf/config.c). The input is lines ('\n'); a line that starts with "RDMA_SIDECAR_" is an
 * environment entry (NAME=value), any other an argument, in order (at most 64 of each). The
 * parse must return one of its three results; an error must say why (err.code and message set);
 * sc_config_free must leave nothing behind (ASan's leak check at exit). --help and --version
 * print to stdout, which is sent to /dev/null.
 * Built with -DSC_FUZZ_GEN_SEEDS (no libFuzzer) it writes a seed corpus into argv[1]: the
 * command lines of deploy/, the README and the tests, every option from the --help text with a
 * sample value, and the environment twins. Single-threaded.
 */
#include "conf/config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ENTRIES 64
#define ENV_PREFIX "RDMA_SIDECAR_"

#ifndef SC_FUZZ_GEN_SEEDS

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static bool quiet;
	if (!quiet) {
		if (!freopen("/dev/null", "w", stdout))
			abort();
		quiet = true;
	}
	char *text = malloc(size + 1);
	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';
	char *argv[MAX_ENTRIES + 2], *envp[MAX_ENTRIES + 1];
	int argc = 0, envc = 0;
	argv[argc++] = "rdma-sidecar";
	for (char *line = text, *next; line && argc <= MAX_ENTRIES && envc < MAX_ENTRIES;
	     line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		if (strncmp(line, ENV_PREFIX, strlen(ENV_PREFIX)) == 0)
			envp[envc++] = line;
		else
			argv[argc++] = line;
	}
	argv[argc] = NULL;
	envp[envc] = NULL;
	struct sc_config cfg;
	struct sc_err err = {0};
	enum sc_config_result rc = sc_config_parse(&cfg, argc, argv, envp, &err);
	if (rc != SC_CONFIG_OK && rc != SC_CONFIG_EXIT && rc != SC_CONFIG_ERROR)
		abort();
	if (rc == SC_CONFIG_ERROR && (err.code == SC_OK || !err.msg[0]))
		abort();
	sc_config_free(&cfg);
	sc_config_free(&cfg); /* documented idempotent */
	free(text);
	return 0;
}

#else

static const char *const fixed[] = {
    "--id\nnode-1\n--grpc-listen\nunix:/run/rdma-sidecar/"
    "sidecar.sock\n--data-listen\n0.0.0.0:7000\n"
    "--advertise\n10.0.0.5\n--shm-dir\n/dev/shm/rdma-sidecar\n--key-file\n/etc/rdma-sidecar/keys\n",
    "--nats-url\nnats://user:pw@nats:4222\n--backends\ntcp,local\n--log-level\ndebug\n--log-json\n",
    "--default-timeout=30s\n--retention=2m\n--grace-period=1500\n--max-concurrent-transfers=7\n"
    "--max-inflight-bytes=1GiB\n--max-message-size=4M\n--grpc-threads=8\n--tcp-streams=4\n"
    "--tcp-chunk-size=1MiB\n--max-region-size=2T\n",
    "--grpc-listen\n[::1]:50051\n--grpc-listen\n127.0.0.1:50052\n--metrics-listen\n:9100\n",
    "--ib-device\nmlx5_0\n--ib-port\n2\n--ib-gid-index\n3\n--\n",
    "RDMA_SIDECAR_ID=from-env\nRDMA_SIDECAR_GRPC_LISTEN=unix:/a.sock,127.0.0.1:1,[::1]:2\n"
    "RDMA_SIDECAR_DATA_LISTEN=1.2.3.4:5\nRDMA_SIDECAR_BACKENDS=TCP\nRDMA_SIDECAR_LOG_JSON=1\n"
    "RDMA_SIDECAR_MAX_INFLIGHT_BYTES=16MiB\n--id\nflag-wins\n",
    "--help\n",
    "--version\n",
    "--frob\n--ib-port\n0\n",
    "--data-listen\n999.1.1.1:70000\n--default-timeout\n-1s\n",
};

static int n_seeds;

static void write_seed(const char *dir, const char *text, size_t len)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/config-%03d", dir, n_seeds++);
	FILE *f = fopen(path, "wb");
	if (!f) {
		perror(path);
		exit(1);
	}
	fwrite(text, 1, len, f);
	fclose(f);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s SEED_DIR\n", argv[0]);
		return 2;
	}
	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
		write_seed(argv[1], fixed[i], strlen(fixed[i]));
	/* Every option the --help text names, with a value of the kind its placeholder asks for,
	 * and its environment twin. */
	char *usage = NULL;
	size_t usage_len = 0;
	FILE *m = open_memstream(&usage, &usage_len);
	if (!m)
		return 1;
	sc_config_usage(m, "rdma-sidecar");
	fclose(m);
	for (char *p = usage; (p = strstr(p, "--")) != NULL;) {
		char name[64];
		size_t n = strspn(p + 2, "abcdefghijklmnopqrstuvwxyz0123456789-");
		if (n == 0 || n >= sizeof(name)) {
			p += 2;
			continue;
		}
		memcpy(name, p + 2, n);
		name[n] = '\0';
		p += 2 + n;
		const char *value = "1";
		if (strstr(name, "listen") || strstr(name, "advertise"))
			value = "127.0.0.1:7000";
		else if (strstr(name, "timeout") || strstr(name, "retention") ||
			 strstr(name, "period"))
			value = "1500ms";
		else if (strstr(name, "size") || strstr(name, "bytes"))
			value = "64KiB";
		char seed[512];
		int len = snprintf(seed, sizeof(seed), "--%s\n%s\n", name, value);
		write_seed(argv[1], seed, (size_t)len);
		char env[128];
		size_t k = 0;
		for (const char *c = name; *c && k + 1 < sizeof(env); c++)
			env[k++] = *c == '-' ? '_' : (char)(*c >= 'a' && *c <= 'z' ? *c - 32 : *c);
		env[k] = '\0';
		len = snprintf(seed, sizeof(seed), ENV_PREFIX "%s=%s\n", env, value);
		write_seed(argv[1], seed, (size_t)len);
	}
	free(usage);
	printf("%d seeds in %s\n", n_seeds, argv[1]);
	return 0;
}

#endif
