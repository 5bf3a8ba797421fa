// gpuverbs: GPUDirect RDMA from ordinary C++. Include this for everything.
#pragma once

#include "gpuverbs/device.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/gid.hpp"
#include "gpuverbs/gpu.hpp"
#include "gpuverbs/version.hpp"
