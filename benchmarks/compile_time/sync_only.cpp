// What a program that only posts and polls compiles (benchmarks/compile-time
// times it): the synchronous data path, without Asio or the async engine.
#include <gpuverbs/verbs/completion_queue.hpp>
#include <gpuverbs/verbs/queue_pair.hpp>

#include <array>

int send_one(gpuverbs::QueuePair& qp, gpuverbs::CompletionQueue& cq, const gpuverbs::LocalBuffer& b,
             const gpuverbs::RemoteMemory& r) {
    if (qp.post_write(b, r, 0, {.context = 1})) return -1;
    std::array<gpuverbs::Completion, 4> done;
    return static_cast<int>(cq.poll(done));
}
