/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvproxyctl: the transport. JSON-RPC 2.0 over the daemon's admin UNIX
 * stream socket, one JSON object per line: one request, one reply, then
 * the connection is closed.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"

/* A reply larger than this is treated as a broken daemon, not buffered forever. */
#define REPLY_MAX  (64u << 20)
#define REQUEST_ID 1

double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/** Milliseconds left until @p deadline for poll(), at least 0. */
static int
ms_left(double deadline)
{
	double left = deadline - now_s();

	if (left <= 0)
		return 0;
	if (left > 3600)
		return 3600 * 1000;
	/* Round up so a positive remainder never becomes a zero poll timeout. */
	return (int)(left * 1000.0) + 1;
}

/*
 * Connect within the deadline. A non-blocking connect on a UNIX socket
 * either completes at once or fails with EAGAIN when the listen backlog is
 * full; the latter is retried until the deadline.
 */
static int
connect_admin(const char *path, double deadline)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		fprintf(stderr, "%s: socket path too long: %s\n", prog, path);
		return -ENAMETOOLONG;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);

	for (;;) {
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0) {
			fprintf(stderr, "%s: socket: %s\n", prog, strerror(errno));
			return -errno;
		}
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			return fd;
		int err = errno;

		close(fd);
		if (err != EAGAIN || now_s() >= deadline) {
			fprintf(stderr, "%s: cannot connect to %s: %s\n", prog, path,
				err == EAGAIN ? "timed out (backlog full)" : strerror(err));
			return -err;
		}
		/* Backlog full: nothing to poll on for a UNIX connect; retry shortly. */
		poll(NULL, 0, 10);
	}
}

static int
send_all(int fd, const char *buf, size_t len, double deadline, const char *path)
{
	while (len > 0) {
		ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);

		if (n > 0) {
			buf += n;
			len -= (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			struct pollfd p = { .fd = fd, .events = POLLOUT };
			int timeout = ms_left(deadline);

			if (timeout == 0 || poll(&p, 1, timeout) == 0) {
				fprintf(stderr, "%s: %s: timed out sending the request\n", prog,
					path);
				return -ETIMEDOUT;
			}
			continue;
		}
		/* EPIPE: the caller looks for the daemon's reason first. */
		if (errno != EPIPE)
			fprintf(stderr, "%s: %s: send: %s\n", prog, path, strerror(errno));
		return -errno;
	}
	return 0;
}

/** Read one '\n'-terminated line; *out is NUL-terminated without the newline. */
static int
recv_line(int fd, char **out, size_t *outlen, double deadline, const char *path)
{
	size_t cap = 65536, len = 0;
	char *buf = malloc(cap);

	if (buf == NULL)
		return -ENOMEM;
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int timeout = ms_left(deadline);
		int r = timeout > 0 ? poll(&p, 1, timeout) : 0;

		if (r < 0 && errno == EINTR)
			continue;
		if (r == 0) {
			fprintf(stderr, "%s: %s: timed out waiting for the reply\n", prog, path);
			free(buf);
			return -ETIMEDOUT;
		}
		if (len + 1 >= cap) {
			if (cap >= REPLY_MAX) {
				fprintf(stderr, "%s: %s: reply longer than %u bytes\n", prog, path,
					REPLY_MAX);
				free(buf);
				return -EMSGSIZE;
			}
			char *nb = realloc(buf, cap * 2);

			if (nb == NULL) {
				free(buf);
				return -ENOMEM;
			}
			buf = nb;
			cap *= 2;
		}
		ssize_t n = recv(fd, buf + len, cap - 1 - len, 0);

		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n < 0) {
			fprintf(stderr, "%s: %s: recv: %s\n", prog, path, strerror(errno));
			free(buf);
			return -errno;
		}
		if (n == 0) {
			fprintf(stderr, "%s: %s: connection closed before a complete reply\n", prog,
				path);
			free(buf);
			return -ECONNRESET;
		}
		char *nl = memchr(buf + len, '\n', (size_t)n);

		len += (size_t)n;
		if (nl != NULL) {
			*nl = '\0';
			*out = buf;
			*outlen = (size_t)(nl - buf);
			return 0;
		}
	}
}

/*
 * Send @p method with @p params (reference stolen) and return the result.
 *
 * @return 0 with *result set (caller decrefs); EXIT_RPC_ERROR after printing
 *   the error; EXIT_CONN after printing why there is no usable reply
 */
int
rpc_call(const struct opts *o, const char *method, json_t *params, json_t **result)
{
	double deadline = now_s() + o->timeout_s;
	json_t *req = json_pack("{s:s, s:i, s:s, s:o}", "jsonrpc", "2.0", "id", REQUEST_ID,
				"method", method, "params", params);
	char *line = NULL, *reply = NULL;
	size_t reply_len = 0;
	json_t *rep = NULL;
	json_error_t jerr;
	int fd, ret = EXIT_CONN;

	if (req == NULL) {
		fprintf(stderr, "%s: cannot build the request\n", prog);
		return EXIT_CONN;
	}
	line = json_dumps(req, JSON_COMPACT);
	json_decref(req);
	if (line == NULL)
		return EXIT_CONN;
	/* json_dumps never emits a raw newline, so one line is one request. */
	size_t len = strlen(line);
	char *framed = realloc(line, len + 2);

	if (framed == NULL)
		goto err_free_line;
	line = framed;
	line[len] = '\n';
	line[len + 1] = '\0';

	fd = connect_admin(o->socket, deadline);
	if (fd < 0)
		goto err_free_line;
	int sent = send_all(fd, line, len + 1, deadline, o->socket);

	/*
	 * A daemon that refuses the connection (too many, out of file
	 * descriptors) writes its error line and closes: read it rather than
	 * report the closed socket.
	 */
	if (sent == -EPIPE && recv_line(fd, &reply, &reply_len, now_s() + 0.5, o->socket) < 0) {
		fprintf(stderr, "%s: %s: send: %s\n", prog, o->socket, strerror(EPIPE));
		goto err_close;
	}
	if (sent < 0 && sent != -EPIPE)
		goto err_close;
	if (sent == 0 && recv_line(fd, &reply, &reply_len, deadline, o->socket) < 0)
		goto err_close;

	rep = json_loadb(reply, reply_len, 0, &jerr);
	if (rep == NULL) {
		fprintf(stderr, "%s: %s: reply is not JSON: %s\n", prog, o->socket, jerr.text);
		goto err_free_reply;
	}
	if (!json_is_object(rep) || !json_is_string(json_object_get(rep, "jsonrpc")) ||
	    strcmp(json_string_value(json_object_get(rep, "jsonrpc")), "2.0") != 0) {
		fprintf(stderr, "%s: %s: reply is not a JSON-RPC 2.0 object\n", prog, o->socket);
		goto err_decref;
	}

	json_t *err = json_object_get(rep, "error");
	json_t *res = json_object_get(rep, "result");
	json_t *id = json_object_get(rep, "id");

	if (err != NULL) {
		json_t *code = json_object_get(err, "code");
		json_t *msg = json_object_get(err, "message");

		if (!json_is_integer(code) || !json_is_string(msg)) {
			fprintf(stderr, "%s: %s: malformed error object in reply\n", prog,
				o->socket);
			goto err_decref;
		}
		/* An error may carry a null id (e.g. the daemon could not parse us). */
		fprintf(stderr, "error %" JSON_INTEGER_FORMAT ": %s\n", json_integer_value(code),
			json_string_value(msg));
		json_t *data = json_object_get(err, "data");

		if (data != NULL) {
			char *d = json_dumps(data, JSON_COMPACT | JSON_ENCODE_ANY);

			if (d != NULL)
				fprintf(stderr, "  data: %s\n", d);
			free(d);
		}
		ret = EXIT_RPC_ERROR;
		goto err_decref;
	}
	if (res == NULL) {
		fprintf(stderr, "%s: %s: reply has neither result nor error\n", prog, o->socket);
		goto err_decref;
	}
	if (!json_is_integer(id) || json_integer_value(id) != REQUEST_ID) {
		fprintf(stderr, "%s: %s: reply id does not match the request\n", prog, o->socket);
		goto err_decref;
	}
	*result = json_incref(res);
	ret = 0;

err_decref:
	json_decref(rep);
err_free_reply:
	free(reply);
err_close:
	close(fd);
err_free_line:
	free(line);
	return ret;
}
