// Fake vendor runtime: the calls fd-platforms makes through ctypes into Iluvatar
// CoreX's libcudart.so and MetaX's libmcruntime.so, so the pinned-memory and
// cross-process cache paths can be tested without vendor hardware. One source
// exports both spellings (cuda* and mc*).
//
// Pinned host memory (page-aligned, from posix_memalign):
//   int cudaHostAlloc(void** ptr, size_t size, unsigned flags)   / mcMallocHost
//   int cudaFreeHost(void* ptr)                                   / mcFreeHost
// Device memory and its IPC (memfd-backed, so another process can map it):
//   int cudaMalloc(void** ptr, size_t size)                       / mcMalloc
//   int cudaFree(void* ptr)                                       / mcFree
//   int cudaMemset(void* ptr, int value, size_t size)             / mcMemset
//   int cudaMemcpy(void* dst, const void* src, size_t size, int kind) / mcMemcpy
//   int cudaIpcGetMemHandle(Handle* handle, void* ptr)            / mcIpcGetMemHandle
//   int cudaIpcOpenMemHandle(void** ptr, Handle handle, unsigned) / mcIpcOpenMemHandle
//   int cudaIpcCloseMemHandle(void* ptr)                          / mcIpcCloseMemHandle
//   int cudaGetDevice(int* id), int cudaSetDevice(int id)         / mcGetDevice, mcSetDevice
// Handle is a 64-byte struct passed by value, as cudaIpcMemHandle_t is. The fake
// handle names the exporting process's memfd (pid, descriptor, inode, size); the
// opener maps /proc/<pid>/fd/<fd> after checking the inode and size.
// For tests:
//   int fake_host_live(void)        pinned allocations not yet freed
//   int fake_device_live(void)      device allocations not yet freed
//   int fake_ipc_open_count(void)   opened handles not yet closed
//   int fake_device_of(void* ptr)   the current device when ptr was allocated or opened; -1 unknown
//
// Environment knobs, read on every call:
//   FAKE_HOST_LIMIT   bytes; a larger pinned request returns 2 (out of memory)
//   FAKE_HOST_STATUS  a non-zero status every pinned allocation returns instead
//                     (e.g. 35, CUDA's "insufficient driver")
//   FAKE_IPC_STATUS   a non-zero status every IPC call returns instead
//                     (e.g. 801, CUDA's "operation not supported")
//   FAKE_DEVICE_STATUS a non-zero status cudaMalloc, cudaGetDevice and cudaSetDevice
//                     return instead (e.g. 35: a runtime without its driver)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace {

constexpr int kInvalidValue = 1;            // cudaErrorInvalidValue
constexpr int kOutOfMemory = 2;             // cudaErrorMemoryAllocation
constexpr int kInvalidHandle = 400;         // cudaErrorInvalidResourceHandle
constexpr char kMagic[8] = {'F', 'A', 'K', 'E', 'I', 'P', 'C', '1'};

struct Handle {  // the size and passing of cudaIpcMemHandle_t
  char reserved[64];
};
struct HandleFields {  // what the fake writes into Handle::reserved
  char magic[8];
  int32_t pid;
  int32_t fd;
  uint64_t inode;
  uint64_t size;
  int32_t device;
};
static_assert(sizeof(HandleFields) <= sizeof(Handle), "fake handle fits cudaIpcMemHandle_t");

struct Block {
  size_t size;
  int fd;      // the memfd (allocations); -1 for opened handles
  int device;  // the current device when it was made
};

std::atomic<int> g_live{0};
thread_local int g_device = 0;  // like cudaSetDevice: per thread
std::mutex g_mutex;
std::map<void*, Block> g_allocated;  // guarded by g_mutex
std::map<void*, Block> g_opened;     // guarded by g_mutex

// A decimal env var, or `fallback` when it is unset, empty or not a number.
unsigned long long EnvNumber(const char* name, unsigned long long fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v || *v == '-') return fallback;
  char* end = nullptr;
  unsigned long long n = std::strtoull(v, &end, 10);
  return *end == '\0' ? n : fallback;
}

int IpcStatus() { return static_cast<int>(EnvNumber("FAKE_IPC_STATUS", 0)); }
int DeviceStatus() { return static_cast<int>(EnvNumber("FAKE_DEVICE_STATUS", 0)); }

int HostAlloc(void** ptr, size_t size) {
  if (!ptr) return kInvalidValue;
  *ptr = nullptr;
  if (int status = static_cast<int>(EnvNumber("FAKE_HOST_STATUS", 0))) return status;
  if (size > EnvNumber("FAKE_HOST_LIMIT", ~0ULL)) return kOutOfMemory;
  void* p = nullptr;  // page-aligned, as the real pinned allocators return it
  if (posix_memalign(&p, 4096, size ? size : 1) != 0) return kOutOfMemory;
  *ptr = p;
  ++g_live;
  return 0;
}

int HostFree(void* ptr) {
  if (ptr) {
    std::free(ptr);
    --g_live;
  }
  return 0;
}

void* MapShared(int fd, size_t size) {
  void* p = mmap(nullptr, size ? size : 1, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

int DeviceAlloc(void** ptr, size_t size) {
  if (!ptr) return kInvalidValue;
  *ptr = nullptr;
  if (int status = DeviceStatus()) return status;
  int fd = memfd_create("fake-device-memory", MFD_CLOEXEC);
  if (fd < 0) return kOutOfMemory;
  void* p = nullptr;
  if (ftruncate(fd, static_cast<off_t>(size ? size : 1)) != 0 || !(p = MapShared(fd, size))) {
    close(fd);
    return kOutOfMemory;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_allocated[p] = Block{size, fd, g_device};
  *ptr = p;
  return 0;
}

int DeviceFree(void* ptr) {
  if (!ptr) return 0;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_allocated.find(ptr);
  if (it == g_allocated.end()) return kInvalidValue;
  munmap(ptr, it->second.size ? it->second.size : 1);
  close(it->second.fd);
  g_allocated.erase(it);
  return 0;
}

int Memset(void* ptr, int value, size_t size) {
  if (!ptr) return kInvalidValue;
  std::memset(ptr, value, size);
  return 0;
}

int Memcpy(void* dst, const void* src, size_t size, int kind) {
  if (!dst || !src || kind < 0 || kind > 4) return kInvalidValue;  // cudaMemcpyHostToHost .. Default
  std::memmove(dst, src, size);  // the fake's device memory is mapped into the process
  return 0;
}

int GetHandle(Handle* handle, void* ptr) {
  if (int status = IpcStatus()) return status;
  if (!handle) return kInvalidValue;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_allocated.find(ptr);
  if (it == g_allocated.end()) return kInvalidValue;  // not the base of a device allocation
  struct stat st;
  if (fstat(it->second.fd, &st) != 0) return kInvalidValue;
  HandleFields fields{};
  std::memcpy(fields.magic, kMagic, sizeof(kMagic));
  fields.pid = getpid();
  fields.fd = it->second.fd;
  fields.inode = st.st_ino;
  fields.size = it->second.size;
  fields.device = it->second.device;
  std::memset(handle, 0, sizeof(Handle));
  std::memcpy(handle->reserved, &fields, sizeof(fields));
  return 0;
}

int OpenHandle(void** ptr, Handle handle, unsigned /*flags*/) {
  if (int status = IpcStatus()) return status;
  if (!ptr) return kInvalidValue;
  *ptr = nullptr;
  HandleFields fields;
  std::memcpy(&fields, handle.reserved, sizeof(fields));
  if (std::memcmp(fields.magic, kMagic, sizeof(kMagic)) != 0) return kInvalidHandle;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", fields.pid, fields.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return kInvalidHandle;  // the exporter is gone, or freed the memory
  struct stat st;
  void* p = nullptr;
  if (fstat(fd, &st) == 0 && st.st_ino == fields.inode && static_cast<uint64_t>(st.st_size) == fields.size)
    p = MapShared(fd, fields.size);
  close(fd);
  if (!p) return kInvalidHandle;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_opened[p] = Block{fields.size, -1, g_device};
  *ptr = p;
  return 0;
}

int CloseHandle(void* ptr) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_opened.find(ptr);
  if (it == g_opened.end()) return kInvalidValue;
  munmap(ptr, it->second.size ? it->second.size : 1);
  g_opened.erase(it);
  return 0;
}

int GetDevice(int* id) {
  if (int status = DeviceStatus()) return status;
  if (!id) return kInvalidValue;
  *id = g_device;
  return 0;
}

int SetDevice(int id) {
  if (int status = DeviceStatus()) return status;
  if (id < 0 || id >= 64) return 101;  // cudaErrorInvalidDevice
  g_device = id;
  return 0;
}

}  // namespace

extern "C" {

int cudaHostAlloc(void** ptr, size_t size, unsigned /*flags*/) { return HostAlloc(ptr, size); }
int cudaFreeHost(void* ptr) { return HostFree(ptr); }
int mcMallocHost(void** ptr, size_t size, unsigned /*flags*/) { return HostAlloc(ptr, size); }
int mcFreeHost(void* ptr) { return HostFree(ptr); }

// The device calls, the same in both spellings (cuda* and mc*): one list serves both.
#define DEVICE_CALLS(prefix)                                                                  \
  int prefix##Malloc(void** ptr, size_t size) { return DeviceAlloc(ptr, size); }              \
  int prefix##Free(void* ptr) { return DeviceFree(ptr); }                                     \
  int prefix##Memset(void* ptr, int value, size_t size) { return Memset(ptr, value, size); }  \
  int prefix##Memcpy(void* dst, const void* src, size_t size, int kind) {                     \
    return Memcpy(dst, src, size, kind);                                                      \
  }                                                                                           \
  int prefix##IpcGetMemHandle(Handle* handle, void* ptr) { return GetHandle(handle, ptr); }   \
  int prefix##IpcOpenMemHandle(void** ptr, Handle handle, unsigned flags) {                   \
    return OpenHandle(ptr, handle, flags);                                                    \
  }                                                                                           \
  int prefix##IpcCloseMemHandle(void* ptr) { return CloseHandle(ptr); }                       \
  int prefix##GetDevice(int* id) { return GetDevice(id); }                                    \
  int prefix##SetDevice(int id) { return SetDevice(id); }

DEVICE_CALLS(cuda)
DEVICE_CALLS(mc)

int fake_host_live(void) { return g_live.load(); }
int fake_device_live(void) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return static_cast<int>(g_allocated.size());
}
int fake_ipc_open_count(void) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return static_cast<int>(g_opened.size());
}
int fake_device_of(void* ptr) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto a = g_allocated.find(ptr);
  if (a != g_allocated.end()) return a->second.device;
  auto o = g_opened.find(ptr);
  return o != g_opened.end() ? o->second.device : -1;
}

}  // extern "C"
