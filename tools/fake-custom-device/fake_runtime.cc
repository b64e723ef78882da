// Fake Paddle custom-device runtime: registers FAKE_DEVICE_TYPE (e.g.
// "iluvatar_gpu") with Paddle's real custom-device loader, backed by host
// memory, so tests can run without vendor hardware.
//
// Environment knobs (read when Paddle loads the plugin):
//   FAKE_DEVICE_COUNT         number of devices (default 2)
//   FAKE_DEVICE_TOTAL_MEMORY  bytes of memory per device (default 16 GiB)
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "paddle/phi/backends/device_base.h"  // phi::DeviceProp
#include "paddle/phi/backends/device_ext.h"

#ifndef FAKE_DEVICE_TYPE
#error "compile with -DFAKE_DEVICE_TYPE=\"name\" (use build.sh)"
#endif

namespace {

constexpr int kMaxDevices = 64;
size_t g_count = 2;
size_t g_total = size_t{16} << 30;
std::atomic<size_t> g_used[kMaxDevices];  // bytes handed out per device
thread_local int g_current = 0;           // like cudaSetDevice: per thread

// Reads a decimal env var into *out; unset or empty keeps the default.
bool ReadEnv(const char* name, size_t* out) {
  const char* v = std::getenv(name);
  if (!v || !*v) return true;
  char* end = nullptr;
  unsigned long long n = std::strtoull(v, &end, 10);
  if (*end != '\0' || *v == '-') {
    std::fprintf(stderr, "fake_runtime: %s=%s is not a whole number\n", name, v);
    return false;
  }
  *out = n;
  return true;
}

bool Valid(const C_Device d) { return d->id >= 0 && size_t(d->id) < g_count; }

// A failure here makes Paddle log "Initialize <type> Failed" and exit.
C_Status Initialize() {
  if (!ReadEnv("FAKE_DEVICE_COUNT", &g_count) ||
      !ReadEnv("FAKE_DEVICE_TOTAL_MEMORY", &g_total))
    return C_ERROR;
  if (g_count > kMaxDevices) {
    std::fprintf(stderr, "fake_runtime: FAKE_DEVICE_COUNT=%zu exceeds %d\n",
                 g_count, kMaxDevices);
    return C_ERROR;
  }
  return C_SUCCESS;
}

C_Status Nop(const C_Device) { return C_SUCCESS; }
C_Status SetDevice(const C_Device d) {
  if (!Valid(d)) return C_ERROR;
  g_current = d->id;
  return C_SUCCESS;
}
C_Status GetDevice(const C_Device d) {
  d->id = g_current;
  return C_SUCCESS;
}

// Work is synchronous, so streams and events are distinct do-nothing handles.
C_Status CreateStream(const C_Device, C_Stream* s) {
  *s = reinterpret_cast<C_Stream>(new char);
  return C_SUCCESS;
}
C_Status DestroyStream(const C_Device, C_Stream s) {
  delete reinterpret_cast<char*>(s);
  return C_SUCCESS;
}
C_Status CreateEvent(const C_Device, C_Event* e) {
  *e = reinterpret_cast<C_Event>(new char);
  return C_SUCCESS;
}
C_Status DestroyEvent(const C_Device, C_Event e) {
  delete reinterpret_cast<char*>(e);
  return C_SUCCESS;
}
C_Status StreamNop(const C_Device, C_Stream) { return C_SUCCESS; }
C_Status EventNop(const C_Device, C_Event) { return C_SUCCESS; }
C_Status StreamEventNop(const C_Device, C_Stream, C_Event) { return C_SUCCESS; }
C_Status AddCallback(const C_Device d, C_Stream s, C_Callback cb, void* data) {
  C_Status status = C_SUCCESS;
  cb(d, s, data, &status);  // the stream is always idle: run it now
  return status;
}

// "Device" memory is malloc'd host memory, capped at g_total per device.
C_Status DeviceAlloc(const C_Device d, void** ptr, size_t size) {
  if (!Valid(d)) return C_ERROR;
  size_t used = g_used[d->id].load();
  do {
    if (size > g_total - used) return C_FAILED;  // out of (fake) memory
  } while (!g_used[d->id].compare_exchange_weak(used, used + size));
  *ptr = std::malloc(size);
  if (*ptr) return C_SUCCESS;
  g_used[d->id] -= size;
  return C_FAILED;
}
C_Status DeviceFree(const C_Device d, void* ptr, size_t size) {
  std::free(ptr);
  g_used[d->id] -= size;
  return C_SUCCESS;
}
C_Status HostAlloc(const C_Device, void** ptr, size_t size) {
  *ptr = std::malloc(size);
  return *ptr ? C_SUCCESS : C_FAILED;
}
C_Status HostFree(const C_Device, void* ptr, size_t) {
  std::free(ptr);
  return C_SUCCESS;
}
C_Status MemSet(const C_Device, void* ptr, unsigned char value, size_t size) {
  std::memset(ptr, value, size);
  return C_SUCCESS;
}
C_Status Copy(const C_Device, void* dst, const void* src, size_t size) {
  std::memcpy(dst, src, size);
  return C_SUCCESS;
}
C_Status AsyncCopy(const C_Device, C_Stream, void* dst, const void* src,
                   size_t size) {
  std::memcpy(dst, src, size);
  return C_SUCCESS;
}
C_Status CopyP2P(const C_Device, const C_Device, void* dst, const void* src,
                 size_t size) {
  std::memcpy(dst, src, size);
  return C_SUCCESS;
}
C_Status AsyncCopyP2P(const C_Device, const C_Device, C_Stream, void* dst,
                      const void* src, size_t size) {
  std::memcpy(dst, src, size);
  return C_SUCCESS;
}

C_Status GetCount(size_t* count) {
  *count = g_count;
  return C_SUCCESS;
}
C_Status GetList(size_t* ids) {
  for (size_t i = 0; i < g_count; ++i) ids[i] = i;
  return C_SUCCESS;
}
C_Status MemoryStats(const C_Device d, size_t* total, size_t* free) {
  if (!Valid(d)) return C_ERROR;
  *total = g_total;
  *free = g_total - g_used[d->id].load();
  return C_SUCCESS;
}
C_Status MinChunkSize(const C_Device, size_t* size) {
  *size = 512;  // allocation granularity/alignment, as on CUDA-like devices
  return C_SUCCESS;
}
// Paddle passes its static phi::DeviceProp; backs get_device_properties().
C_Status DeviceProperties(const C_Device d, void* out) {
  if (!Valid(d)) return C_ERROR;
  *static_cast<phi::DeviceProp*>(out) = phi::DeviceProp(
      std::string("Fake ") + FAKE_DEVICE_TYPE, 8, 0, g_total, 16, false, false);
  return C_SUCCESS;
}
C_Status Supported(const C_Device, bool* supported) {
  *supported = true;  // float16 / bfloat16
  return C_SUCCESS;
}

}  // namespace

extern "C" void InitPlugin(CustomRuntimeParams* params) {
  PADDLE_CUSTOM_RUNTIME_CHECK_VERSION(params);
  params->device_type = const_cast<char*>(FAKE_DEVICE_TYPE);
  params->sub_device_type = const_cast<char*>("fake");

  C_DeviceInterface* i = params->interface;
  i->initialize = Initialize;
  i->init_device = Nop;
  i->deinit_device = Nop;
  i->set_device = SetDevice;
  i->get_device = GetDevice;
  i->synchronize_device = Nop;
  i->create_stream = CreateStream;
  i->destroy_stream = DestroyStream;
  i->query_stream = StreamNop;
  i->synchronize_stream = StreamNop;
  i->stream_add_callback = AddCallback;
  i->create_event = CreateEvent;
  i->destroy_event = DestroyEvent;
  i->record_event = StreamEventNop;
  i->query_event = EventNop;
  i->synchronize_event = EventNop;
  i->stream_wait_event = StreamEventNop;
  i->device_memory_allocate = DeviceAlloc;
  i->device_memory_deallocate = DeviceFree;
  i->device_memory_set = MemSet;
  i->host_memory_allocate = HostAlloc;
  i->host_memory_deallocate = HostFree;
  i->memory_copy_h2d = Copy;
  i->memory_copy_d2h = Copy;
  i->memory_copy_d2d = Copy;
  i->memory_copy_p2p = CopyP2P;
  i->async_memory_copy_h2d = AsyncCopy;
  i->async_memory_copy_d2h = AsyncCopy;
  i->async_memory_copy_d2d = AsyncCopy;
  i->async_memory_copy_p2p = AsyncCopyP2P;
  i->get_device_count = GetCount;
  i->get_device_list = GetList;
  i->device_memory_stats = MemoryStats;
  i->device_min_chunk_size = MinChunkSize;
  i->get_device_properties = DeviceProperties;
  i->is_float16_supported = Supported;
  i->is_bfloat16_supported = Supported;
}
