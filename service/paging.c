/* SPDX-License-Identifier: Apache-2.0 */
/*
 * paging.c: page size and page token checks for ListRegions and ListOperations. Runs on gRPC
 * worker threads; no state.
 */
#include "paging.h"

#include "engine/engine.h"

#include <ctype.h>
#include <string.h>

size_t sc_page_size(uint32_t asked)
{
	if (asked == 0)
		return SC_PAGE_SIZE_DEFAULT;
	return asked > SC_PAGE_SIZE_MAX ? SC_PAGE_SIZE_MAX : asked;
}

int sc_page_token_check(const char *token, struct sc_err *err)
{
	size_t n = token ? strlen(token) : 0;
	bool ok = n < SC_ID_MAX;
	for (size_t i = 0; ok && i < n; i++)
		ok = isalnum((unsigned char)token[i]) || token[i] == '-';
	if (!ok)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "page_token is not one this sidecar handed out: pass the previous "
				  "response's next_page_token, or leave it empty for the first page");
	return 0;
}
