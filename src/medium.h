/* medium.h - blocks above 16 KB up to 1 MB: per-thread arenas of 4 MB managed with TLSF.
 *
 * An arena is a 4 MB segment of its own kind in the segment map (SEG_MEDIUM), owned by one heap. Its
 * first 4 KB hold the header (the segment header first, so the owner test of a free is the same as
 * for small blocks); the rest is cut into chunks, each a 16-byte header and the block after it:
 *
 *   header: prev_size (u32, 0 for the first chunk)  size_flags (u32: size | FREE | PENDING)  check (u64)
 *
 * Sizes are multiples of 16 and include the header, so the chunks of an arena chain from its first
 * chunk to its end. `check` holds a function of the address and size while the chunk is in use: a
 * pointer that is not a live block (an interior pointer, a chunk freed twice) fails it or the flags.
 * Free chunks are in the bins of their heap (two-level segregated fit: 16 bins per power of two, and
 * bitmaps of the non-empty ones; sizes below 256 in 16 bins of 16 bytes), with their links where the
 * block was. A new arena is one free chunk of all its space; its memory is committed in 64 KB steps
 * as chunks are handed out (every chunk header lies in committed memory).
 *
 * Allocation rounds the request up to the start of the next bin, so the first chunk of the first
 * non-empty bin at or above it fits without a search (two bit scans); the remainder is split off when
 * it is at least 256 bytes. Freeing merges with free neighbours at once. Other threads push the chunks
 * they free onto the arena's thread_free list with one CAS, the low bit of the word meaning "queued at
 * the owner"; the owner takes the list whole on its next medium operation and merges each chunk.
 *
 * An arena whose blocks are all free is one free chunk again and stays in the bins, in the last bin
 * behind the remainders of 3.75 MB and more that share it (and in front of arenas emptied earlier), so
 * TLSF reaches it only when nothing else fits, that is, when a new arena would be needed. The most recently emptied arena stays
 * committed; the others give back all but their first 64 KB once empty for the decommit delay (options.h),
 * keeping their addresses (checked when an arena empties, when a new one is needed, and every 256th
 * medium operation while there are such arenas). A heap trimmed to nothing (a waiting heap whose reserve
 * expired, memory pressure) releases its empty arenas whole (medium_release_empty).
 *
 * Depends on: segment.h, sync.h; medium.c also heap.h (the heap's bins and arenas), error.h, config.h,
 * libc.h, options.h (the decommit delay), port.h.
 */
#ifndef SHARD_MEDIUM_H
#define SHARD_MEDIUM_H

#include <stddef.h>
#include <stdint.h>

#include "segment.h"

#define SHARD_MEDIUM_MAX ((size_t)1 << 20)
#define SHARD_MEDIUM_ALIGN_MAX ((size_t)2 << 20) /* medium_alloc_aligned holds any align up to this */
#define MEDIUM_FL_COUNT 15 /* level 0: sizes below 256 by 16 bytes; level k >= 1: [128 << k, 256 << k) */
#define MEDIUM_SL_COUNT 16

struct chunk;
struct arena;
struct heap;

/* The heap's bins: part of the heap, used by its owner only. */
typedef struct medium_bins {
    uint32_t fl_bitmap;
    uint16_t sl_bitmap[MEDIUM_FL_COUNT];
    struct chunk *bins[MEDIUM_FL_COUNT][MEDIUM_SL_COUNT];
} medium_bins;

/* A block of size bytes (SHARD_SMALL_MAX < size <= SHARD_MEDIUM_MAX) from the heap's arenas; NULL when
 * out of memory. */
void *medium_alloc(struct heap *h, size_t size);

/* The same at a multiple of align (a power of two, 32 up to 2 MB): the chunk found is split so that the
 * block starts aligned, the part in front going back to the bins. */
void *medium_alloc_aligned(struct heap *h, size_t size, size_t align);

/* Free by the owner heap h of p's arena, and by any other thread. Both send a pointer that is not a
 * live medium block to the error hook and change nothing. */
void medium_free_local(struct heap *h, void *p);
void medium_free_foreign(void *p);

/* The usable size of a live medium block, 0 if p is not one (no hook called). */
size_t medium_usable(const void *p);

/* Resize p, a live block of h's arenas, in place: shrinking always succeeds (a tail of 256 bytes or more
 * goes back to the bins), growing when the chunk after it is free and large enough. p, or NULL when
 * the block would have to move. */
void *medium_resize_in_place(struct heap *h, void *p, size_t size);

/* Empty arenas of h beyond the `keep` most recently emptied give back all but their first 64 KB now,
 * whatever their age (thread exit, the reserve's expiry, shard_collect). */
void medium_keep(struct heap *h, unsigned keep);

/* Release h's arenas that hold no block (their address space goes back too); with `spare`, a thread
 * heap's go to the spare segments (segment.h) while there is room, as committed as they are. Returns
 * how many went there. */
unsigned medium_release_empty(struct heap *h, int spare);
/* Release all of h's arenas, live blocks and all (a created heap's destroy or reset: engine.c); the
 * caller clears h's bins and lists. */
void medium_release_all(struct heap *h);
/* h filled its small spared unit: segment_spared_grown for each of its arenas still spared. */
void medium_spared_grown(struct heap *h);
/* Whether h has gone a quarter of the way through its first arena's spared unit, or further (another
 * arena made, or that unit on large pages): segment_spared_along of the arenas. */
int medium_spared_along(const struct heap *h);
/* Every arena of h becomes one free chunk again, its blocks gone, without a look at them; all but the
 * `keep` first stay committed, the rest are released (a created heap's destroy or reset: engine.c). */
void medium_empty_keep(struct heap *h, unsigned keep);

/* Take the chunks other threads freed into h's arenas and merge them. */
void medium_drain_delayed(struct heap *h);

typedef struct medium_counts {
    size_t arenas, empty, decommitted, live;
    size_t live_bytes; /* the live blocks' usable sizes */
} medium_counts;
/* Adds h's arenas to *c (statistics; any thread, reads racy counters). */
void medium_count(struct heap *h, medium_counts *c);

/* Report h's live medium blocks to v, arena by arena, chunk by chunk (one another thread is freeing is
 * not reported). Only for the calling thread's heap or one no thread uses. */
void medium_visit(struct heap *h, visitor *v);

/* Checks every arena of h and h's bins; the number of inconsistencies (0 when all is well). */
int medium_check(struct heap *h);

#endif
