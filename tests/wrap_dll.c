/* wrap_dll.c - a DLL of someone else's that links shardmm's static library (build/win64/libshardmm.a)
 * and hands out its blocks; tests/test_win64.c loads and unloads it. The allocator's FLS callback lives
 * in this DLL, so the allocator pins the DLL when it starts: FreeLibrary must not unload code that
 * Windows will still call at the exit of a thread that allocated. */
#include "shardmm.h"

__declspec(dllexport) void *wrap_malloc(size_t n) { return shard_malloc(n); }
__declspec(dllexport) void wrap_free(void *p) { shard_free(p); }
