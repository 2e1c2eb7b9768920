// Counts the bytes a process holds on the heap, for scripts/eager_memory/reference.py: loaded with
// LD_PRELOAD, it wraps glibc's allocation functions and keeps the bytes allocated now and the most
// held since the last reset (each block counted at its usable size). PyTorch's CPU tensors are
// allocated through posix_memalign and released through free, so the figures follow its tensors.
#define _GNU_SOURCE
#include <malloc.h>
#include <stdatomic.h>
#include <stddef.h>

extern void* __libc_malloc(size_t);
extern void* __libc_calloc(size_t, size_t);
extern void* __libc_realloc(void*, size_t);
extern void* __libc_memalign(size_t, size_t);
extern void __libc_free(void*);

static _Atomic long long current_bytes;
static _Atomic long long peak_bytes;

static void* counted(void* p) {
  if (p == NULL) return p;
  const long long now = atomic_fetch_add(&current_bytes, (long long)malloc_usable_size(p)) +
                        (long long)malloc_usable_size(p);
  long long seen = atomic_load(&peak_bytes);
  while (now > seen && !atomic_compare_exchange_weak(&peak_bytes, &seen, now)) {
  }
  return p;
}

static void uncounted(void* p) {
  if (p != NULL) atomic_fetch_sub(&current_bytes, (long long)malloc_usable_size(p));
}

void* malloc(size_t n) { return counted(__libc_malloc(n)); }
void* calloc(size_t k, size_t n) { return counted(__libc_calloc(k, n)); }
void* memalign(size_t a, size_t n) { return counted(__libc_memalign(a, n)); }
void* aligned_alloc(size_t a, size_t n) { return counted(__libc_memalign(a, n)); }
void* valloc(size_t n) { return counted(__libc_memalign(4096, n)); }
int posix_memalign(void** out, size_t a, size_t n) {
  void* p = counted(__libc_memalign(a, n));
  if (p == NULL) return 12;  // ENOMEM
  *out = p;
  return 0;
}
void* realloc(void* p, size_t n) {
  uncounted(p);
  void* q = __libc_realloc(p, n);
  if (q == NULL && n != 0 && p != NULL) {  // failed: p is still held
    counted(p);
    return NULL;
  }
  return counted(q);
}
void free(void* p) {
  uncounted(p);
  __libc_free(p);
}

long long alloc_count_current(void) { return atomic_load(&current_bytes); }
long long alloc_count_peak(void) { return atomic_load(&peak_bytes); }
void alloc_count_reset_peak(void) { atomic_store(&peak_bytes, atomic_load(&current_bytes)); }
