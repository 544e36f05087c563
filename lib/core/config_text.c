/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The configuration file's text before libconfig sees it.
 *
 * libconfig before 1.7 (Debian 12 ships 1.5) reads an integer literal
 * without an "L" suffix as a C int: 99999999999999 silently becomes
 * 276447231 and 2147483648 becomes negative, so a range check after it
 * checks the wrong number. Here every integer literal outside strings and
 * comments gets the suffix, which makes libconfig read it as 64 bits on
 * every version, and a literal that does not fit even those is an error at
 * its line. Only "L" characters are inserted, never a newline, so
 * libconfig's line numbers stay those of the file.
 *
 * "@include" is refused: the included file would reach libconfig without
 * passing through here.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_priv.h"

/* A configuration is a few KiB; this only bounds what a wrong path could make us read. */
#define CONFIG_TEXT_MAX (4u << 20)

static bool
is_digit(char c)
{
	return c >= '0' && c <= '9';
}

static bool
is_hex(char c)
{
	return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* libconfig names: [A-Za-z*][-A-Za-z0-9_*]* */
static bool
is_name_start(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '*';
}

static bool
is_name_char(char c)
{
	return is_name_start(c) || is_digit(c) || c == '-' || c == '_';
}

/* Does the literal [s, s+n) (digits, or hex digits after "0x") fit in an int64_t? */
static bool
fits_int64(const char *s, size_t n, bool hex)
{
	uint64_t v = 0;

	for (size_t i = 0; i < n; i++) {
		unsigned d = is_digit(s[i]) ? (unsigned)(s[i] - '0') :
			     (s[i] >= 'a')  ? (unsigned)(s[i] - 'a' + 10) :
					      (unsigned)(s[i] - 'A' + 10);
		uint64_t base = hex ? 16 : 10;

		if (v > (UINT64_MAX - d) / base)
			return false;
		v = v * base + d;
	}
	return v <= (uint64_t)INT64_MAX;
}

static int __attribute__((format(printf, 5, 6)))
text_error(char *err, size_t errlen, const char *path, unsigned line, const char *fmt, ...)
{
	va_list ap;
	int n = snprintf(err, errlen, "%s:%u: ", path, line);

	if (n >= 0 && (size_t)n < errlen) {
		va_start(ap, fmt);
		vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

static int
read_file(const char *path, char **text, size_t *len, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	size_t cap = 4096, n = 0;
	char *buf;

	if (fd < 0) {
		snprintf(err, errlen, "%s:0: cannot read file", path);
		return -ENOENT;
	}
	buf = malloc(cap);
	while (buf) {
		if (n == cap) {
			char *nb = cap < CONFIG_TEXT_MAX ? realloc(buf, cap * 2) : NULL;

			if (!nb) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = nb;
			cap *= 2;
		}
		ssize_t r = read(fd, buf + n, cap - n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			free(buf);
			close(fd);
			snprintf(err, errlen, "%s:0: cannot read file", path);
			return -ENOENT;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	if (!buf) {
		snprintf(err, errlen, "%s:0: file too large (over %u bytes) or out of memory", path,
			 CONFIG_TEXT_MAX);
		return -EINVAL;
	}
	*text = buf;
	*len = n;
	return 0;
}

int
config_text_load(const char *path, char **out, size_t *outlen, char *err, size_t errlen)
{
	char *in, *o;
	size_t len, k = 0;
	unsigned line = 1;
	int rc = read_file(path, &in, &len, err, errlen);

	if (rc < 0)
		return rc;
	/* At worst every other byte is a one-digit literal: an "L" after each. */
	o = malloc(len * 2 + 1);
	if (!o) {
		free(in);
		snprintf(err, errlen, "%s:0: out of memory", path);
		return -ENOMEM;
	}
	for (size_t i = 0; i < len;) {
		char c = in[i];

		if (c == '\n') {
			line++;
			o[k++] = in[i++];
		} else if (c == '#' || (c == '/' && i + 1 < len && in[i + 1] == '/')) {
			while (i < len && in[i] != '\n')
				o[k++] = in[i++];
		} else if (c == '/' && i + 1 < len && in[i + 1] == '*') {
			o[k++] = in[i++];
			o[k++] = in[i++];
			while (i < len) {
				if (in[i] == '*' && i + 1 < len && in[i + 1] == '/') {
					o[k++] = in[i++];
					o[k++] = in[i++];
					break;
				}
				line += in[i] == '\n';
				o[k++] = in[i++];
			}
		} else if (c == '"') {
			o[k++] = in[i++];
			while (i < len && in[i] != '"') {
				if (in[i] == '\\' && i + 1 < len)
					o[k++] = in[i++];
				line += in[i] == '\n';
				o[k++] = in[i++];
			}
			if (i < len)
				o[k++] = in[i++];
		} else if (c == '@') {
			rc = text_error(err, errlen, path, line,
					"@include is not supported: keep the configuration in one "
					"file");
			goto err;
		} else if (is_name_start(c)) {
			while (i < len && is_name_char(in[i]))
				o[k++] = in[i++];
		} else if (is_digit(c) || (c == '.' && i + 1 < len && is_digit(in[i + 1]))) {
			bool hex =
				c == '0' && i + 1 < len && (in[i + 1] == 'x' || in[i + 1] == 'X');
			size_t start = i;

			if (hex) {
				o[k++] = in[i++];
				o[k++] = in[i++];
				start = i;
				while (i < len && is_hex(in[i]))
					o[k++] = in[i++];
			} else {
				while (i < len && is_digit(in[i]))
					o[k++] = in[i++];
			}
			bool real = !hex && i < len &&
				    (in[i] == '.' || in[i] == 'e' || in[i] == 'E' || c == '.');

			if (real) {
				/* A float: copy it whole (digits, point, exponent with its sign). */
				while (i < len && (is_digit(in[i]) || in[i] == '.' ||
						   in[i] == 'e' || in[i] == 'E' ||
						   ((in[i] == '-' || in[i] == '+') &&
						    (in[i - 1] == 'e' || in[i - 1] == 'E'))))
					o[k++] = in[i++];
				continue;
			}
			if (i > start && !fits_int64(in + start, i - start, hex)) {
				rc = text_error(err, errlen, path, line,
						"integer %.*s%.*s does not fit in 64 bits",
						hex ? 2 : 0, "0x",
						(int)(i - start < 40 ? i - start : 40), in + start);
				goto err;
			}
			if (i > start && (i >= len || in[i] != 'L'))
				o[k++] = 'L';
		} else {
			o[k++] = in[i++];
		}
	}
	o[k] = '\0';
	free(in);
	*out = o;
	*outlen = k;
	return 0;

err:
	free(in);
	free(o);
	return rc;
}
