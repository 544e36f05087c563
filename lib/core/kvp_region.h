/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_region: memory clients registered (host memory mapped from their fds,
 * GPU memory imported through the memory-ops hook), looked up by key from
 * any lcore; the memory-ops hook that copies between regions and host
 * memory (memcpy, or CUDA once lib/cuda installs itself); the registration
 * hooks a transport installs.
 *
 * Threading: the table is written only on the main lcore; worker lcores
 * read regions through kvp_region_get()/put(), which is safe against
 * concurrent removal (refcount + state re-check). The slow steps of adding
 * and removing a region (kvp_region_map_host(), kvp_region_import_gpu(),
 * kvp_region_release()) may run on any thread, on a slot the main lcore
 * made BUSY for them; the main lcore publishes or frees it afterwards.
 *
 * Memory: the table is sized from the configuration at start-up.
 */
#ifndef KVP_REGION_H
#define KVP_REGION_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvp_rings.h"

enum kvp_region_state {
	KVP_REGION_FREE = 0,
	KVP_REGION_ACTIVE,
	KVP_REGION_DEAD, /**< removed; unmapped once refs drops to 0 */
	KVP_REGION_BUSY, /**< being mapped, or unmapped (a helper owns its fields); never looked up */
};

struct kvp_region {
	_Atomic uint64_t key;
	_Atomic uint32_t state;
	_Atomic uint32_t refs; /**< in-flight operations using the mapping */
	uint8_t *base;
	uint64_t len;
	uint32_t owner; /**< client id */
	uint32_t flags;
	void *map; /**< what to munmap (page-aligned start) */
	size_t map_len;
	int device;   /**< CUDA device of a GPU region */
	void *cookie; /**< GPU import, released through kvp_memops->release */
	void *xp;     /**< transport registration (RDMA memory regions), NULL if none */
	/* Only while kvp_region_hooks->on_add runs (host regions; -1 otherwise): */
	int fd;		   /**< the client's file */
	uint64_t fd_off;   /**< file offset of map */
};

/**
 * Registration hooks a transport installs to register regions with its
 * hardware once, when they are added (main lcore), not on the data path.
 */
struct kvp_region_hooks {
	void *arg;
	/**
	 * A region is about to be published. Failure is not fatal: the hook
	 * leaves r->xp NULL and the region's data takes the staging path.
	 */
	void (*on_add)(void *arg, struct kvp_region *r, uint32_t slot);
	/** The region is about to be unmapped (no transfer uses it any more). */
	void (*on_remove)(void *arg, struct kvp_region *r, uint32_t slot);
};

/** Registration counters a transport keeps (main lcore writes, readers relaxed). */
struct kvp_mr_stats {
	uint64_t regs;	   /**< memory regions registered */
	uint64_t failures; /**< regions left unregistered (their data is staged) */
	uint64_t dmabuf;   /**< of regs, GPU memory through dma-buf */
	uint64_t peermem;  /**< of regs, GPU memory through peer memory (device pointer) */
	uint64_t deregs;
	uint64_t reg_ns;   /**< total time spent registering */
	uint64_t reg_max_ns;
	char last_error[128];
};

/** Hooks in force (NULL: none). Set before the first region is added. */
extern const struct kvp_region_hooks *kvp_region_hooks;

/** Internal region flag: data moves through the staging pool, never zero-copy. */
#define KVP_REGION_F_STAGE 0x80000000u
/** Internal region flag: base is a device address (never dereferenced by the CPU). */
#define KVP_REGION_F_GPU 0x40000000u
#define KVP_REGION_F_INTERNAL (KVP_REGION_F_STAGE | KVP_REGION_F_GPU)

/**
 * Copies between a region and host memory, for regions that must be
 * staged (GPU memory; host memory when tcp.stage_host is set). The host
 * implementation is memcpy; the CUDA one replaces it without touching the
 * transports.
 */
struct kvp_memops {
	/** Copy [off, off+len) of @p r into @p dst. @return 0 or negative errno */
	int (*to_host)(void *dst, const struct kvp_region *r, uint64_t off, size_t len);
	/**
	 * Start the same copy without waiting (optional): @p dst is valid only
	 * after sync(). Lets many small copies share one wait.
	 * @return 0 or negative errno
	 */
	int (*to_host_async)(void *dst, const struct kvp_region *r, uint64_t off, size_t len);
	/** Wait for every copy this thread started with to_host_async. @return 0 or negative errno */
	int (*sync)(void);
	/** Copy @p len bytes of @p src to [off, off+len) of @p r. @return 0 or negative errno */
	int (*from_host)(const struct kvp_region *r, uint64_t off, const void *src, size_t len);
	/**
	 * 2-D copies (optional; kvp_copy_to_host()/kvp_copy_from_host() loop
	 * over rows without them): @p rows rows of @p width bytes, @p pitch
	 * bytes apart in the region, packed in host memory. The async one
	 * follows to_host_async's rules.
	 * @return 0 or negative errno
	 */
	int (*to_host_2d_async)(void *dst, const struct kvp_region *r, uint64_t off, uint64_t pitch,
				size_t width, size_t rows);
	int (*from_host_2d)(const struct kvp_region *r, uint64_t off, uint64_t pitch, const void *src,
			    size_t width, size_t rows);
	/** Called once for the whole staging pool at start (e.g. to pin it for DMA). */
	int (*register_pool)(void *base, size_t len);
	/**
	 * Import a client's GPU allocation (KVP_REGION_CUDA_IPC: @p ipc, the
	 * region starting @p offset bytes into it; KVP_REGION_CUDA_VMM: @p fd,
	 * offset 0). NULL where GPU memory is unsupported.
	 * @return 0 with *dptr and *cookie set; -ENODEV, -EINVAL with @p why
	 */
	int (*import)(uint32_t kind, int device, int fd, const uint8_t ipc[64], uint64_t offset,
		      uint64_t len, uint64_t *dptr, void **cookie, char *why, size_t whylen);
	/** Undo import(). */
	void (*release)(void *cookie);
	/**
	 * Export GPU region @p r as a dma-buf for RDMA registration (optional).
	 * @return 0 with *fd (the caller closes it) and *offset of r->base in
	 *   the buffer; negative errno when the driver cannot
	 */
	int (*dmabuf_fd)(const struct kvp_region *r, int *fd, uint64_t *offset);
	/**
	 * Make RDMA writes into GPU memory of @p device visible to the GPU
	 * before the data is reported landed (optional). @return 0 or negative errno
	 */
	int (*flush_writes)(int device);
};

/** GPUs (CUDA device ordinals) a node tells apart. */
#define KVP_GPUS_MAX 16

/** Why GPU regions are refused on this node (set at start when CUDA is unusable). */
extern char kvp_gpu_unavailable[160];

/** The memops in force (host memcpy by default). */
extern const struct kvp_memops *kvp_memops;

/**
 * Copy @p rows rows of @p width bytes, @p pitch apart from @p off of @p r,
 * packed into @p dst (a staging buffer): asynchronously where the memops
 * can (then *@p async is set and the copy is valid after kvp_memops->sync()).
 * @return 0 or negative errno
 */
int kvp_copy_to_host(void *dst, const struct kvp_region *r, uint64_t off, uint64_t pitch,
		     uint64_t width, uint64_t rows, bool *async);

/** The reverse: packed @p src to @p rows rows, @p pitch apart. @return 0 or negative errno */
int kvp_copy_from_host(const struct kvp_region *r, uint64_t off, uint64_t pitch, const void *src,
		       uint64_t width, uint64_t rows);

struct kvp_region_table {
	uint32_t size;
	uint32_t used; /**< regions published and not yet removed */
	struct kvp_region *slots;
	/** Where slot releases go (NULL: run at once); see kvp_region_table_defer(). */
	void (*defer)(void *arg, uint32_t slot);
	void *defer_arg;
};

/**
 * Allocate a table of @p max regions (max <= 65536).
 *
 * @return 0, -EINVAL, -ENOMEM
 */
int kvp_region_table_init(struct kvp_region_table *t, uint32_t max);

/** Unmap everything and free the table (no lcore may still use it). */
void kvp_region_table_fini(struct kvp_region_table *t);

/**
 * From now on a removed region's slot is handed to @p defer (main lcore)
 * instead of being unmapped at once: it calls kvp_region_release() (any
 * thread) and then kvp_region_free() (main lcore). Removal returns at once;
 * the slot stays BUSY until then.
 */
void kvp_region_table_defer(struct kvp_region_table *t, void (*defer)(void *arg, uint32_t slot),
			    void *arg);

/**
 * Take a free slot for a region of @p owner, BUSY until published or freed (main lcore).
 *
 * @return the slot; -ENOSPC (table full)
 */
int kvp_region_reserve(struct kvp_region_table *t, uint32_t owner);

/**
 * Map [off, off+len) of @p fd (populated) into reserved @p slot and run the
 * registration hooks (any thread; the slow part of kvp_region_add()).
 *
 * @return 0; -EINVAL, -EPERM, -ENOMEM as kvp_region_add()
 */
int kvp_region_map_host(struct kvp_region_table *t, uint32_t slot, int fd, uint64_t off,
			uint64_t len, uint32_t flags);

/**
 * Import a client's GPU allocation through kvp_memops->import() into
 * reserved @p slot and run the registration hooks (any thread).
 *
 * @return 0; import()'s error with @p why
 */
int kvp_region_import_gpu(struct kvp_region_table *t, uint32_t slot, uint32_t kind, int device,
			  int fd, const uint8_t ipc[64], uint64_t offset, uint64_t len, char *why,
			  size_t whylen);

/** GPU memory import() mapped goes into reserved @p slot, hooks run (any thread). */
void kvp_region_set_gpu(struct kvp_region_table *t, uint32_t slot, uint64_t dptr, uint64_t len,
			int device, void *cookie);

/** Give reserved, mapped @p slot a new random key and make it visible (main lcore). */
void kvp_region_publish(struct kvp_region_table *t, uint32_t slot, uint64_t *key);

/** Give up reserved @p slot (never published), releasing what was mapped into it (main lcore). */
void kvp_region_discard(struct kvp_region_table *t, uint32_t slot);

/** Undo what map/import put into BUSY @p slot: hooks' on_remove, unmap (any thread). */
void kvp_region_release(struct kvp_region_table *t, uint32_t slot);

/** BUSY @p slot, released, becomes free (main lcore). */
void kvp_region_free(struct kvp_region_table *t, uint32_t slot);

/**
 * Map [off, off+len) of @p fd and publish it under a new random key (main
 * lcore, at once: reserve, map, publish).
 *
 * @return 0; -EINVAL (empty or overflowing range, fd not mappable);
 *   -EPERM (fd not sealed against shrinking: F_SEAL_SHRINK); -ENOSPC
 *   (table full); -ENOMEM
 */
int kvp_region_add(struct kvp_region_table *t, uint32_t owner, int fd, uint64_t off,
		   uint64_t len, uint32_t flags, uint64_t *key);

/**
 * Publish GPU memory that kvp_memops->import() mapped (main lcore); the
 * region owns @p cookie from now on.
 *
 * @return 0; -ENOSPC (table full)
 */
int kvp_region_add_gpu(struct kvp_region_table *t, uint32_t owner, uint64_t dptr, uint64_t len,
		       int device, void *cookie, uint64_t *key);

/**
 * Remove one region of @p owner (main lcore).
 *
 * @return 0; -ENOENT if @p key is not an active region of @p owner;
 *   -EBUSY if transfers still use it
 */
int kvp_region_remove(struct kvp_region_table *t, uint64_t key, uint32_t owner);

/** Mark every region of @p owner dead (client gone); unmapping is deferred. */
void kvp_region_remove_owner(struct kvp_region_table *t, uint32_t owner);

/** Unmap dead regions nobody uses any more (main lcore, periodically). @return unmapped */
unsigned kvp_region_reap(struct kvp_region_table *t);

/** Regions of @p owner still present (active or dead). */
unsigned kvp_region_count(const struct kvp_region_table *t, uint32_t owner);

/**
 * Look up an active region and take a reference (any lcore).
 *
 * @return the region, or NULL if @p key is unknown or being removed
 */
struct kvp_region *kvp_region_get(struct kvp_region_table *t, uint64_t key);

/** Drop a reference taken by kvp_region_get(). */
static inline void
kvp_region_put(struct kvp_region *r)
{
	/* Pairs with the main lcore's load of refs in reap/remove. */
	atomic_fetch_sub_explicit(&r->refs, 1, memory_order_release);
}

/** True if [off, off+len) lies inside the region and len > 0. */
static inline bool
kvp_region_contains(const struct kvp_region *r, uint64_t off, uint64_t len)
{
	return len > 0 && off <= r->len && len <= r->len - off;
}

#endif /* KVP_REGION_H */
