/* pages.h - the small-page layout the tests of shardmm's rules count with, written out independently
 * of the allocator (src/small.h): 64 KB pages; a class whose page holds at most 8 items (7.5-16 KB)
 * comes in runs of RUN_PAGES pages, 4 to 32 items; the hardened build makes no runs. */
#ifndef TEST_PAGES_H
#define TEST_PAGES_H

#define PAGE_SIZE 65536
#ifdef TEST_HARDENED
#define RUN_PAGES 1
#else
#define RUN_PAGES 4
#endif

#endif
