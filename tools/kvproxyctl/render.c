/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvproxyctl: rendering of results as aligned text. Unknown result fields
 * are rendered generically, so the daemon can add fields without breaking
 * this tool.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"

/** Text for one value in a table cell or a key/value line; caller frees. */
static char *
value_str(const json_t *v)
{
	char *s = NULL;

	switch (json_typeof(v)) {
	case JSON_STRING:
		s = strdup(json_string_length(v) > 0 ? json_string_value(v) : "-");
		break;
	case JSON_INTEGER:
		if (asprintf(&s, "%" JSON_INTEGER_FORMAT, json_integer_value(v)) < 0)
			s = NULL;
		break;
	case JSON_REAL:
		if (asprintf(&s, "%.6g", json_real_value(v)) < 0)
			s = NULL;
		break;
	case JSON_TRUE:
		s = strdup("true");
		break;
	case JSON_FALSE:
		s = strdup("false");
		break;
	case JSON_NULL:
		s = strdup("-");
		break;
	default:
		s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
		break;
	}
	return s != NULL ? s : strdup("?");
}

static bool
ends_with(const char *s, const char *suffix)
{
	size_t ls = strlen(s), lx = strlen(suffix);

	return ls >= lx && strcmp(s + ls - lx, suffix) == 0;
}

/** Readable annotation for some well-known numeric keys ("" if none). */
static void
annotate(const char *key, const json_t *v, char *buf, size_t len)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB" };

	buf[0] = '\0';
	if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) > 9.2e18)
		return;
	/* Whole units are enough for these notes; uptime may come as a real. */
	long long n = (long long)json_number_value(v);

	if ((ends_with(key, "_bytes") || strcmp(key, "bytes") == 0) && n >= 1024) {
		double x = (double)n;
		unsigned u = 0;

		x /= 1024.0;
		while (x >= 1024.0 && u + 1 < sizeof(units) / sizeof(units[0])) {
			x /= 1024.0;
			u++;
		}
		snprintf(buf, len, " (%.1f %s)", x, units[u]);
	} else if (ends_with(key, "uptime_s") && n >= 60) {
		long long d = n / 86400, h = n / 3600 % 24, m = n / 60 % 60, sec = n % 60;

		if (d > 0)
			snprintf(buf, len, " (%lldd%02lldh%02lldm)", d, h, m);
		else if (h > 0)
			snprintf(buf, len, " (%lldh%02lldm%02llds)", h, m, sec);
		else
			snprintf(buf, len, " (%lldm%02llds)", m, sec);
	}
}

/** True if @p v is a non-empty array of objects, or an empty array (a table). */
bool
is_table(const json_t *v)
{
	if (!json_is_array(v))
		return false;
	for (size_t i = 0; i < json_array_size(v); i++)
		if (!json_is_object(json_array_get(v, i)))
			return false;
	return true;
}


/*
 * Keys of @p obj in display order: those in @p order that are present, then
 * the rest in the order the daemon sent them. Returns a NULL-terminated
 * array (caller frees; the strings belong to @p obj).
 */
static const char **
ordered_keys(json_t *obj, const char *const *order)
{
	size_t n = json_object_size(obj), k = 0;
	const char **keys = calloc(n + 1, sizeof(*keys));

	if (keys == NULL)
		return NULL;
	for (size_t i = 0; order != NULL && order[i] != NULL; i++)
		if (json_object_get(obj, order[i]) != NULL)
			keys[k++] = json_object_iter_key(json_object_iter_at(obj, order[i]));
	for (void *it = json_object_iter(obj); it != NULL; it = json_object_iter_next(obj, it)) {
		const char *key = json_object_iter_key(it);
		bool listed = false;

		for (size_t i = 0; order != NULL && order[i] != NULL; i++)
			if (strcmp(order[i], key) == 0)
				listed = true;
		if (!listed && k < n)
			keys[k++] = key;
	}
	keys[k] = NULL;
	return keys;
}

/** Print an array of objects as an aligned table; columns are the union of keys. */
void
print_table(json_t *rows, const char *const *order, int indent)
{
	size_t nrows = json_array_size(rows), ncols = 0, i, c;
	json_t *all = json_object(), *row;
	const char **cols = NULL;
	char ***cells = NULL;
	size_t *width = NULL;
	bool *right = NULL;

	if (nrows == 0) {
		printf("%*s(none)\n", indent, "");
		json_decref(all);
		return;
	}
	/* Union of keys, in row order, for the generic columns. */
	for (i = 0; i < nrows; i++) {
		row = json_array_get(rows, i);
		for (void *it = json_object_iter(row); it != NULL;
		     it = json_object_iter_next(row, it))
			if (json_object_get(all, json_object_iter_key(it)) == NULL)
				json_object_set_new(all, json_object_iter_key(it), json_null());
	}
	cols = ordered_keys(all, order);
	if (cols == NULL)
		goto out;
	while (cols[ncols] != NULL)
		ncols++;
	cells = calloc(nrows, sizeof(*cells));
	width = calloc(ncols, sizeof(*width));
	right = calloc(ncols, sizeof(*right));

	if (cells == NULL || width == NULL || right == NULL)
		goto out_free;
	for (c = 0; c < ncols; c++) {
		width[c] = strlen(cols[c]);
		right[c] = true;
	}
	for (i = 0; i < nrows; i++) {
		row = json_array_get(rows, i);
		cells[i] = calloc(ncols, sizeof(**cells));
		if (cells[i] == NULL)
			goto out_free;
		for (c = 0; c < ncols; c++) {
			json_t *v = json_object_get(row, cols[c]);

			cells[i][c] = v != NULL ? value_str(v) : strdup("-");
			if (cells[i][c] == NULL)
				goto out_free;
			if (v != NULL && !json_is_number(v))
				right[c] = false;
			if (strlen(cells[i][c]) > width[c])
				width[c] = strlen(cells[i][c]);
		}
	}
	printf("%*s", indent, "");
	for (c = 0; c < ncols; c++) {
		char hdr[256];
		size_t l = strlen(cols[c]);

		if (l >= sizeof(hdr))
			l = sizeof(hdr) - 1;
		for (size_t j = 0; j < l; j++)
			hdr[j] = (char)(cols[c][j] >= 'a' && cols[c][j] <= 'z' ? cols[c][j] - 32 :
										 cols[c][j]);
		hdr[l] = '\0';
		if (c + 1 == ncols && !right[c])
			printf("%s", hdr);
		else
			printf(right[c] ? "%*s" : "%-*s", (int)width[c], hdr);
		printf(c + 1 < ncols ? "  " : "\n");
	}
	for (i = 0; i < nrows; i++) {
		printf("%*s", indent, "");
		for (c = 0; c < ncols; c++) {
			if (c + 1 == ncols && !right[c])
				printf("%s", cells[i][c]);
			else
				printf(right[c] ? "%*s" : "%-*s", (int)width[c], cells[i][c]);
			printf(c + 1 < ncols ? "  " : "\n");
		}
	}

out_free:
	if (cells != NULL)
		for (i = 0; i < nrows; i++) {
			if (cells[i] != NULL)
				for (c = 0; c < ncols; c++)
					free(cells[i][c]);
			free(cells[i]);
		}
	free(cells);
	free(width);
	free(right);
	free(cols);
out:
	json_decref(all);
}

/*
 * Print an object: scalars (and arrays of scalars) as aligned key/value
 * lines first, then nested objects as indented sections and arrays of
 * objects as tables, each under a "name:" heading.
 */
void
print_object(json_t *obj, const char *const *order, int indent)
{
	const char **keys = ordered_keys(obj, order);
	size_t kw = 0, i;
	bool first_section = true;

	if (keys == NULL)
		return;
	for (i = 0; keys[i] != NULL; i++) {
		json_t *v = json_object_get(obj, keys[i]);

		if (!json_is_object(v) && !is_table(v) && strlen(keys[i]) > kw)
			kw = strlen(keys[i]);
	}
	for (i = 0; keys[i] != NULL; i++) {
		json_t *v = json_object_get(obj, keys[i]);
		char note[64];

		if (json_is_object(v) || is_table(v))
			continue;
		char *s = value_str(v);

		annotate(keys[i], v, note, sizeof(note));
		printf("%*s%-*s  %s%s\n", indent, "", (int)kw, keys[i], s, note);
		free(s);
	}
	for (i = 0; keys[i] != NULL; i++) {
		json_t *v = json_object_get(obj, keys[i]);

		if (!json_is_object(v) && !is_table(v))
			continue;
		if (kw > 0 || !first_section)
			printf("\n");
		first_section = false;
		printf("%*s%s:\n", indent, "", keys[i]);
		if (json_is_object(v))
			print_object(v, section_order(keys[i]), indent + 2);
		else
			print_table(v, section_order(keys[i]), indent + 2);
	}
	free(keys);
}

void
print_json(json_t *v)
{
	/* 15 digits: reals (uptime) print as the daemon meant them, not as 3725.4200000000001. */
	char *s = json_dumps(v, JSON_INDENT(2) | JSON_ENCODE_ANY | JSON_REAL_PRECISION(15));

	if (s != NULL)
		printf("%s\n", s);
	free(s);
}

/* Print the result: JSON with --json, else the generic object view. */
void
show(const struct opts *o, json_t *res, const char *const *order)
{
	if (o->json)
		print_json(res);
	else
		show_text(res, order);
}

void
show_text(json_t *res, const char *const *order)
{
	if (!json_is_object(res))
		print_json(res);
	else
		print_object(res, order, 0);
}

bool
show_table(json_t *res, const char *key, const char *const *cols)
{
	json_t *rows = json_object_get(res, key);

	if (!is_table(rows)) {
		print_json(res);
		return false;
	}
	print_table(rows, cols, 0);
	return true;
}
