// The staged path (staging.hpp): pinned host buffers, a chunked copy pipeline
// on one CUDA stream, and a writer that overlaps copies with RDMA writes.
#include "gpuverbs/transfers/staging.hpp"

#include "gpuverbs/gpu/gpu_direct.hpp"

#include "gpu/cuda/driver_api.hpp"
#include "gpuverbs/detail/deadline.hpp"
#include "text.hpp"

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace gpuverbs {

using detail::Status;

namespace {

std::string mib(std::size_t bytes) {
    if (bytes % (std::size_t{1} << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
    if (bytes % 1024 == 0) return std::to_string(bytes >> 10) + " KiB";
    return std::to_string(bytes) + " bytes";
}

bool check_options(const StagingOptions& o, Status& status) {
    if (o.chunk == 0 || o.depth == 0) {
        status.fail(make_error_code(errc::invalid_argument), "StagingOptions",
                    "chunk and depth must be > 0 (chunk " + std::to_string(o.chunk) + ", depth " +
                        std::to_string(o.depth) + ")");
        return false;
    }
    if (o.chunk > SIZE_MAX / o.depth) {
        status.fail(make_error_code(errc::invalid_argument), "StagingOptions",
                    "chunk times depth is more bytes than the address space holds (chunk " + std::to_string(o.chunk) +
                        ", depth " + std::to_string(o.depth) + "): make them smaller");
        return false;
    }
    return true;
}

/// The pipeline's order, whatever copies: start copies into every buffer,
/// then per chunk wait for its copy, hand it on, and start the copy that
/// reuses its buffer.
template <class Start, class Wait, class Consume>
void run_pipeline(std::size_t total, std::size_t chunk, std::size_t depth, Start&& start, Wait&& wait,
                  Consume&& consume) {
    const std::size_t chunks = (total + chunk - 1) / chunk;
    auto length = [&](std::size_t k) { return std::min(chunk, total - k * chunk); };
    for (std::size_t k = 0; k < chunks && k < depth; ++k) start(k % depth, k * chunk, length(k));
    for (std::size_t k = 0; k < chunks; ++k) {
        wait(k % depth);
        consume(k % depth, k * chunk, length(k));
        if (k + depth < chunks) start(k % depth, (k + depth) * chunk, length(k + depth));
    }
}

} // namespace

// --- staging buffers ----------------------------------------------------------

struct StagingBuffers::State {
    std::byte* memory = nullptr;
    std::size_t chunk = 0;
    std::size_t count = 0;
    bool cuda = false;
#if GPUVERBS_HAVE_CUDA
    // Pinned memory belongs to a context: the GPU's primary one, retained for
    // as long as the memory lives and current when it is freed.
    const detail::cuda::DriverApi* cu = nullptr;
    detail::cuda::PrimaryContext context;
#endif
    State() = default;
    State(const State&) = delete;
    State& operator=(const State&) = delete;
    ~State() {
        if (memory == nullptr) return;
#if GPUVERBS_HAVE_CUDA
        if (cuda) {
            detail::cuda::PrimaryContext::Scope scope(*cu, context.get());
            (void)cu->cuMemFreeHost(memory);
            return;
        }
#endif
        std::free(memory); // NOLINT(cppcoreguidelines-no-malloc): from aligned_alloc
    }
};

StagingBuffers StagingBuffers::create_impl(const StagingOptions& options, Status& status) {
    StagingBuffers out;
    if (!check_options(options, status)) return out;
    auto state = std::make_unique<State>();
    state->chunk = options.chunk;
    state->count = options.depth;
    const std::size_t bytes = options.chunk * options.depth;
#if GPUVERBS_HAVE_CUDA
    Status no_cuda; // no CUDA or no such GPU: plain host memory instead (cuda_pinned() says which)
    if (const auto* cu = detail::cuda::driver_api(no_cuda)) {
        detail::cuda::PrimaryContext context(*cu, options.gpu, no_cuda);
        if (context) {
            void* p = nullptr;
            bool pinned = false;
            {
                detail::cuda::PrimaryContext::Scope scope(*cu, context.get());
                // Portable: pinned for every context.
                pinned = scope.ok() && cu->cuMemHostAlloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS;
            }
            if (pinned) {
                state->memory = static_cast<std::byte*>(p);
                state->cuda = true;
                state->cu = cu;
                state->context = std::move(context);
                out.state_ = std::move(state);
                return out;
            }
        }
    }
#endif
    const std::size_t page = 4096;
    const std::size_t rounded = bytes > SIZE_MAX - (page - 1) ? 0 : (bytes + page - 1) / page * page;
    state->memory = rounded == 0 ? nullptr : static_cast<std::byte*>(std::aligned_alloc(page, rounded));
    if (state->memory == nullptr) {
        status.fail(std::make_error_code(std::errc::not_enough_memory), "StagingBuffers",
                    "cannot allocate " + std::to_string(bytes) +
                        " bytes of staging memory: make StagingOptions::chunk or depth smaller");
        return out;
    }
    out.state_ = std::move(state);
    return out;
}

StagingBuffers::StagingBuffers() noexcept = default;

StagingBuffers::StagingBuffers(const StagingOptions& options)
    : StagingBuffers(detail::or_throw([&](Status& s) { return create_impl(options, s); })) {}

StagingBuffers StagingBuffers::create(const StagingOptions& options, std::error_code& ec) {
    return detail::or_code(ec, [&](Status& s) { return create_impl(options, s); });
}

StagingBuffers StagingBuffers::create(const StagingOptions& options, std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](Status& s) { return create_impl(options, s); });
}

StagingBuffers::StagingBuffers(StagingBuffers&&) noexcept = default;
StagingBuffers& StagingBuffers::operator=(StagingBuffers&&) noexcept = default;
StagingBuffers::~StagingBuffers() = default;

std::size_t StagingBuffers::count() const noexcept {
    return state_ ? state_->count : 0;
}
std::size_t StagingBuffers::chunk() const noexcept {
    return state_ ? state_->chunk : 0;
}
std::span<std::byte> StagingBuffers::slot(std::size_t i) const noexcept {
    return state_ ? std::span<std::byte>{state_->memory + i * state_->chunk, state_->chunk} : std::span<std::byte>{};
}
std::span<std::byte> StagingBuffers::all() const noexcept {
    return state_ ? std::span<std::byte>{state_->memory, state_->chunk * state_->count} : std::span<std::byte>{};
}
bool StagingBuffers::cuda_pinned() const noexcept {
    return state_ && state_->cuda;
}

// --- the copy pipeline ----------------------------------------------------------

struct CopyPipeline::State {
    State(const StagingOptions& o, StagingBuffers b) : options(o), buffers(std::move(b)) {}
    StagingOptions options;
    StagingBuffers buffers;
#if GPUVERBS_HAVE_CUDA
    const detail::cuda::DriverApi* cu = nullptr;
    detail::cuda::PrimaryContext context;
    CUstream stream = nullptr;
    std::vector<CUevent> done; // one per buffer: its last copy finished
    ~State() {
        if (cu == nullptr || !context) return;
        detail::cuda::PrimaryContext::Scope scope(*cu, context.get());
        for (CUevent e : done) (void)cu->cuEventDestroy(e);
        if (stream != nullptr) (void)cu->cuStreamDestroy(stream);
    }
#endif
};

CopyPipeline CopyPipeline::create_impl(const StagingOptions& options, Status& status) {
    CopyPipeline out;
    StagingBuffers buffers = StagingBuffers::create_impl(options, status);
    if (!status.ok()) return out;
    auto state = std::make_unique<State>(options, std::move(buffers));
#if GPUVERBS_HAVE_CUDA
    State& s = *state;
    s.cu = detail::cuda::driver_api(status);
    if (s.cu == nullptr) return out;
    s.context = detail::cuda::PrimaryContext(*s.cu, options.gpu, status);
    if (!s.context) return out;
    detail::cuda::PrimaryContext::Scope scope(*s.cu, s.context.get());
    if (detail::cuda::failed(s.cu->cuStreamCreate(&s.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate",
                             "cannot create the staging stream", status)) {
        return out;
    }
    for (std::uint32_t i = 0; i < options.depth; ++i) {
        CUevent e = nullptr;
        if (detail::cuda::failed(s.cu->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate",
                                 "cannot create the staging events", status)) {
            return out;
        }
        s.done.push_back(e);
    }
    if (!s.buffers.cuda_pinned()) {
        status.fail(errc::cuda_error, "cuMemHostAlloc",
                    "cannot pin " + std::to_string(options.chunk * options.depth) + " bytes of staging memory");
        return out;
    }
    out.state_ = std::move(state);
#else
    (void)detail::cuda::driver_api(status); // says "built without CUDA"
#endif
    return out;
}

CopyPipeline::CopyPipeline() noexcept = default;

CopyPipeline::CopyPipeline(const StagingOptions& options)
    : CopyPipeline(detail::or_throw([&](Status& s) { return create_impl(options, s); })) {}

CopyPipeline CopyPipeline::create(const StagingOptions& options, std::error_code& ec) {
    return detail::or_code(ec, [&](Status& s) { return create_impl(options, s); });
}

CopyPipeline CopyPipeline::create(const StagingOptions& options, std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](Status& s) { return create_impl(options, s); });
}

CopyPipeline::CopyPipeline(CopyPipeline&&) noexcept = default;
CopyPipeline& CopyPipeline::operator=(CopyPipeline&&) noexcept = default;
CopyPipeline::~CopyPipeline() = default;

StagingBuffers& CopyPipeline::buffers() noexcept {
    return state_->buffers;
}

void CopyPipeline::from_gpu(const GpuMemory& src,
                            const std::function<void(std::span<const std::byte>, std::size_t)>& consume) {
    if (!state_) throw Error(errc::invalid_argument, "CopyPipeline::from_gpu", "the CopyPipeline is empty");
#if GPUVERBS_HAVE_CUDA
    State& s = *state_;
    const auto* cu = s.cu;
    detail::cuda::PrimaryContext::Scope scope(*cu, s.context.get());
    Status status;
    auto start = [&](std::size_t slot, std::size_t offset, std::size_t n) {
        if (!status.ok()) return;
        if (detail::cuda::failed(cu->cuMemcpyDtoHAsync(s.buffers.slot(slot).data(), src.address + offset, n, s.stream),
                                 "cuMemcpyDtoHAsync",
                                 "cannot copy " + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                                     " of GPU memory " + detail::hex_address(src.address),
                                 status)) {
            return;
        }
        (void)detail::cuda::failed(cu->cuEventRecord(s.done[slot], s.stream), "cuEventRecord",
                                   "cannot mark the staging copy", status);
    };
    auto wait = [&](std::size_t slot) {
        if (!status.ok()) return;
        (void)detail::cuda::failed(cu->cuEventSynchronize(s.done[slot]), "cuEventSynchronize",
                                   "the staging copy failed", status);
    };
    try {
        run_pipeline(src.size, s.options.chunk, s.options.depth, start, wait,
                     [&](std::size_t slot, std::size_t offset, std::size_t n) {
                         if (status.ok()) consume(s.buffers.slot(slot).first(n), offset);
                     });
    } catch (...) {
        (void)cu->cuStreamSynchronize(s.stream); // no copy of ours still writes a buffer the caller reuses
        throw;
    }
    (void)cu->cuStreamSynchronize(s.stream); // nothing of ours left running on an error
    if (!status.ok())
        detail::or_throw([&](Status& out) {
            out = status;
            return 0;
        });
#else
    (void)src;
    (void)consume;
#endif
}

void CopyPipeline::to_gpu(const GpuMemory& dst, const std::function<void(std::span<std::byte>, std::size_t)>& produce) {
    if (!state_) throw Error(errc::invalid_argument, "CopyPipeline::to_gpu", "the CopyPipeline is empty");
#if GPUVERBS_HAVE_CUDA
    State& s = *state_;
    const auto* cu = s.cu;
    detail::cuda::PrimaryContext::Scope scope(*cu, s.context.get());
    Status status;
    const std::size_t chunk = s.options.chunk;
    const std::size_t depth = s.options.depth;
    const std::size_t chunks = (dst.size + chunk - 1) / chunk;
    for (std::size_t k = 0; k < chunks && status.ok(); ++k) {
        const std::size_t slot = k % depth;
        const std::size_t n = std::min(chunk, dst.size - k * chunk);
        // The buffer's previous copy to the GPU must be done before it is refilled.
        if (k >= depth && detail::cuda::failed(cu->cuEventSynchronize(s.done[slot]), "cuEventSynchronize",
                                               "the staging copy failed", status)) {
            break;
        }
        try {
            produce(s.buffers.slot(slot).first(n), k * chunk);
        } catch (...) {
            (void)cu->cuStreamSynchronize(s.stream); // the copies already queued finish before the buffers are reused
            throw;
        }
        if (detail::cuda::failed(
                cu->cuMemcpyHtoDAsync(dst.address + k * chunk, s.buffers.slot(slot).data(), n, s.stream),
                "cuMemcpyHtoDAsync",
                "cannot copy " + std::to_string(n) + " bytes to offset " + std::to_string(k * chunk) +
                    " of GPU memory " + detail::hex_address(dst.address),
                status)) {
            break;
        }
        (void)detail::cuda::failed(cu->cuEventRecord(s.done[slot], s.stream), "cuEventRecord",
                                   "cannot mark the staging copy", status);
    }
    (void)detail::cuda::failed(cu->cuStreamSynchronize(s.stream), "cuStreamSynchronize", "the staging copies failed",
                               status);
    if (!status.ok())
        detail::or_throw([&](Status& out) {
            out = status;
            return 0;
        });
#else
    (void)dst;
    (void)produce;
#endif
}

// --- the writer ----------------------------------------------------------------

std::optional<std::string> StagedWriter::why_needed(const ProtectionDomain& pd, const GpuMemory& memory) {
    std::error_code ec;
    Diagnostics diagnostics;
    std::vector<Rejection> rejected;
    MemoryRegion mr =
        register_gpu_memory(pd, memory, Access::local_write, GpuRegistration::automatic, ec, diagnostics, &rejected);
    if (!ec) return std::nullopt;
    std::string why = diagnostics.message();
    return why.empty() ? ec.message() : why;
}

StagedWriter StagedWriter::create_impl(const ProtectionDomain& pd, const StagingOptions& options,
                                       const std::string& why_not_direct, Status& status) {
    if (!check_options(options, status)) return StagedWriter();
    if (!pd) { // before anything is allocated or pinned for it
        status.fail(errc::invalid_argument, "StagedWriter",
                    "the ProtectionDomain is empty: the staging buffers cannot be registered");
        return StagedWriter();
    }
    StagedWriter w;
    w.options_ = options;
    std::error_code ec;
    Diagnostics no_pipeline;
    CopyPipeline pipeline = CopyPipeline::create(options, ec, no_pipeline);
    if (ec) { // no CUDA here: host sources only
        w.no_gpu_ = no_pipeline.message();
        StagingBuffers host = StagingBuffers::create_impl(options, status);
        if (!status.ok()) return StagedWriter();
        w.host_ = std::make_unique<StagingBuffers>(std::move(host));
    } else {
        w.pipeline_ = std::make_unique<CopyPipeline>(std::move(pipeline));
    }
    const StagingBuffers& buffers = w.pipeline_ ? w.pipeline_->buffers() : *w.host_;
    Diagnostics why;
    w.mr_ = MemoryRegion::create(pd, buffers.all().data(), buffers.all().size(), Access::local_write, ec, why);
    if (ec) {
        status.fail(ec, why.verb(), why.detail());
        return StagedWriter();
    }
    w.path_ = std::string("staged: ") + (w.pipeline_ ? "GPU -> " : "host -> ") + std::to_string(options.depth) + " " +
              (buffers.cuda_pinned() ? "pinned " : "") + "host buffers of " + mib(options.chunk) +
              " -> RDMA write (GPUDirect RDMA is not used: " + why_not_direct + ")";
    return w;
}

StagedWriter::StagedWriter(const ProtectionDomain& pd, const StagingOptions& options, const std::string& why_not_direct)
    : StagedWriter(detail::or_throw([&](Status& s) { return create_impl(pd, options, why_not_direct, s); })) {}

StagedWriter StagedWriter::create(const ProtectionDomain& pd, const StagingOptions& options,
                                  const std::string& why_not_direct, std::error_code& ec) {
    return detail::or_code(ec, [&](Status& s) { return create_impl(pd, options, why_not_direct, s); });
}

StagedWriter StagedWriter::create(const ProtectionDomain& pd, const StagingOptions& options,
                                  const std::string& why_not_direct, std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](Status& s) { return create_impl(pd, options, why_not_direct, s); });
}

void StagedWriter::check_usable() const {
    if (!mr_) throw Error(errc::invalid_argument, "StagedWriter::write", "the StagedWriter is empty");
}

void StagedWriter::write_chunk(QueuePair& qp, CompletionQueue& cq, std::span<const std::byte> chunk,
                               const RemoteMemory& dst, std::uint64_t offset, std::size_t index) {
    const auto begin = static_cast<std::size_t>(chunk.data() - static_cast<const std::byte*>(mr_.address()));
    const std::string what = "chunk " + std::to_string(index) + " (" + std::to_string(chunk.size()) +
                             " bytes at offset " + std::to_string(offset) + ")";
    // The chunk's own completion is recognised by its context; the CQ must be the writer's alone.
    const std::uint64_t context = (std::uint64_t{0x5354414745} << 24) | (index & 0xffffff); // "STAGE"
    SendOptions options;
    options.context = context;
    if (std::error_code ec =
            qp.post(WorkRequest::write(mr_.slice(begin, chunk.size()), dst, offset).options(options))) {
        throw Error(ec, "StagedWriter::write", what);
    }
    std::array<Completion, 1> done{};
    const auto deadline = detail::deadline_after(options_.timeout);
    bool foreign = false;
    for (;;) {
        if (cq.poll(done) == 1) {
            // Another request's completion: an error, but only once the chunk's own
            // has come too (until then the NIC may still read its buffer).
            if (done[0].context != context) {
                foreign = true;
                continue;
            }
            if (!done[0].ok()) throw Error(done[0].status, "StagedWriter::write", what);
            if (foreign) {
                throw Error(make_error_code(errc::invalid_argument), "StagedWriter::write",
                            what +
                                ": a completion of another request came on the CQ; give the staged writer's "
                                "queue pair a send CQ of its own");
            }
            return;
        }
        if (std::chrono::steady_clock::now() > deadline) {
            throw Error(std::make_error_code(std::errc::timed_out), "StagedWriter::write",
                        what + ": no completion within " + std::to_string(options_.timeout.count()) + " ms");
        }
    }
}

std::size_t StagedWriter::write(QueuePair& qp, CompletionQueue& cq, const GpuMemory& src, const RemoteMemory& dst,
                                std::uint64_t offset) {
    check_usable();
    if (!pipeline_) {
        throw Error(make_error_code(errc::invalid_argument), "StagedWriter::write",
                    "this writer stages host memory only: its copy pipeline could not be made (" + no_gpu_ + ")");
    }
    if (!dst.contains(offset, src.size)) {
        throw Error(make_error_code(errc::remote_range_outside_region), "StagedWriter::write",
                    std::to_string(src.size) + " bytes at offset " + std::to_string(offset) +
                        " do not fit the remote region of " + std::to_string(dst.length) + " bytes");
    }
    pipeline_->from_gpu(src, [&](std::span<const std::byte> chunk, std::size_t at) {
        write_chunk(qp, cq, chunk, dst, offset + at, at / options_.chunk);
    });
    return src.size;
}

std::size_t StagedWriter::write(QueuePair& qp, CompletionQueue& cq, std::span<const std::byte> src,
                                const RemoteMemory& dst, std::uint64_t offset) {
    check_usable();
    if (!dst.contains(offset, src.size())) {
        throw Error(make_error_code(errc::remote_range_outside_region), "StagedWriter::write",
                    std::to_string(src.size()) + " bytes at offset " + std::to_string(offset) +
                        " do not fit the remote region of " + std::to_string(dst.length) + " bytes");
    }
    const StagingBuffers& buffers = pipeline_ ? pipeline_->buffers() : *host_;
    // Host memory: the copy is a memcpy at the start of each chunk, the order the same.
    run_pipeline(
        src.size(), options_.chunk, options_.depth,
        [&](std::size_t slot, std::size_t at, std::size_t n) {
            std::memcpy(buffers.slot(slot).data(), src.data() + at, n);
        },
        [](std::size_t) {},
        [&](std::size_t slot, std::size_t at, std::size_t n) {
            write_chunk(qp, cq, buffers.slot(slot).first(n), dst, offset + at, at / options_.chunk);
        });
    return src.size();
}

} // namespace gpuverbs
