// A memory key of a transfer's plan and the same memory's key on a rail's
// device (TransferRail, RailStream).
#pragma once

#include <cstdint>

namespace gpuverbs::detail {

/// A memory key of the plan and the same memory's key on a rail's device.
struct KeyMap {
    std::uint32_t plan_key = 0;
    std::uint32_t rail_key = 0;
};

} // namespace gpuverbs::detail
