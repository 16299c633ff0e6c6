/* smaps.h - what the kernel says of a process's huge pages (Linux), for the tests of the huge-page
 * rules: the huge pages in the mappings over a range, and whether one of them has the hint; whether the
 * kernel gives them, and makes them on request; which 4 KB pages of a range are resident. */
#ifndef TEST_SMAPS_H
#define TEST_SMAPS_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

/* The resident 4 KB pages of [r, r + size) (4 MB at most), from mincore; -1 when it cannot tell. *first:
 * whether the first is. */
__attribute__((unused)) static long resident_pages(unsigned char *r, size_t size, int *first)
{
    static unsigned char present[((size_t)4 << 20) / 4096];
    size_t pages = size / 4096;
    if (pages > sizeof present || mincore(r, size, present) != 0)
        return -1;
    long n = 0;
    for (size_t i = 0; i < pages; i++)
        n += present[i] & 1;
    *first = present[0] & 1;
    return n;
}

/* The AnonHugePages of the mappings that overlap [from, to), summed over /proc/self/smaps; *hinted (when
 * not NULL): whether one of them has the huge-page hint (VmFlags "hg"). */
__attribute__((unused)) static unsigned long huge_kb_over(uintptr_t from, uintptr_t to, int *hinted)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    unsigned long lo, hi, kb, huge = 0;
    int ours = 0;
    if (hinted != NULL)
        *hinted = 0;
    while (f != NULL && fgets(line, sizeof line, f)) {
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            ours = from < hi && to > lo;
        else if (ours && sscanf(line, "AnonHugePages: %lu kB", &kb) == 1)
            huge += kb;
        else if (ours && hinted != NULL && strncmp(line, "VmFlags:", 8) == 0)
            *hinted |= strstr(line, " hg") != NULL;
    }
    if (f != NULL)
        fclose(f);
    return huge;
}

/* Whether the kernel gives transparent huge pages to a range that asks for them (its setting is not
 * "never"). */
__attribute__((unused)) static int huge_pages_on(void)
{
    FILE *mode = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char line[512] = "";
    int on = mode != NULL && fgets(line, sizeof line, mode) != NULL && strstr(line, "[never]") == NULL;
    if (mode != NULL)
        fclose(mode);
    return on;
}

/* Whether this kernel makes a huge page of a range on request (MADV_COLLAPSE, Linux 6.1, with one free):
 * a scratch 2 MB, one page of it written. */
__attribute__((unused)) static int kernel_collapses(void)
{
    const size_t unit = (size_t)2 << 20;
    char *r = mmap(NULL, 2 * unit, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED)
        return 0;
    char *p = (char *)(((uintptr_t)r + unit - 1) & ~(uintptr_t)(unit - 1));
    p[0] = 1;
    int ok = madvise(p, unit, MADV_HUGEPAGE) == 0 && madvise(p, unit, 25 /* MADV_COLLAPSE */) == 0 &&
             huge_kb_over((uintptr_t)p, (uintptr_t)p + unit, NULL) >= 2048;
    munmap(r, 2 * unit);
    return ok;
}

#endif
