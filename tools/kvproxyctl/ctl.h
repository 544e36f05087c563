/* SPDX-License-Identifier: BSD-3-Clause */
/* kvproxyctl internals shared by the command files. */
#ifndef KVPROXYCTL_CTL_H
#define KVPROXYCTL_CTL_H

#include <stdbool.h>
#include <stdio.h>

#include <jansson.h>

#define EXIT_RPC_ERROR 1
#define EXIT_USAGE     2
#define EXIT_CONN      3

struct opts {
	const char *socket;
	double timeout_s;
	bool json;
};

struct cmd_opts {
	bool prometheus;
	bool no_wait;
	long limit;      /* 0: the daemon's default */
	long count;      /* watch: 0 = until interrupted */
	double interval; /* watch */
	double wait_s;   /* drain */
};

extern const char *prog;

/** Print "prog: message" and a hint; @return EXIT_USAGE. */
int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/** One JSON-RPC call; @p params is stolen. @return 0 with *result, or an exit status. */
int rpc_call(const struct opts *o, const char *method, json_t *params, json_t **result);
/** A command's own options; @return -1 to continue, or an exit status. */
int parse_cmd_opts(const char *cmd, int argc, char **argv, struct opts *o, struct cmd_opts *co);
/** Print a result: JSON with --json, else as an object with keys in @p order first. */
void show(const struct opts *o, json_t *res, const char *const *order);
/** Call @p method with @p params (stolen) and show the result. */
int simple_call(struct opts *o, const char *method, json_t *params, const char *const *order);
bool is_table(const json_t *v);
void print_table(json_t *rows, const char *const *order, int indent);
void print_json(json_t *v);
/** Parse a non-negative integer <= @p max. */
bool parse_id(const char *s, json_int_t max, json_int_t *out);

/* cmd_rails.c */
/** watch: one line per RDMA rail (nothing without RDMA); @p dt seconds since the last call. */
void watch_rails(json_t *stats, double dt);
bool rails_usage(FILE *f, const char *cmd);
int cmd_rails(struct opts *o, int argc, char **argv);
int cmd_rail_pause(struct opts *o, int argc, char **argv);
int cmd_rail_resume(struct opts *o, int argc, char **argv);

#endif /* KVPROXYCTL_CTL_H */
