// gpuverbs: GPUDirect RDMA from ordinary C++. Include this for everything.
#pragma once

#include "gpuverbs/completion.hpp"
#include "gpuverbs/completion_queue.hpp"
#include "gpuverbs/datagram.hpp"
#include "gpuverbs/device.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/gid.hpp"
#include "gpuverbs/gpu.hpp"
#include "gpuverbs/memory_region.hpp"
#include "gpuverbs/protection_domain.hpp"
#include "gpuverbs/queue_pair.hpp"
#include "gpuverbs/queue_pair_types.hpp"
#include "gpuverbs/rdma_cm.hpp"
#include "gpuverbs/shared_receive_queue.hpp"
#include "gpuverbs/tcp_bootstrap.hpp"
#include "gpuverbs/version.hpp"
#include "gpuverbs/wire.hpp"
