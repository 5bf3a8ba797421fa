// A build check, not a test case: a program that uses only the synchronous
// data path (queue_pair.hpp, completion_queue.hpp, send_batch.hpp) compiles
// none of Asio and none of the asynchronous engine. The async_* forms need
// <gpuverbs/async.hpp> (data_path.hpp says so; the static_assert there names
// it). This file fails to compile if either comes back through an include.
#include "gpuverbs/data_path/send_batch.hpp"
#include "gpuverbs/verbs/completion_queue.hpp"
#include "gpuverbs/verbs/queue_pair.hpp"

#if defined(BOOST_ASIO_DETAIL_CONFIG_HPP)
#error "the synchronous data path headers include Asio"
#endif

namespace gpuverbs::detail {
class AsyncDriver;
} // namespace gpuverbs::detail

// The engine's types stay incomplete here (sizeof would not compile).
template <class T>
concept complete_type = requires {
    sizeof(T);
};
static_assert(!complete_type<gpuverbs::detail::AsyncDriver>, "the async driver is compiled by a sync-only program");
