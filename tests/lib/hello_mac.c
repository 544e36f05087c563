/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The peer handshake's proof of the shared secret, restated from its
 * definition (not lib/core's code), so that a handshake test catches a
 * daemon that computes or checks it differently.
 */
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "kvp_test.h"

void
kvp_test_hello_mac(const char *secret, char role, const uint8_t challenge[32],
		   const uint8_t own[32], const char *from, const char *to, uint8_t mac[32])
{
	uint8_t msg[1 + 32 + 32 + 2 * KVP_NODE_ID_MAX];
	unsigned len = 32;

	memset(msg, 0, sizeof(msg));
	msg[0] = (uint8_t)role;
	memcpy(msg + 1, challenge, 32);
	memcpy(msg + 33, own, 32);
	memcpy(msg + 65, from, strnlen(from, KVP_NODE_ID_MAX - 1));
	memcpy(msg + 65 + KVP_NODE_ID_MAX, to, strnlen(to, KVP_NODE_ID_MAX - 1));
	HMAC(EVP_sha256(), secret, (int)strlen(secret), msg, sizeof(msg), mac, &len);
}
