// The same program with <gpuverbs/async.hpp> included (what every program
// including queue_pair.hpp compiled before the headers were split).
#include <gpuverbs/async.hpp>
#include <gpuverbs/verbs/completion_queue.hpp>
#include <gpuverbs/verbs/queue_pair.hpp>

#include <array>

int send_one(gpuverbs::QueuePair& qp, gpuverbs::CompletionQueue& cq, const gpuverbs::LocalBuffer& b,
             const gpuverbs::RemoteMemory& r) {
    if (qp.post_write(b, r, 0, {.context = 1})) return -1;
    std::array<gpuverbs::Completion, 4> done;
    return static_cast<int>(cq.poll(done));
}
