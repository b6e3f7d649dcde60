/* SPDX-License-Identifier: Apache-2.0 */
/*
 * paging.h: page_size and page_token of the List RPCs. A token is the last id of the previous
 * page (opaque to clients); the next page holds the ids that sort after it, so a page is stable
 * while entries come and go. Pure functions; any thread.
 */
#ifndef SC_PAGING_H
#define SC_PAGING_H

#include "base/status.h"

#include <stddef.h>
#include <stdint.h>

#define SC_PAGE_SIZE_DEFAULT 500
#define SC_PAGE_SIZE_MAX 5000

/* 0 -> the default; above the maximum -> the maximum. */
size_t sc_page_size(uint32_t asked);
/* A token must look like an id the sidecar hands out; INVALID_ARGUMENT otherwise. */
int sc_page_token_check(const char *token, struct sc_err *err);

#endif
