// fd_platforms_foreign_tensor: a Paddle tensor over device memory Paddle did not allocate.
//
// Paddle 3.3 has no Python call that wraps a device pointer on a custom device (its DLPack
// import takes CPU and CUDA places only). This operator does: the memory is held by a
// phi::Allocation that calls the vendor runtime's release function (mcFree,
// mcIpcCloseMemHandle, ...; `int release(void*)`, passed as an address) when the last tensor
// over it is gone. The tensor takes its place and dtype from `like`, a 0-element tensor on the
// target device. Built and loaded by fd_platforms/kit/foreign_tensor.py.
#include <memory>
#include <vector>

#include "paddle/extension.h"
#include "paddle/phi/core/allocator.h"
#include "paddle/phi/core/dense_tensor.h"

namespace {

using ReleaseFn = int (*)(void*);

// Memory owned by a vendor runtime: released through it, once, when Paddle drops the last holder.
class ForeignAllocation : public phi::Allocation {
 public:
  ForeignAllocation(void* data, size_t size, const phi::Place& place, ReleaseFn release)
      : phi::Allocation(data, size, place), release_(release) {}
  ~ForeignAllocation() override {
    if (release_ != nullptr) release_(ptr_);
  }

 private:
  ReleaseFn release_;
};

std::vector<paddle::Tensor> ForeignTensor(const paddle::Tensor& like, int64_t address, int64_t release,
                                          const std::vector<int64_t>& shape) {
  PD_CHECK(address != 0, "fd_platforms_foreign_tensor: address is 0");
  int64_t elements = 1;
  for (int64_t extent : shape) {
    PD_CHECK(extent >= 0, "fd_platforms_foreign_tensor: negative extent");
    elements *= extent;
  }
  size_t bytes = static_cast<size_t>(elements) * phi::SizeOf(like.dtype());
  auto holder = std::make_shared<ForeignAllocation>(reinterpret_cast<void*>(address), bytes, like.place(),
                                                    reinterpret_cast<ReleaseFn>(release));
  phi::DenseTensorMeta meta(like.dtype(), common::make_ddim(shape));
  return {paddle::Tensor(std::make_shared<phi::DenseTensor>(holder, meta))};
}

}  // namespace

PD_BUILD_OP(fd_platforms_foreign_tensor)
    .Inputs({"like"})
    .Outputs({"out"})
    .Attrs({"address: int64_t", "release: int64_t", "shape: std::vector<int64_t>"})
    .SetKernelFn(PD_KERNEL(ForeignTensor));
