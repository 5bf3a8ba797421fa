// A build check, not a test case: a program that uses only the synchronous
// data path (queue_pair.hpp, completion_queue.hpp, send_batch.hpp) compiles
// none of Asio and none of the asynchronous engine. The async_* forms need
// <gpuverbs/async.hpp> (data_path.hpp says so; the static_assert there names
// it). Nor does a program that only plans a transfer (transfer_plan.hpp,
// transfer_options.hpp, the striping), or one that reads an rdma_cm
// connection's values (rdma_cm_types.hpp). This file fails to compile if
// Asio or the engine comes back through one of these includes.
#include "gpuverbs/connections/rdma_cm_types.hpp"
#include "gpuverbs/data_path/send_batch.hpp"
#include "gpuverbs/transfers/transfer_options.hpp"
#include "gpuverbs/transfers/transfer_plan.hpp"
#include "gpuverbs/verbs/completion_queue.hpp"
#include "gpuverbs/verbs/queue_pair.hpp"

#include "gpuverbs/detail/transfers/stripes.hpp"

#if defined(BOOST_ASIO_DETAIL_CONFIG_HPP)
#error "the synchronous data path, planning or rdma_cm value headers include Asio"
#endif

namespace gpuverbs::detail {
class AsyncDriver;
class TransferJobBase;
class RailStream;
} // namespace gpuverbs::detail

// The engine's types stay incomplete here (sizeof would not compile).
template <class T>
concept complete_type = requires {
    sizeof(T);
};
static_assert(!complete_type<gpuverbs::detail::AsyncDriver>, "the async driver is compiled by a sync-only program");
static_assert(!complete_type<gpuverbs::detail::TransferJobBase>, "the transfer job is compiled by a plan-only program");
static_assert(!complete_type<gpuverbs::detail::RailStream>, "the rail streams are compiled by a plan-only program");
