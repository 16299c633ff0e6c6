/* error.h - the error hook: where a pointer that is not a live block of ours is reported.
 * By default a one-line message through the port, then abort; shard_set_error_hook installs another.
 * Depends on: include/shardmm.h (enum shard_error); error.c: sync.h, libc.h, options.h, port.h. */
#ifndef SHARD_ERROR_H
#define SHARD_ERROR_H

#include "../include/shardmm.h" /* enum shard_error */

/* Report p to the hook with error (enum shard_error); returns if the hook returns. */
__attribute__((cold, noinline)) void error_invalid_pointer(int error, void *p);
/* Take (1) or give back (0) the hook's lock around a fork (heap.c's fork hooks). */
void error_lock_for_fork(int take);

#endif
