/* config.h - every build knob of the core, with its default and the reason for it. Test builds are
 * the same source with other defines (build.ninja). The delays and the large-block cache's byte limit
 * are the defaults of run-time options (SHARDMM_DELAY_MS, SHARDMM_LARGE_CACHE_MB: options.h). */
#ifndef SHARD_CONFIG_H
#define SHARD_CONFIG_H

/* Debug level: 0 release; 1 assertions with their reason and a page check after every slow-path
 * change of a page. The debug library is built with 1. */
/* SHARD_COUNTERS=1 (build/counters/libshardmm.so): every atomic read-modify-write and every lock
 * acquisition of the core is counted (shard_stats.atomic_ops, .lock_acquisitions), with a relaxed atomic
 * add of its own, which is not counted: for counting only, not for timing. */
#ifndef SHARD_COUNTERS
#define SHARD_COUNTERS 0
#endif

/* SHARD_FULL_DEBUG=1 (build/debug/full/): the debug layer of debugmode.c around every public entry
 * point, to find the program's bugs rather than the allocator's: a header and a trailer canary around
 * each block, fill patterns, a quarantine of freed blocks, reports with allocation and free sites. It
 * needs the C fast paths (the NASM ones carry the public names). */
#ifndef SHARD_FULL_DEBUG
#define SHARD_FULL_DEBUG 0
#endif
#if SHARD_FULL_DEBUG && defined(SHARD_ASM) && SHARD_ASM
#error "SHARD_FULL_DEBUG=1 needs SHARD_ASM=0: the debug layer takes the public names"
#endif
/* The full-debug build's quarantine: freed blocks wait, filled with a pattern, until this many bytes of
 * younger ones have been freed after them (the default of SHARDMM_QUARANTINE_MB, options.h). */
#ifndef SHARD_QUARANTINE_BYTES
#define SHARD_QUARANTINE_BYTES ((size_t)16 << 20)
#endif

#ifndef SHARD_DEBUG
#define SHARD_DEBUG 0
#endif

/* SHARD_HARDENED=1 (build/hardened/): small free lists stored encoded with their segment's secret and the
 * link's own address, every link checked before it is followed, small double frees found from the
 * block's first word, medium and large headers sealed with a secret of the process (small.h says how
 * and what each costs). For production: the same API, ABI and memory as the default build. */
#ifndef SHARD_HARDENED
#define SHARD_HARDENED 0
#endif
#if SHARD_HARDENED < 0 || SHARD_HARDENED > 1
#error "SHARD_HARDENED must be 0 or 1"
#endif
#if SHARD_DEBUG < 0 || SHARD_DEBUG > 1
#error "SHARD_DEBUG must be 0 or 1"
#endif

/* Runs (src/small.h): a class whose 64 KB page holds at most SHARD_RUN_CAPACITY items is served by runs of
 * up to SHARD_RUN_PAGES pages (a power of two: a run lies in an aligned group of that many), so that its
 * pages go full a quarter as often; 1 turns runs off. Runs of 2 left bench/medium.c's 8k-16k row 10 %
 * slower than runs of 4 and 6 MB of rptest's 37.7 (bench/results/2026-12-04-runs.md). The hardened
 * build has none: its links must stay within a 64 KB page (src/small.h). */
#ifndef SHARD_RUN_PAGES
#define SHARD_RUN_PAGES (SHARD_HARDENED ? 1 : 4)
#endif
#ifndef SHARD_RUN_CAPACITY
#define SHARD_RUN_CAPACITY 8
#endif

/* Colours of heaps (src/heap.h; src/small.c's page_in_turn): a heap's new segments hand out their pages
 * from one of this many starting pages, by the heap's number among the heaps made, so that threads that
 * start together do not allocate at the same offsets of their segments. Without it two threads running
 * at once on the AMD host slowed each other (the rationale: docs/design.md, Small blocks). 1 turns it
 * off. */
#ifndef SHARD_SEGMENT_COLOURS
#define SHARD_SEGMENT_COLOURS 8
#endif

/* Free small pages a heap keeps committed whatever their age (the seed: 16 pages, 1 MB). */
#ifndef SHARD_KEEP_FREE_PAGES
#define SHARD_KEEP_FREE_PAGES 16
#endif

/* Lent pages (src/small.h): a thread heap that retires a page of its own while it holds this many free
 * pages lends the page to the pool that every thread heap takes pages from; 0 lends none. */
#ifndef SHARD_LEND_AFTER
#define SHARD_LEND_AFTER SHARD_KEEP_FREE_PAGES
#endif

/* How long a free page beyond those stays committed, ms. Without the delay a "free everything, allocate
 * again" cycle pays a decommit, a commit and 16 page faults per page (the seed measured it slower: the
 * numbers in bench/results/2026-11-30-quoted-in-code.md). */
#ifndef SHARD_DECOMMIT_DELAY_MS
#define SHARD_DECOMMIT_DELAY_MS 1000
#endif

/* The reserve an exiting thread leaves with its heap for the next thread: free small pages and empty
 * medium arenas kept committed (the rest goes back at once), and how long it lasts before it is trimmed
 * to nothing but live blocks. Without it the next thread faults in again what the last one gave back:
 * bench/churn.py compares shard with shard-noreserve (this built with both 0). The pages are all of
 * them: the free pages of a heap's segments that still hold live blocks, which no other heap can use,
 * stay as long as they would have had the thread lived on (the decommit delay); a limit of 64 pages
 * cost mimalloc's test-stress half a million page faults (bench/results/2026-12-02-spare.md). Its
 * empty segments and arenas become spare segments first (SHARD_SPARE_SEGMENTS, below). */
#ifndef SHARD_RESERVE_PAGES
#define SHARD_RESERVE_PAGES 0xffffffffu
#endif
#ifndef SHARD_RESERVE_ARENAS
#define SHARD_RESERVE_ARENAS 4
#endif
#ifndef SHARD_RESERVE_DELAY_MS
#define SHARD_RESERVE_DELAY_MS 1000
#endif
/* At most this many heaps wait in the stack with a reserve; the others keep nothing but live blocks. */
#ifndef SHARD_RESERVE_HEAPS
#define SHARD_RESERVE_HEAPS 8
#endif
/* Empty segments and arenas that exiting threads leave committed for any thread heap (segment.h's spare
 * segments), at most this many (4 MB each), each for the reserve's delay. A heap's reserve serves only
 * the next thread that takes that heap; with threads of unequal size the others fault in again what
 * the last generation gave back (mimalloc's test-stress: 1.2 million page faults without them). */
#ifndef SHARD_SPARE_SEGMENTS
#define SHARD_SPARE_SEGMENTS 32
#endif

/* A thread heap's page that went full goes loose (small.h) once this many more of its pages went full
 * after it, if nothing was freed into it meanwhile. With every full page loose at once bench/shapes.py's
 * glibc-thread-fixed lost 13 %; with 16, a producer's pages went loose before their consumer freed into
 * them and came back by the thousand (ring@2 7 % slower); with 64 none does
 * (bench/results/2026-12-02-loose-pages.md). */
#ifndef SHARD_LOOSE_AFTER
#define SHARD_LOOSE_AFTER 64
#endif

/* For each loose page its thread takes back by a free of its own, having drained no other thread's frees
 * since it went loose, this many of the next pages to go full take no place in full_ring, so never go
 * loose (heap.h's loose_skip), SHARD_LOOSE_SKIP_MAX pending at most (small.h). */
#ifndef SHARD_LOOSE_SKIP
#define SHARD_LOOSE_SKIP 8
#endif
#ifndef SHARD_LOOSE_SKIP_MAX
#define SHARD_LOOSE_SKIP_MAX 32
#endif

/* Free pages of orphan segments (small.h) kept committed, at most, for any thread heap: those around
 * the live blocks of threads that ended without a reserve. */
#ifndef SHARD_ORPHAN_PAGES
#define SHARD_ORPHAN_PAGES 2048
#endif

/* Heaps of exited threads (heap.c): a thread that would make a new heap first looks for heaps whose
 * threads no longer live once there are this many heaps, and then whenever there are twice as many as
 * threads were found alive, plus this. */
#ifndef SHARD_RECLAIM_MIN
#define SHARD_RECLAIM_MIN 8
#endif

/* Items carved from a page's untouched part at a time: a batch, not the whole page, so a page used
 * for a few items never links all of its memory (and touches no more of it than needed). A page's first
 * carve touches SHARD_CARVE_BYTES of memory, each later one as much again as the page's carves so far
 * (4, 4, 8, 16 and 32 KB of a 64 KB page), but always SHARD_CARVE_MIN items (or what is left):
 * carving writes a link at the start of every item, which makes the OS page under it resident: n items
 * touch n * size bytes, or n OS pages when items are larger than an OS page. A program that uses a few
 * blocks of each of many classes (strings growing through the classes) would otherwise hold 64 KB per
 * class of 1 KB and up for a few live items; growing batches hold at most twice what a page's items
 * reach, and a page that fills takes the slow path 5 times instead of 16 (until 2026-12-06 every carve
 * took 4 KB and 64 items at most: glibc-simple at 8 threads ran in 0.91 of the time,
 * bench/results/2026-12-06-carve-growth.md). With 4 items at least, a page of 16 KB items is carved at
 * once. (The slow path carves; a class whose items the owner frees and takes again stays on the fast
 * path, which takes the page's local_free list when its free list is dry.) */
#ifndef SHARD_CARVE_BYTES
#define SHARD_CARVE_BYTES 4096
#endif
#ifndef SHARD_CARVE_MIN
#define SHARD_CARVE_MIN 4
#endif

/* A thread gathers its frees into another thread's page and pushes them in one compare-and-swap (small.c,
 * gathered frees): this many at most wait at a time, and it starts at this many frees in a row into one
 * page (ring's frees of random sizes, two in a row now and then, lost 8 % when the second started it:
 * bench/results/2026-12-07-gathered-frees.md). */
#ifndef SHARD_GATHER_ITEMS
#define SHARD_GATHER_ITEMS 256
#endif
#ifndef SHARD_GATHER_AFTER
#define SHARD_GATHER_AFTER 4
#endif

/* A heap out of free pages walks its class lists for pages other threads emptied (small.c, sweep_lazy);
 * the slow paths that need a page after a walk skip it, one for each this many pages the walk read, so
 * the walks cost at most that many page descriptors per page taken. */
#ifndef SHARD_SWEEP_PAGES
#define SHARD_SWEEP_PAGES 16
#endif

/* pause instructions before a waiting lock yields the processor (in the order of thousands). */
#ifndef SHARD_SPIN_PAUSES
#define SHARD_SPIN_PAUSES 4000
#endif

/* Large blocks (large.c). A block's reservation is its size and as much again as headroom, at most
 * SHARD_LARGE_HEADROOM_MAX of it: a buffer that grows within it does not move, and one that keeps
 * growing moves no more often than it doubles. There is no floor under it (large.c says why). */
#ifndef SHARD_LARGE_HEADROOM_MAX
#define SHARD_LARGE_HEADROOM_MAX ((size_t)1 << 30)
#endif
/* A block that moved to grow reserves at least this much: it is likely to grow again. */
#ifndef SHARD_LARGE_GROWN_SPAN_MIN
#define SHARD_LARGE_GROWN_SPAN_MIN ((size_t)16 << 20)
#endif
/* Ask the OS for large pages under large blocks (port_caps.hint_large_pages). On Linux with transparent huge
 * pages in "madvise" mode (Debian's default) one fault then maps 2 MB of a growing buffer: bench/large.py
 * compares shard with shard-nolp (this 0). The cost: a block used sparsely becomes resident 2 MB at a
 * time where it is touched, and khugepaged may fill in more of it later. 0 turns it off. */
#ifndef SHARD_LARGE_PAGES
#define SHARD_LARGE_PAGES 1
#endif
/* The values of SHARDMM_HUGE_PAGES (options.h), which says which small-block segments and medium arenas
 * are reserved so that the platform may back them with large pages (port_caps.reserve_large_pages;
 * segment.h's segment_large_from): none; a thread heap's memory beyond its first segment and first arena,
 * and those too as the heap fills them (segment_spared_commit; the default); all of it. On Linux a huge
 * page makes 2 MB resident at the first touch of a 64 KB page, so "all" costs a small heap its low peak
 * (2-4 times in bench/run's scenarios: bench/results/2026-12-01-thp.md), while a heap that grows past 2 MB
 * gains the faults and the TLB misses of 4 KB pages, which a virtual machine pays dearly
 * (bench/results/2026-12-02-huge-growth.md). build/thp/libshardmm.so is built with "all", for the
 * benchmarks' comparison. */
#define SHARD_HUGE_PAGES_NONE 0
#define SHARD_HUGE_PAGES_GROWN 1
#define SHARD_HUGE_PAGES_ALL 2
#ifndef SHARD_HUGE_PAGES
#define SHARD_HUGE_PAGES SHARD_HUGE_PAGES_GROWN
#endif
/* In the default mode, what a heap uses of a spared 2 MB of its first segment, and of its first arena,
 * before that 2 MB goes on large pages too (segment.h's segment_spared_touch and segment_spared_commit):
 * for small pages SHARD_SPARED_SMALL bytes reached by carving (the OS pages its items lie in), as much as
 * 31 of its 64 KB pages hold: all of the lower unit but the descriptors' page, touched; a heap that makes
 * a second segment first takes them there and then (segment_spared_outgrown). Until 2026-12-04 it was 31
 * pages committed, which a heap of strings in 40 classes reached with 400 KB of the unit touched (a page
 * serves one class and carves 4 KB at a time), and the huge page there tripled bench/run's strings@8
 * peak; 1.5 MB took larson@2's and @8's peaks above mimalloc 3.4.3's (bench/results/
 * 2026-12-04-spared-touch.md). For an arena, 8 commits of 64 KB, 512 KB more than its first 64 KB (an
 * arena commits from its start, for blocks used whole; later left alloc-test@8 two thirds of its faults:
 * bench/results/2026-12-02-spared-units.md). */
#ifndef SHARD_SPARED_SMALL
#define SHARD_SPARED_SMALL (31 * 65536)
#endif
#ifndef SHARD_SPARED_MEDIUM
#define SHARD_SPARED_MEDIUM 8
#endif
/* The cache of freed large blocks: at most this many blocks, and this much committed memory or the room
 * under an eighth above the live blocks' high (large.c); a block committed above that is never cached. 128
 * blocks rather than 32: bench/results/2026-12-03-cache-high.md. */
#ifndef SHARD_LARGE_CACHE_BLOCKS
#define SHARD_LARGE_CACHE_BLOCKS 128
#endif
#ifndef SHARD_LARGE_CACHE_BYTES
#define SHARD_LARGE_CACHE_BYTES ((size_t)128 << 20)
#endif
/* A thread's spare (large.c): the block it freed last waits for its next large allocation if it keeps
 * at most this much committed (two large pages): the blocks whose calls cost the most beside the work
 * of their pages, and what a thread that no longer allocates holds until the delay passes and another
 * thread looks. 16 MB raised the peak of bench/shapes.c's malloc-large@8 (5-25 MB blocks) from 1,076 to
 * 1,152 MB: blocks in spares count as live towards the cache's ceiling (large.c). */
#ifndef SHARD_LARGE_SPARE_MAX
#define SHARD_LARGE_SPARE_MAX ((size_t)4 << 20)
#endif
/* How long a freed large block waits in the cache, ms. */
#ifndef SHARD_LARGE_CACHE_DELAY_MS
#define SHARD_LARGE_CACHE_DELAY_MS 1000
#endif
/* A cached block taken for a smaller request keeps its extra committed memory for growth unless that is
 * more than 4 times the request and more than this. */
#ifndef SHARD_LARGE_EXCESS_MIN
#define SHARD_LARGE_EXCESS_MIN ((size_t)16 << 20)
#endif

#if SHARD_RESERVE_HEAPS < 0 || SHARD_SPARE_SEGMENTS < 0 || SHARD_ORPHAN_PAGES < 0 || SHARD_RECLAIM_MIN < 1 || \
    SHARD_CARVE_BYTES < 1 || SHARD_CARVE_MIN < 1 || \
    SHARD_KEEP_FREE_PAGES < 0 || SHARD_SWEEP_PAGES < 1 || SHARD_GATHER_ITEMS < 1 || \
    SHARD_GATHER_AFTER < 1
#error "invalid shardmm configuration"
#endif

#endif
