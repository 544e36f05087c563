/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Replay driver for builds without libFuzzer (gcc, or clang without
 * -fsanitize=fuzzer): runs a harness once on every file named on the
 * command line, or found in a directory named there. A harness invariant
 * aborts, so a failing input fails the test; with -Db_sanitize the
 * sanitizers check the replay too.
 *
 * It is the whole of libkvp_test_replay: a harness defines no main, so the
 * linker takes this one from the archive, as -fsanitize=fuzzer takes
 * libFuzzer's.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned ran;

static int
run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	long len;

	if (!f) {
		perror(path);
		return -1;
	}
	fseek(f, 0, SEEK_END);
	len = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc(len > 0 ? (size_t)len : 1);
	if (!buf || (len > 0 && fread(buf, 1, (size_t)len, f) != (size_t)len)) {
		fprintf(stderr, "%s: cannot read\n", path);
		fclose(f);
		free(buf);
		return -1;
	}
	fclose(f);
	fprintf(stderr, "replay %s (%ld bytes)\n", path, len);
	LLVMFuzzerTestOneInput(buf, (size_t)len);
	free(buf);
	ran++;
	return 0;
}

static int
run_path(const char *path)
{
	struct stat st;

	if (stat(path, &st) < 0) {
		/* regress/<target>/ exists only once a crash has been kept there. */
		if (errno == ENOENT) {
			fprintf(stderr, "%s: absent, nothing to replay\n", path);
			return 0;
		}
		perror(path);
		return -1;
	}
	if (!S_ISDIR(st.st_mode))
		return run_file(path);

	struct dirent **ents;
	int n = scandir(path, &ents, NULL, alphasort), rc = 0;

	if (n < 0) {
		perror(path);
		return -1;
	}
	for (int i = 0; i < n; i++) {
		char p[4096];

		if (ents[i]->d_name[0] != '.' && strncmp(ents[i]->d_name, "README", 6) != 0 &&
		    snprintf(p, sizeof(p), "%s/%s", path, ents[i]->d_name) < (int)sizeof(p) &&
		    stat(p, &st) == 0 && S_ISREG(st.st_mode) && run_file(p) < 0)
			rc = -1;
		free(ents[i]);
	}
	free(ents);
	return rc;
}

int
main(int argc, char **argv)
{
	int rc = 0;

	if (LLVMFuzzerInitialize)
		LLVMFuzzerInitialize(&argc, &argv);
	for (int i = 1; i < argc; i++)
		if (run_path(argv[i]) < 0)
			rc = 1;
	printf("%s: replayed %u inputs\n", argv[0], ran);
	return rc;
}
