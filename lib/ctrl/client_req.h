/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The client socket's requests (client_req.c), as the connection side
 * (client_srv.c) sees them. The request side answers and reports what the
 * connection should do next; it never reaches back into the connection side
 * (dropping, releasing, what the socket is watched for): client_srv.c calls
 * client_req.c, never the other way. Main lcore, except reg_run on a helper.
 */
#ifndef CLIENT_REQ_H
#define CLIENT_REQ_H

#include "ctrl_priv.h"

/* A registration on a helper thread: the client's request, and what came of it. */
struct kvp_reg_job {
	struct kvp_job job; /* run: the request side's; done: the connection side's */
	struct kvp_region_table *t;
	uint32_t client; /* slot of the client conn (held until done) */
	uint32_t slot;	 /* the region slot reserved for it */
	int fd;		 /* the client's fd, closed once mapped (the mapping keeps the memory) */
	bool gpu;
	uint32_t flags;	 /* host: flags to map with */
	struct kvp_ctrl_req req;
	int rc;
	char why[KVP_ERRMSG_MAX];
};

/* What the connection side does after a request. */
enum client_next {
	CLIENT_NEXT_READ = 0, /* answered (or the answer went with the request): read on */
	CLIENT_NEXT_JOB,      /* n->reg_jobs[slot] is ready (but its done): post it, read nothing
				 until it comes back, then client_reg_reply() */
	CLIENT_NEXT_DROP,     /* disconnect the client, for the reason given */
};

/**
 * Serve one whole request of client @p c and answer it, unless it became a job.
 * @param why set to the reason with CLIENT_NEXT_DROP
 * @return what the connection does next
 */
enum client_next client_req(struct kvp_node *n, struct kvp_client_conn *c,
			    const struct kvp_ctrl_req *req, const char **why);
/** Publish job @p r's region and answer its client. @return 0, -EPIPE (the reply failed) */
int client_reg_reply(struct kvp_node *n, struct kvp_client_conn *c, struct kvp_reg_job *r);
/** Undo job @p r: its client left while it ran. */
void client_reg_discard(struct kvp_node *n, struct kvp_reg_job *r);

#endif /* CLIENT_REQ_H */
