// Fake vendor host runtime: the pinned host allocators fd-platforms calls
// through ctypes (Iluvatar CoreX libcudart.so, MetaX libmcruntime.so), backed
// by malloc, so the pinned path can be tested without vendor hardware.
//
//   int cudaHostAlloc(void** ptr, size_t size, unsigned flags)  / mcMallocHost
//   int cudaFreeHost(void* ptr)                                  / mcFreeHost
//   int fake_host_live(void)   live allocations (tests check release frees)
//
// Environment knobs, read on every allocation:
//   FAKE_HOST_LIMIT   bytes; a larger request returns 2 (out of memory)
//   FAKE_HOST_STATUS  a non-zero status every allocation returns instead
//                     (e.g. 35, CUDA's "insufficient driver")
#include <atomic>
#include <cstddef>
#include <cstdlib>

namespace {

constexpr int kOutOfMemory = 2;  // cudaErrorMemoryAllocation
std::atomic<int> g_live{0};

// A decimal env var, or `fallback` when it is unset, empty or not a number.
unsigned long long EnvNumber(const char* name, unsigned long long fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v || *v == '-') return fallback;
  char* end = nullptr;
  unsigned long long n = std::strtoull(v, &end, 10);
  return *end == '\0' ? n : fallback;
}

int Alloc(void** ptr, size_t size) {
  if (!ptr) return 1;  // cudaErrorInvalidValue
  *ptr = nullptr;
  if (int status = static_cast<int>(EnvNumber("FAKE_HOST_STATUS", 0))) return status;
  if (size > EnvNumber("FAKE_HOST_LIMIT", ~0ULL)) return kOutOfMemory;
  void* p = std::malloc(size ? size : 1);
  if (!p) return kOutOfMemory;
  *ptr = p;
  ++g_live;
  return 0;
}

int Free(void* ptr) {
  if (ptr) {
    std::free(ptr);
    --g_live;
  }
  return 0;
}

}  // namespace

extern "C" {

int cudaHostAlloc(void** ptr, size_t size, unsigned /*flags*/) { return Alloc(ptr, size); }
int cudaFreeHost(void* ptr) { return Free(ptr); }
int mcMallocHost(void** ptr, size_t size, unsigned /*flags*/) { return Alloc(ptr, size); }
int mcFreeHost(void* ptr) { return Free(ptr); }
int fake_host_live(void) { return g_live.load(); }

}  // extern "C"
