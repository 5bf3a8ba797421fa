// The staged path: moving GPU memory when GPUDirect RDMA cannot be used (no
// peermem, no DMA-BUF, a cloud VM, a laptop GPU). Explicit and loud: nothing
// in gpuverbs falls back to it; the user asks for it, and it says which path
// it uses and why GPUDirect could not be used.
//
//   auto why = gpuverbs::StagedWriter::why_needed(pd, gpu);        // register_gpu_memory's reasons, or nothing
//   if (why) {
//       gpuverbs::StagedWriter writer(pd, {.chunk = 4 << 20, .depth = 4}, *why);
//       std::puts(writer.path().c_str());   // "staged: GPU -> 4 pinned host buffers of 4 MiB -> RDMA write; ..."
//       writer.write(qp, cq, gpu, peer_memory);                      // chunk k+1 copies while chunk k is written
//   }
//
// The copies run on one CUDA stream into `depth` pinned host buffers
// (cuMemHostAlloc), so the copy of chunk k+1 overlaps the RDMA write of chunk
// k; the receiver copies host -> GPU the same way (CopyPipeline::to_gpu).
// What it costs: every byte crosses PCIe twice and host memory once; see
// docs/transfers.md for measured numbers.
#pragma once

#include "gpuverbs/error.hpp"
#include "gpuverbs/gpu/gpu_buffer.hpp"
#include "gpuverbs/verbs/completion_queue.hpp"
#include "gpuverbs/verbs/memory_region.hpp"
#include "gpuverbs/verbs/protection_domain.hpp"
#include "gpuverbs/verbs/queue_pair.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace gpuverbs {

struct StagingOptions {
    std::size_t chunk = std::size_t{4} << 20; ///< bytes per chunk: one copy, one RDMA write
    std::uint32_t depth = 4;                  ///< staging buffers: chunks in flight
    int gpu = 0;                              ///< the GPU whose memory is staged (CUDA pins the buffers for it)
    /// How long StagedWriter waits for one chunk's write to complete.
    std::chrono::milliseconds timeout = std::chrono::seconds(30);
};

/// `depth` host buffers of `chunk` bytes: pinned by CUDA (cuMemHostAlloc)
/// when the library has CUDA and the GPU is there, page-aligned host memory
/// otherwise (host-to-host staging, as in the Soft-RoCE rig). Move-only.
class StagingBuffers {
public:
    /// Throws gpuverbs::Error (errc::invalid_argument) for a zero chunk or
    /// depth, or buffers larger than memory can hold.
    explicit StagingBuffers(const StagingOptions& options);
    /// The same without throwing: on failure `ec` is set and the buffers
    /// returned are empty (count() 0).
    static StagingBuffers create(const StagingOptions& options, std::error_code& ec);
    /// … with the words of the failure in `diagnostics` (cleared on success).
    static StagingBuffers create(const StagingOptions& options, std::error_code& ec, Diagnostics& diagnostics);
    StagingBuffers(StagingBuffers&&) noexcept;
    StagingBuffers& operator=(StagingBuffers&&) noexcept;
    StagingBuffers(const StagingBuffers&) = delete;
    StagingBuffers& operator=(const StagingBuffers&) = delete;
    ~StagingBuffers();

    [[nodiscard]] std::size_t count() const noexcept;
    [[nodiscard]] std::size_t chunk() const noexcept;
    [[nodiscard]] std::span<std::byte> slot(std::size_t i) const noexcept;
    /// All buffers, contiguous (one registration covers them).
    [[nodiscard]] std::span<std::byte> all() const noexcept;
    /// Whether CUDA pinned them (DMA at full speed) or they are plain host memory.
    [[nodiscard]] bool cuda_pinned() const noexcept;
    /// False when empty (create() failed, or moved from).
    explicit operator bool() const noexcept { return state_ != nullptr; }

private:
    friend class CopyPipeline;
    friend class StagedWriter;
    struct State;
    StagingBuffers() noexcept;
    static StagingBuffers create_impl(const StagingOptions& options, detail::Status& status);
    std::unique_ptr<State> state_;
};

/// The copy half of the staged path: GPU memory to and from host memory in
/// chunks through StagingBuffers, on one CUDA stream, `depth` chunks in flight.
/// Needs CUDA and the GPU (otherwise errc::built_without_cuda, no_gpu_driver,
/// no_gpu, a CUresult in cuda_category() such as a wrong GPU number, or
/// errc::cuda_error when the staging buffers cannot be pinned).
class CopyPipeline {
public:
    /// Throws gpuverbs::Error, as the class says.
    explicit CopyPipeline(const StagingOptions& options);
    /// The same without throwing: on failure `ec` is set and the pipeline
    /// returned is empty (from_gpu and to_gpu throw errc::invalid_argument).
    static CopyPipeline create(const StagingOptions& options, std::error_code& ec);
    /// … with the words of the failure in `diagnostics` (cleared on success).
    static CopyPipeline create(const StagingOptions& options, std::error_code& ec, Diagnostics& diagnostics);
    CopyPipeline(CopyPipeline&&) noexcept;
    CopyPipeline& operator=(CopyPipeline&&) noexcept;
    CopyPipeline(const CopyPipeline&) = delete;
    CopyPipeline& operator=(const CopyPipeline&) = delete;
    ~CopyPipeline();

    /// Copies `src` chunk by chunk into the staging buffers and calls
    /// consume(chunk, offset) for each, in order, once its copy has finished;
    /// the copies of the next chunks run meanwhile. A chunk's buffer is reused
    /// after consume returns.
    void from_gpu(const GpuMemory& src, const std::function<void(std::span<const std::byte>, std::size_t)>& consume);
    /// Calls produce(buffer, offset) to fill each chunk, in order, and copies it
    /// to `dst` while the next one is produced; returns when every copy is done.
    void to_gpu(const GpuMemory& dst, const std::function<void(std::span<std::byte>, std::size_t)>& produce);

    /// Its buffers (not on an empty pipeline).
    [[nodiscard]] StagingBuffers& buffers() noexcept;
    /// False when empty (create() failed, or moved from).
    explicit operator bool() const noexcept { return state_ != nullptr; }

private:
    struct State;
    CopyPipeline() noexcept;
    static CopyPipeline create_impl(const StagingOptions& options, detail::Status& status);
    std::unique_ptr<State> state_;
};

/// Writes GPU (or host) memory to a peer's registered memory through staging
/// buffers registered in `pd`: the copy of chunk k+1 overlaps the RDMA write
/// of chunk k. Blocking: each chunk's write completion is polled from `cq`
/// (a CompletionQueue without an executor, the QP's send CQ, used by nothing
/// else: a foreign completion is an error, not silently taken).
class StagedWriter {
public:
    /// Why GPUDirect RDMA cannot be used for `memory` on `pd`'s device: the
    /// reasons register_gpu_memory gives, in words; nothing when it works
    /// (then do not stage). Registers and drops a region to find out.
    static std::optional<std::string> why_needed(const ProtectionDomain& pd, const GpuMemory& memory);

    /// `why_not_direct`: the reason the caller is staging (why_needed()'s words,
    /// or the caller's own); it is part of path(). Throws gpuverbs::Error:
    /// options StagingBuffers refuses, or buffers `pd` cannot register.
    StagedWriter(const ProtectionDomain& pd, const StagingOptions& options, const std::string& why_not_direct);
    /// The same without throwing: on failure `ec` is set and the writer
    /// returned is empty (write() throws errc::invalid_argument).
    static StagedWriter create(const ProtectionDomain& pd, const StagingOptions& options,
                               const std::string& why_not_direct, std::error_code& ec);
    /// … with the words of the failure in `diagnostics` (cleared on success).
    static StagedWriter create(const ProtectionDomain& pd, const StagingOptions& options,
                               const std::string& why_not_direct, std::error_code& ec, Diagnostics& diagnostics);
    /// False when empty (create() failed, or moved from).
    explicit operator bool() const noexcept { return static_cast<bool>(mr_); }

    /// "staged: GPU -> 4 pinned host buffers of 4 MiB -> RDMA write (GPUDirect RDMA is not used: <why>)".
    [[nodiscard]] const std::string& path() const noexcept { return path_; }

    /// Writes `src` to [offset, offset + size) of `dst`; returns the bytes
    /// written. Throws gpuverbs::Error naming the chunk that failed.
    std::size_t write(QueuePair& qp, CompletionQueue& cq, const GpuMemory& src, const RemoteMemory& dst,
                      std::uint64_t offset = 0);
    /// … from host memory through the same buffers and pipeline (no GPU needed).
    std::size_t write(QueuePair& qp, CompletionQueue& cq, std::span<const std::byte> src, const RemoteMemory& dst,
                      std::uint64_t offset = 0);

    [[nodiscard]] const StagingOptions& options() const noexcept { return options_; }

private:
    StagedWriter() = default;
    static StagedWriter create_impl(const ProtectionDomain& pd, const StagingOptions& options,
                                    const std::string& why_not_direct, detail::Status& status);
    /// Throws when the writer is empty.
    void check_usable() const;
    void write_chunk(QueuePair& qp, CompletionQueue& cq, std::span<const std::byte> chunk, const RemoteMemory& dst,
                     std::uint64_t offset, std::size_t index);

    StagingOptions options_;
    std::unique_ptr<CopyPipeline> pipeline_; ///< with CUDA
    std::unique_ptr<StagingBuffers> host_;   ///< without (host sources only)
    std::string no_gpu_;                     ///< why there is no copy pipeline
    MemoryRegion mr_;
    std::string path_;
};

} // namespace gpuverbs
