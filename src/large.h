/* large.h - blocks above 1 MB. TEMPORARY: until the large-block issue (reservations with headroom, a
 * shared cache) lands, every such block is one OS reservation of its own. */
#ifndef SHARD_LARGE_H
#define SHARD_LARGE_H

#include <stddef.h>
#include <stdint.h>

void *large_alloc(size_t size);
/* Free p if it is a live block (its first 4 MB is SEG_LARGE in the map); -1 if it is not. */
int large_free(void *p);
/* The usable size of a live block, or 0 if p is not one. */
size_t large_usable(const void *p);
/* Resize in place if the committed part allows; NULL if it must move (or p is not a live block). */
void *large_resize_in_place(void *p, size_t size);
/* Live blocks, split at 1 MB for the statistics. */
void large_live_counts(size_t *medium, size_t *large);

#endif
