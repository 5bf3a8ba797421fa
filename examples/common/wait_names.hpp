// What a device queue wait ended with, in words (examples 07 and 08 print it).
#pragma once

#include <gpuverbs/device_queue/ring.hpp>

namespace example {

inline const char* name_of(gpuverbs::device_queue::WaitResult r) {
    switch (r) {
        case gpuverbs::device_queue::WaitResult::done: return "done";
        case gpuverbs::device_queue::WaitResult::timed_out: return "timed out";
        case gpuverbs::device_queue::WaitResult::peer_failed: return "peer failed";
        case gpuverbs::device_queue::WaitResult::queue_closed: return "queue closed";
        case gpuverbs::device_queue::WaitResult::refused: return "refused";
    }
    return "?";
}

} // namespace example
