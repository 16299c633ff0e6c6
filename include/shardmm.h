/* shardmm.h - the public API of the shardmm memory allocator.
 *
 * A heap per thread, small blocks (up to 16 KB) in 64 KB pages with sharded free lists, medium and large
 * blocks above that. Every block is 16-byte aligned. Out of memory and impossible sizes give NULL, never
 * an exception or an abort. A pointer that is not a live block of ours, given to shard_free or
 * shard_realloc, goes to the error hook (by default a one-line message on stderr, then abort).
 *
 * Only the names declared here are exported from the shared library.
 */
#ifndef SHARDMM_H
#define SHARDMM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(SHARD_BUILD_DLL)
#define SHARD_API __declspec(dllexport)
#elif defined(_WIN32) && defined(SHARD_USE_DLL)
#define SHARD_API __declspec(dllimport)
#elif defined(__GNUC__)
#define SHARD_API __attribute__((visibility("default")))
#else
#define SHARD_API
#endif

/* Allocation. shard_malloc(0) returns a unique block of 16 bytes. */
SHARD_API void *shard_malloc(size_t size);
/* Zeroed allocation; NULL when count * size overflows. */
SHARD_API void *shard_calloc(size_t count, size_t size);
/* Resize. NULL p allocates; size 0 frees p and returns NULL (as glibc does). On failure NULL is returned
 * and p stays valid with its contents. A small block stays in place while the new size is within its
 * class and not below a quarter of the class size; when it must grow it moves with headroom. */
SHARD_API void *shard_realloc(void *p, size_t size);
/* Free; NULL is fine. */
SHARD_API void shard_free(void *p);
/* The bytes usable in a live block (its size class for small blocks); 0 for NULL. */
SHARD_API size_t shard_usable_size(const void *p);

/* Aligned allocation: a block of size bytes at a multiple of align, any power of two; NULL for any
 * other align (also 0), or out of memory (also for an alignment the address space cannot hold).
 * shard_free, shard_realloc and shard_usable_size take the result like any block (shard_realloc may move
 * it without the alignment). Up to 16 KB with an align up to 16 KB the block is a small one of a class
 * that is a multiple of align: its free is the ordinary fast path. Alignments up to SHARD_ALIGN_MAX
 * (2 MB) cost no address space beyond the block's; a block aligned to 4 MB or more takes the alignment
 * again in address space (reserved, never committed), as glibc's memalign does. */
#define SHARD_ALIGN_MAX ((size_t)2 << 20)
SHARD_API void *shard_malloc_aligned(size_t size, size_t align);
/* shard_realloc that keeps the alignment: in place when it can and p is aligned, else a move to a new
 * aligned block. NULL p allocates; size 0 frees p and returns NULL; NULL on failure (p stays valid). */
SHARD_API void *shard_realloc_aligned(void *p, size_t size, size_t align);

/* The rest of the C library's malloc family with glibc's semantics, under the shard_ prefix (on Linux
 * libshardmm.so also exports them, and malloc, free, calloc and realloc, under their own names). On
 * failure the core sets the C library's errno to ENOMEM on Linux and the thread's last error to
 * ERROR_NOT_ENOUGH_MEMORY on Windows. */
SHARD_API void *shard_reallocarray(void *p, size_t count, size_t size); /* NULL when count * size overflows */
/* 0, EINVAL (22) unless align is a power of two and a multiple of sizeof(void *), or ENOMEM (12); *out
 * is set only on success. */
SHARD_API int shard_posix_memalign(void **out, size_t align, size_t size);
/* glibc 2.36's aligned_alloc and memalign: an align below 16 is 16, one that is not a power of two is
 * rounded up to the next one, one above 2^63 (no power of two holds it) is EINVAL. */
SHARD_API void *shard_aligned_alloc(size_t align, size_t size);
SHARD_API void *shard_memalign(size_t align, size_t size);
SHARD_API void *shard_valloc(size_t size);  /* aligned to the page size (4 KB) */
SHARD_API void *shard_pvalloc(size_t size); /* the same, size rounded up to whole pages (0 takes one page) */

/* Error hook: called for a pointer that is not a live block of ours, and in the hardened and debug
 * builds for the damage they find. When the hook returns, the operation does nothing (shard_realloc
 * returns NULL; a damaged free list or block is left alone, never handed out) and the allocator keeps
 * working. The first three kinds name the call; the others (hardened and debug builds) what was found. */
enum shard_error {
    SHARD_ERROR_INVALID_FREE = 1,    /* shard_free of a pointer that is not a live block of ours */
    SHARD_ERROR_INVALID_REALLOC = 2, /* shard_realloc of such a pointer */
    SHARD_ERROR_INVALID_SIZE_QUERY = 3, /* shard_usable_size of such a pointer */
    SHARD_ERROR_DOUBLE_FREE = 4,     /* a free or realloc of a block that is already free; ptr: the block */
    SHARD_ERROR_FREE_LIST = 5,       /* a free item's link damaged (a write after free, or an overflow into
                                      * it); ptr: the item */
    SHARD_ERROR_OVERFLOW = 6,        /* a write past the end of a block (or before its start); ptr: the block */
    SHARD_ERROR_WRITE_AFTER_FREE = 7, /* a freed block written to while it waited in quarantine; ptr: it */
    SHARD_ERROR_HEADER = 8           /* a medium or large block's header damaged; ptr: the block */
};
typedef void (*shard_error_fn)(void *arg, int error, void *ptr);
/* Install a hook (NULL restores the default: a one-line message, then abort). Returns the previous hook. */
SHARD_API shard_error_fn shard_set_error_hook(shard_error_fn hook, void *arg);

/* Statistics of the whole process. Counts of live blocks are exact when no other thread allocates or
 * frees during the call. */
typedef struct shard_stats {
    size_t reserved;         /* address space reserved from the OS, bytes */
    size_t committed;        /* memory committed (readable and writable), bytes */
    size_t committed_peak;   /* highest value of committed so far */
    size_t live_small;       /* live blocks up to 16 KB */
    size_t live_medium;      /* live blocks above 16 KB up to 1 MB, or shrunk in place from there (a block
                                another thread freed counts until its owner's next medium-block operation) */
    size_t live_large;       /* live blocks above 1 MB */
    size_t heaps;            /* thread heaps ever created */
    size_t heaps_free;       /* heaps of exited threads, waiting for a new thread to take them */
    size_t small_pages_used; /* small-block pages serving a size class (one whose blocks other threads
                                freed counts until its thread allocates from it or needs a page) */
    size_t small_pages_free; /* free small-block pages still committed */
    size_t small_pages_decommitted; /* pages whose memory went back to the OS (or never came) */
    size_t small_pages_retired;     /* times a page became free (all items back), since start */
    size_t os_calls;         /* reserve, commit, decommit and release calls, since start */
    size_t medium_arenas;    /* 4 MB arenas of medium blocks */
    size_t medium_arenas_empty;       /* arenas without a live block */
    size_t medium_arenas_decommitted; /* empty arenas that gave back all but their first 64 KB */
    size_t large_cached;       /* freed large blocks kept in the process's cache for reuse */
    size_t large_cached_bytes; /* memory those keep committed, bytes (their headers included) */
    size_t atomic_ops;         /* atomic read-modify-write operations since start, counted only in the
                                  SHARD_COUNTERS build (build/counters/libshardmm.so); 0 otherwise */
    size_t lock_acquisitions;  /* spin-lock acquisitions since start, likewise */
    /* The usable bytes (shard_usable_size) of the live blocks counted above, per kind; exact under the
     * same condition as the counts. */
    size_t live_small_bytes;
    size_t live_medium_bytes;  /* a block another thread freed counts as in live_medium */
    size_t live_large_bytes;
    size_t live_large_committed; /* memory the live large blocks keep committed, bytes (their headers and
                                    what a block keeps beyond its usable size included) */
    size_t spare_segments;     /* empty 4 MB segments and arenas that ended threads left for any thread,
                                  for a second; in no heap, so not in the page and arena counts above */
    size_t spare_bytes;        /* memory those keep committed, bytes */
    size_t orphan_segments;    /* small-block segments with live blocks that ended threads left, or whose
                                  every page was full, for any thread to take (their pages are in the
                                  page counts above) */
} shard_stats;
SHARD_API void shard_get_stats(shard_stats *out);

/* For a thread that ends without the OS's thread exit (a custom C runtime's or a VM's own threads, a
 * pool that parks a thread for good): its heap goes back now, as at thread exit - it keeps a reserve
 * of free memory for the next thread (for a second) and returns the rest. Blocks stay valid and any
 * thread may free them. If the thread allocates again, or frees a small block of a thread that runs
 * (a thread gathers such frees in a heap, to push them a page at a time), it takes a heap again. */
SHARD_API void shard_thread_done(void);

/* Return now what the delays would return later: the calling thread's free small pages beyond the 16
 * it keeps and its empty medium arenas beyond the most recent one, the reserves of exited threads'
 * heaps, and every block of the large-block cache. For runtimes that trim at idle or after a
 * collection; without it an idle process keeps that memory until some thread passes a slow path. */
SHARD_API void shard_collect(void);

/* Bound the memory shardmm keeps committed (stats: committed) to `bytes`, for a process in a container
 * or a sandbox: an allocation that would pass it returns NULL (errno ENOMEM), after giving back what
 * waits (as shard_collect) and trying once more, as when the OS refuses; nothing else changes. A limit
 * below what is committed now refuses growth until enough is freed. SIZE_MAX (the default) is no
 * limit. Returns the previous limit. */
SHARD_API size_t shard_set_limit(size_t bytes);

/* Heaps an embedder owns (a scripting engine's instance, a request, a sandbox): blocks of one heap come
 * from its own pages and arenas, within an optional limit, and all of them go at once when the heap is
 * destroyed or reset. A heap is used by one thread at a time - the caller serializes, as Lua, Duktape
 * and mruby do - and may move between threads; shard_heap_* take the thread heap's fast paths (no
 * atomic operation, no lock). Blocks of a heap may also be freed with shard_free and resized with
 * shard_realloc from any thread (as another thread's block would be), and shard_usable_size takes them;
 * shard_heap_free(h, p) of a block of another heap or of a thread heap frees it the same way. A NULL
 * heap is the calling thread's own: shard_heap_malloc(NULL, n) is shard_malloc(n), and so on;
 * shard_heap_visit(NULL, ...) walks the thread's heap; destroy, reset and set_limit do nothing (and the
 * last returns 0), get_stats gives zeros (shard_get_stats has the process's). */
typedef struct shard_heap shard_heap;
typedef struct shard_heap_options {
    size_t limit; /* the most memory the heap may hold committed (its pages, arenas and large blocks),
                     bytes; 0: no limit */
    /* Called, if set, when an allocation would pass the limit, with the size asked for: it may free
     * blocks of the heap or raise the limit (shard_heap_set_limit), and returns non-zero to have the
     * allocation tried once more (which then fails for good if it would still pass). */
    int (*on_limit)(void *arg, shard_heap *heap, size_t size);
    void *arg;
} shard_heap_options;
/* A new heap (opt NULL: no limit); NULL out of memory. */
SHARD_API shard_heap *shard_heap_create(const shard_heap_options *opt);
/* Every block of the heap is gone and its memory returned, in time proportional to its segments, arenas
 * and large blocks, not its blocks; the heap itself too. */
SHARD_API void shard_heap_destroy(shard_heap *heap);
/* The same, keeping the heap (empty, with its options) for reuse. */
SHARD_API void shard_heap_reset(shard_heap *heap);
SHARD_API void *shard_heap_malloc(shard_heap *heap, size_t size);
SHARD_API void *shard_heap_calloc(shard_heap *heap, size_t count, size_t size);
/* As shard_realloc, the block (if it moves) staying in or coming into the heap. */
SHARD_API void *shard_heap_realloc(shard_heap *heap, void *p, size_t size);
SHARD_API void *shard_heap_malloc_aligned(shard_heap *heap, size_t size, size_t align);
SHARD_API void shard_heap_free(shard_heap *heap, void *p);
/* Set the limit (0: none); returns the previous one. */
SHARD_API size_t shard_heap_set_limit(shard_heap *heap, size_t limit);
typedef struct shard_heap_stats {
    size_t committed;      /* memory the heap holds committed now, bytes: what the limit bounds */
    size_t committed_peak; /* the most it held since it was created or reset */
    size_t limit;          /* 0: none */
    size_t live_small, live_medium, live_large;                   /* live blocks by kind */
    size_t live_small_bytes, live_medium_bytes, live_large_bytes; /* their usable bytes */
} shard_heap_stats;
SHARD_API void shard_heap_get_stats(shard_heap *heap, shard_heap_stats *out);

/* Introspection. Text goes to an output function, `out(arg, text, len)`, called with a line or part of
 * one at a time (not NUL-terminated); NULL `out` writes to standard error (on Windows the process's
 * standard error handle). The output function must not allocate or free through shardmm. */
typedef void (*shard_output_fn)(void *arg, const char *text, size_t len);

/* The kinds of block a visit reports. */
enum shard_block_kind {
    SHARD_BLOCK_SMALL = 1,  /* up to 16 KB: usable is its size class */
    SHARD_BLOCK_MEDIUM = 2, /* above 16 KB up to 1 MB; realloc may shrink one in place below 16 KB */
    SHARD_BLOCK_LARGE = 3   /* above 1 MB */
};
/* What a visit covers; or them together. */
enum shard_visit_scope {
    SHARD_VISIT_THREAD = 1,  /* the calling thread's heap */
    SHARD_VISIT_WAITING = 2, /* the heaps of exited threads, waiting for a new thread (each is taken out of
                                the stack while it is walked, so no thread allocates from it meanwhile) */
    SHARD_VISIT_LARGE = 4,   /* large blocks, whichever thread made them */
    SHARD_VISIT_ALL = 7
};
/* Calls fn(arg, block, usable, kind) for every live block in `scope`, and returns how many it visited;
 * fn returns 0 to go on, anything else to stop there. The heaps of other running threads are never
 * walked (their lists change without a lock): a thread walks its own. A block another thread frees or
 * allocates during the walk may be reported or not, and so may a small block that another thread, still
 * running, freed lately (a thread gathers its frees into another thread's page and hands them over a
 * page at a time, at the latest at its next allocation that needs more than its pages' free items, or
 * at its exit); every other block is reported once, and nothing that is not a live block is. fn must
 * not allocate or free through shardmm (it may read the blocks). */
typedef int (*shard_visit_fn)(void *arg, void *block, size_t usable, int kind);
SHARD_API size_t shard_visit(unsigned scope, shard_visit_fn fn, void *arg);
/* The same for the live blocks of a created heap (shard_heap_create), small, medium and large, called by
 * the thread that uses the heap at the time. */
SHARD_API size_t shard_heap_visit(shard_heap *heap, shard_visit_fn fn, void *arg);

/* The live blocks of SHARD_VISIT_ALL, grouped by size (small: class; medium, large: by power of two):
 * per group the count, the bytes and the first few blocks with their first 32 bytes in hex and as
 * text, as FastMM's leak report shows them. Returns the number of live blocks. Meant for the end of a
 * program, when what is left is leaked (SHARDMM_REPORT_LEAKS=1 calls it at exit). */
SHARD_API size_t shard_report_leaks(shard_output_fn out, void *arg);

/* A readable table of shard_get_stats (memory reserved, committed and its peak; blocks by kind; pages
 * and arenas by state; the large-block cache; heaps; OS calls), with units. SHARDMM_SHOW_STATS=1 calls
 * it at exit. */
SHARD_API void shard_print_stats(shard_output_fn out, void *arg);

/* Consistency check of the calling thread's heap (every page's lists and counts, every medium arena's
 * chunks, the bins and their bitmaps), of the heaps waiting in the stack of free heaps and of the
 * large-block cache. Returns the number of problems found (each is also reported through the
 * fatal-message channel without aborting). Meant for tests; safe to call at any time. */
SHARD_API int shard_check(void);

#ifdef __cplusplus
}
#endif
#endif
