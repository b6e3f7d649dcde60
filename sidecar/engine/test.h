/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/test.h: test-only accessors into the engine (tests/unit/test_*_transfer.c), defined in
 * engine/engine.c (sc_engine_keyring: engine/keyring.c). Production code never calls them: the
 * engine hands its parts what they need when it creates them. Valid from sc_engine_create to sc_engine_destroy; any thread.
 */
#ifndef SC_ENGINE_TEST_H
#define SC_ENGINE_TEST_H

#include "backend/passive.h"
#include "base/types.h"

struct sc_backend;
struct sc_engine;
struct sc_keyring;
struct sc_peer_pool;
struct sc_peer_server;

/* The engine's backend of that kind (NULL for none). */
struct sc_backend *sc_engine_backend(struct sc_engine *eng, enum sc_backend_kind kind);
/* The peer-connection pool and the peer server (NULL when tcp and ibverbs are both off). */
struct sc_peer_pool *sc_engine_peer_pool(struct sc_engine *eng);
struct sc_peer_server *sc_engine_peer_server(struct sc_engine *eng);
/* The cluster keyring, retained (release it); NULL without --key-file. */
struct sc_keyring *sc_engine_keyring(struct sc_engine *eng);
/* The passive-operation interface over this engine, as the peer server gets it. */
struct sc_passive sc_engine_passive(struct sc_engine *eng);

#endif
