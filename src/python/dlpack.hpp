// The DLPack ABI (dlpack.h, the "dltensor" capsules of v0.8, which every
// producer still accepts): what memory.cpp reads from a tensor it registers
// and gpu.cpp writes when it exports a GpuBuffer. Written from the
// specification; only the fields gpuverbs uses are named.
#pragma once

#include <cstdint>

namespace gpuverbs::python::dlpack {

struct Device {
    std::int32_t device_type;
    std::int32_t device_id;
};
struct DataType {
    std::uint8_t code;
    std::uint8_t bits;
    std::uint16_t lanes;
};
struct Tensor {
    void* data;
    Device device;
    std::int32_t ndim;
    DataType dtype;
    std::int64_t* shape;
    std::int64_t* strides; ///< in elements; null: compact row-major
    std::uint64_t byte_offset;
};
/// What a "dltensor" capsule points at; the consumer calls `deleter` once.
struct ManagedTensor {
    Tensor dl_tensor;
    void* manager_ctx;
    void (*deleter)(ManagedTensor* self);
};

// Device types.
constexpr std::int32_t cpu = 1;
constexpr std::int32_t cuda = 2;
constexpr std::int32_t cuda_host = 3;
constexpr std::int32_t cuda_managed = 13;
// Type codes.
constexpr std::uint8_t uint_code = 1;

} // namespace gpuverbs::python::dlpack
