/* shardmm_region.h - shardmm over one region of memory that the embedder hands it, with no operating
 * system at all: a kernel, firmware, a hypervisor, a VM given one block of memory.
 *
 * Link build/region/libshardmm-region.a (build/win64/region/libshardmm-region.a for Win64 objects), or
 * compile src/shardmm.c with -DSHARD_PORT_REGION. Neither needs a C library. Call shard_region_init once,
 * before the first allocation; then the whole API of shardmm.h works, every block inside the region. An
 * allocation made before it returns NULL.
 *
 * Threads: the allocator finds the calling thread's heap through `slot`, a function of the embedder's
 * that returns the address of a pointer-sized word in its own per-thread data (zero in a new thread).
 * Without one there is a single slot, and the allocator must be called from one thread at a time. There
 * is no thread-exit hook: a thread that is done allocating calls shard_thread_done, which hands its heap
 * to the next thread (its blocks stay valid; any thread may free them).
 *
 * Time: the allocator gives unused memory back after delays (a second for the large-block cache and the
 * reserve of a finished thread's heap). With `tick` they are measured in its milliseconds; without it
 * they count the allocator's own slow-path events, and shard_collect gives everything back at once.
 */
#ifndef SHARDMM_REGION_H
#define SHARDMM_REGION_H

#include "shardmm.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shard_region_options {
    /* Pages of the region are about to be used / are no longer used (addr and size multiples of 4 KB):
     * e.g. to map them in a hypervisor, or to lend them to someone else meanwhile. commit returns 0, or
     * nonzero to refuse (the allocation that needed the pages returns NULL, nothing else changes); a
     * refused decommit leaves the pages in use. Called with the region's lock held: they must not call
     * the allocator. NULL: the whole region is memory as it is. */
    int (*commit)(void *addr, size_t size, void *arg);
    int (*decommit)(void *addr, size_t size, void *arg);
    void *arg; /* passed to commit and decommit */
    /* The address of the calling thread's slot word (above). NULL: one slot, one thread at a time. */
    void **(*slot)(void);
    /* Monotonic milliseconds from any start. NULL: the delays count the allocator's events (above). */
    uint64_t (*tick)(void);
    /* Give the processor to another thread while a lock is taken. NULL: spin. */
    void (*yield)(void);
    /* A fatal error (an invalid pointer without an error hook, a broken invariant): the message (len
     * bytes, no terminating zero), then abort, which must not return. NULL: no message; a trap
     * instruction (ud2) for abort. */
    void (*write_error)(const char *msg, size_t len);
    void (*abort)(void);
    unsigned flags; /* SHARD_REGION_* */
} shard_region_options;

/* The region reads zero as it is handed over (fresh memory of a loader or of the host): pages are
 * cleared only when they are used again after a decommit. Without it every page is cleared on its
 * first use. */
#define SHARD_REGION_ZEROED 1u

/* Hand [base, base + size) to the allocator (options may be NULL: all defaults). The region is used from
 * its first 64 KB boundary to its last; a few KB per GB of it at its start hold its map. 0; -1 when it
 * was called before, the region holds less than 256 KB after the alignment, the port was built for a
 * single slot (SHARD_SLOT=PORT_SLOT_GLOBAL) and options ask for a slot function, or committing the
 * region's map was refused. */
SHARD_API int shard_region_init(void *base, size_t size, const shard_region_options *options);

#ifdef __cplusplus
}
#endif
#endif
