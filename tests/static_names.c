/* static_names.c - linked into the test program built against build/libshardmm.a: it defines names
 * that the allocator uses internally, as a program might. The link fails (duplicate symbols) or the
 * program calls the wrong function if the static library exports more than the shard_* API. */
#include <stddef.h>
#include <stdint.h>

int static_names_clashes;

void report_error(const char *what, uintptr_t value) { (void)what; (void)value; static_names_clashes++; }
void *meta_alloc(size_t size) { (void)size; static_names_clashes++; return NULL; }
void *os_reserve(size_t size, size_t align) { (void)size; (void)align; static_names_clashes++; return NULL; }
int os_commit(void *addr, size_t size) { (void)addr; (void)size; static_names_clashes++; return -1; }
void *heap_all(void) { static_names_clashes++; return NULL; }
void *port_reserve(size_t size, size_t align) { (void)size; (void)align; static_names_clashes++; return NULL; }
int port_commit(void *addr, size_t size) { (void)addr; (void)size; static_names_clashes++; return -1; }
void heap_start(void) { static_names_clashes++; }
int segmap_set(uintptr_t a, size_t s, unsigned f, unsigned r) { (void)a; (void)s; (void)f; (void)r; static_names_clashes++; return -1; }
void *large_alloc(size_t size) { (void)size; static_names_clashes++; return NULL; }
void *small_alloc_slow(void *h, unsigned cls) { (void)h; (void)cls; static_names_clashes++; return NULL; }
