// gpuverbs: GPUDirect RDMA from ordinary C++. Include this for everything.
#pragma once

#include "gpuverbs/version.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/gid.hpp"
#include "gpuverbs/device.hpp"
#include "gpuverbs/gpu.hpp"
