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

/** Text view of a query result (never called with --json); @return an exit status. */
typedef int (*render_fn)(const struct cmd_opts *co, json_t *res);

/* A positional argument, sent as the param @p name. */
struct call_arg {
	const char *name;
	const char *label; /* in usage errors */
	json_int_t max;    /* 0: a string; else an integer in [0, max] */
};

/* A command whose positional arguments are its method's params: no code of its own. */
struct call_spec {
	const char *what; /* the arguments, for usage errors */
	int min;          /* how many of args are required */
	struct call_arg args[2];
	const char *const *order; /* key order of the result */
};

extern const char *prog;

/* kvproxyctl.c: option parsing and the per-command plumbing */
/** Print "prog: message" and a hint; @return EXIT_USAGE. */
int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/**
 * A command's own options into @p co (NULL: it takes none but --help and
 * --json), then @p min..@p max positional arguments, left at argv[optind..];
 * else a usage error naming @p what (or the first argument, where none is
 * allowed). @return -1 to continue, or an exit status.
 */
int parse_args(const char *cmd, int argc, char **argv, struct opts *o, struct cmd_opts *co, int min,
	       int max, const char *what);
/** Call @p method with @p params (stolen); print the result as JSON with --json, else @p render it. */
int query(struct opts *o, const char *method, json_t *params, const struct cmd_opts *co,
	  render_fn render);
/** Call @p method with @p params (stolen) and show the result. */
int simple_call(struct opts *o, const char *method, json_t *params, const char *const *order);

/* rpc.c */
double now_s(void);
/** One JSON-RPC call; @p params is stolen. @return 0 with *result, or an exit status. */
int rpc_call(const struct opts *o, const char *method, json_t *params, json_t **result);

/* render.c */
/** Print a result: JSON with --json, else as show_text(). */
void show(const struct opts *o, json_t *res, const char *const *order);
/** An object with keys in @p order first; anything else as JSON. */
void show_text(json_t *res, const char *const *order);
/** The rows under @p key as a table, else @p res as JSON; @return whether a table. */
bool show_table(json_t *res, const char *key, const char *const *cols);
bool is_table(const json_t *v);
void print_table(json_t *rows, const char *const *order, int indent);
void print_object(json_t *obj, const char *const *order, int indent);
void print_json(json_t *v);

/* Help text per command file: false when @p cmd is not one of the file's. */
bool node_usage(FILE *f, const char *cmd);
bool stats_usage(FILE *f, const char *cmd);
bool peers_usage(FILE *f, const char *cmd);
bool config_usage(FILE *f, const char *cmd);
bool doctor_usage(FILE *f, const char *cmd);
bool watch_usage(FILE *f, const char *cmd);
bool rails_usage(FILE *f, const char *cmd);

/* The commands, by kind as the command table in kvproxyctl.c runs them. */
/* cmd_node.c */
int render_status(const struct cmd_opts *co, json_t *res);
int cmd_drain(struct opts *o, int argc, char **argv);
int cmd_undrain(struct opts *o, int argc, char **argv);
int cmd_call(struct opts *o, int argc, char **argv);

/* cmd_stats.c */
/** Column order of the nested section or table @p name (stats' mostly), or NULL. */
const char *const *section_order(const char *name);
int render_stats(const struct cmd_opts *co, json_t *res);

/* cmd_peers.c */
int render_peers(const struct cmd_opts *co, json_t *res);
int render_transfers(const struct cmd_opts *co, json_t *res);
int render_slowest(const struct cmd_opts *co, json_t *res);
extern const struct call_spec cancel_spec;
int cmd_peer(struct opts *o, int argc, char **argv);
int cmd_config_reload(struct opts *o, int argc, char **argv);

/* cmd_config.c */
int cmd_config_get(struct opts *o, int argc, char **argv);
extern const struct call_spec config_set_spec;
extern const struct call_spec log_level_spec;

/* cmd_doctor.c */
int render_doctor(const struct cmd_opts *co, json_t *res);

/* cmd_watch.c */
int cmd_watch(struct opts *o, int argc, char **argv);

/* cmd_rails.c */
/** watch: one line per RDMA rail (nothing without RDMA); @p dt seconds since the last call. */
void watch_rails(json_t *stats, double dt);
int render_rails(const struct cmd_opts *co, json_t *res);
extern const struct call_spec rail_spec;

#endif /* KVPROXYCTL_CTL_H */
