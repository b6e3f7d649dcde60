/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nats/nkey.h: the public key of a NATS NKey seed file (--nats-nkey-seed), which nats.c's
 * natsOptions_SetNKeyFromSeed needs besides the seed. Pure; any thread.
 */
#ifndef SC_NATS_NKEY_H
#define SC_NATS_NKEY_H

#include "base/status.h"

#include <stddef.h>

/* An NKey public key: 56 base32 characters and a NUL. */
#define SC_NKEY_PUBLIC_LEN 57

/*
 * Read the seed ("SU...", base32, with its CRC16) from path and write the matching public key
 * ("U...") into pub. Errors: FAILED_PRECONDITION for an unreadable file, INVALID_ARGUMENT for
 * contents that are not an NKey seed (bad base32, length, prefix or checksum), naming the flag.
 */
int sc_nkey_public_from_seed_file(const char *path, char pub[SC_NKEY_PUBLIC_LEN],
				  struct sc_err *err);

#endif
