// PmixRendezvous (rendezvous/pmix.hpp): PMIx_Put/Commit/Fence/Get.
#include "gpuverbs/many_peers/rendezvous/pmix.hpp"
#include "gpuverbs/config.hpp"

#include "gpuverbs/detail/deadline.hpp"
#include "gpuverbs/error.hpp"

#if GPUVERBS_HAVE_PMIX
#include <pmix.h>

#include <algorithm>
#include <cstring>
#include <thread>
#endif

namespace gpuverbs {

#if GPUVERBS_HAVE_PMIX

namespace {

std::string pmix_text(pmix_status_t rc) {
    return std::string(PMIx_Error_string(rc)) + " (" + std::to_string(rc) + ")";
}

/// PMIx's timeouts are whole seconds: at least 1, rounded up.
int timeout_seconds(std::chrono::milliseconds timeout) {
    const std::int64_t ms = std::clamp<std::int64_t>(timeout.count(), 1, std::int64_t{1} << 40); // no overflow below
    return static_cast<int>(std::min<std::int64_t>((ms + 999) / 1000, 1 << 30));
}

bool check_key(const std::string& key, const char* verb, detail::Status& status) {
    if (key.empty() || key.size() > PMIX_MAX_KEYLEN) {
        status.fail(errc::invalid_argument, verb,
                    "a PMIx key has 1 to " + std::to_string(PMIX_MAX_KEYLEN) + " characters; '" + key + "' has " +
                        std::to_string(key.size()));
        return false;
    }
    return true;
}

} // namespace

struct PmixRendezvous::Impl {
    pmix_proc_t me{};
    std::uint32_t size = 0;
};

PmixRendezvous::PmixRendezvous() : PmixRendezvous(detail::Outcome{}) {}

PmixRendezvous::PmixRendezvous(detail::Outcome outcome) {
    detail::Status status;
    auto impl = std::make_unique<Impl>();
    pmix_status_t rc = PMIx_Init(&impl->me, nullptr, 0);
    if (rc != PMIX_SUCCESS) {
        status.fail(errc::rendezvous_unavailable, "PMIx_Init",
                    "this process was not started by a PMIx launcher (mpirun, srun --mpi=pmix, prterun), or the "
                    "launcher is gone: " +
                        pmix_text(rc));
        outcome.settle(status);
        return;
    }
    pmix_proc_t job;
    PMIX_LOAD_PROCID(&job, impl->me.nspace, PMIX_RANK_WILDCARD);
    pmix_value_t* value = nullptr;
    rc = PMIx_Get(&job, PMIX_JOB_SIZE, nullptr, 0, &value);
    if (rc != PMIX_SUCCESS || value == nullptr || value->type != PMIX_UINT32) {
        if (value != nullptr) PMIX_VALUE_RELEASE(value);
        PMIx_Finalize(nullptr, 0);
        status.fail(errc::rendezvous_unavailable, "PMIx_Get",
                    "the launcher did not give the job's size (PMIX_JOB_SIZE): " + pmix_text(rc));
        outcome.settle(status);
        return;
    }
    impl->size = value->data.uint32;
    PMIX_VALUE_RELEASE(value);
    impl_ = std::move(impl);
    outcome.settle(status);
}

const PmixRendezvous::Impl* PmixRendezvous::joined(const char* verb, detail::Status& status) const {
    if (!impl_) {
        status.fail(errc::rendezvous_unavailable, verb,
                    "this PmixRendezvous did not join a job (create() failed): create it again");
    }
    return impl_.get();
}

PmixRendezvous::~PmixRendezvous() {
    if (impl_) PMIx_Finalize(nullptr, 0);
}

std::uint32_t PmixRendezvous::rank() const noexcept {
    return impl_ ? impl_->me.rank : 0;
}
std::uint32_t PmixRendezvous::world_size() const noexcept {
    return impl_ ? impl_->size : 0;
}
std::string PmixRendezvous::name() const {
    return impl_ ? std::string("PMIx namespace '") + impl_->me.nspace + "'" : std::string("PMIx (not joined)");
}

void PmixRendezvous::publish_impl(const std::string& key, std::span<const std::byte> value, detail::Status& status) {
    if (joined("PMIx_Put", status) == nullptr || !check_key(key, "PMIx_Put", status)) return;
    pmix_value_t v;
    PMIX_VALUE_CONSTRUCT(&v);
    v.type = PMIX_BYTE_OBJECT;
    // PMIx_Put copies the value; the cast only satisfies its C signature.
    v.data.bo.bytes = const_cast<char*>(reinterpret_cast<const char*>(value.data())); // NOLINT
    v.data.bo.size = value.size();
    pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, key.c_str(), &v);
    if (rc == PMIX_SUCCESS) rc = PMIx_Commit();
    if (rc != PMIX_SUCCESS) {
        status.fail(errc::rendezvous_unavailable, "PMIx_Put",
                    name() + ": rank " + std::to_string(rank()) + " could not publish '" + key + "': " + pmix_text(rc));
    }
}

void PmixRendezvous::fence_impl(std::chrono::milliseconds timeout, detail::Status& status) {
    const Impl* impl = joined("PMIx_Fence", status);
    if (impl == nullptr) return;
    pmix_proc_t job;
    PMIX_LOAD_PROCID(&job, impl->me.nspace, PMIX_RANK_WILDCARD);
    pmix_info_t info[2];
    bool collect = true;
    int seconds = timeout_seconds(timeout);
    PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &seconds, PMIX_INT);
    pmix_status_t rc = PMIx_Fence(&job, 1, info, 2);
    PMIX_INFO_DESTRUCT(&info[0]);
    PMIX_INFO_DESTRUCT(&info[1]);
    if (rc == PMIX_ERR_TIMEOUT) {
        status.fail(errc::peer_missing, "PMIx_Fence",
                    name() + ": not every rank reached the fence within " + std::to_string(seconds) +
                        " s (a rank is stuck, crashed or never called it)");
    } else if (rc != PMIX_SUCCESS) {
        status.fail(errc::rendezvous_unavailable, "PMIx_Fence", name() + ": " + pmix_text(rc));
    }
}

std::vector<std::byte> PmixRendezvous::lookup_impl(std::uint32_t peer, const std::string& key,
                                                   std::chrono::milliseconds timeout, detail::Status& status) {
    if (!check_key(key, "PMIx_Get", status) || joined("PMIx_Get", status) == nullptr) return {};
    if (peer >= impl_->size) {
        status.fail(
            errc::invalid_argument, "PMIx_Get",
            name() + " has " + std::to_string(impl_->size) + " ranks; there is no rank " + std::to_string(peer));
        return {};
    }
    pmix_proc_t proc;
    PMIX_LOAD_PROCID(&proc, impl_->me.nspace, peer);
    // A peer that committed other keys but not this one yet answers
    // NOT-FOUND at once (its server resolves a waiting get at each commit):
    // ask again until the deadline.
    auto deadline = detail::deadline_after(timeout);
    int seconds = timeout_seconds(timeout);
    pmix_value_t* value = nullptr;
    pmix_status_t rc = PMIX_SUCCESS;
    for (;;) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        pmix_info_t info;
        int wait = timeout_seconds(left);
        PMIX_INFO_LOAD(&info, PMIX_TIMEOUT, &wait, PMIX_INT);
        rc = PMIx_Get(&proc, key.c_str(), &info, 1, &value);
        PMIX_INFO_DESTRUCT(&info);
        if (rc != PMIX_ERR_NOT_FOUND || std::chrono::steady_clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::string who = name() + ": rank " + std::to_string(peer) + "'s '" + key + "'";
    if (rc == PMIX_ERR_TIMEOUT || rc == PMIX_ERR_NOT_FOUND) {
        status.fail(errc::peer_missing, "PMIx_Get",
                    who + " was not published within " + std::to_string(seconds) + " s (" + pmix_text(rc) + ")");
        return {};
    }
    if (rc != PMIX_SUCCESS || value == nullptr) {
        if (value != nullptr) PMIX_VALUE_RELEASE(value);
        status.fail(errc::rendezvous_unavailable, "PMIx_Get", who + ": " + pmix_text(rc));
        return {};
    }
    if (value->type != PMIX_BYTE_OBJECT) {
        int type = value->type;
        PMIX_VALUE_RELEASE(value);
        status.fail(errc::malformed_record, "PMIx_Get",
                    who + " is PMIx data type " + std::to_string(type) + ", not the bytes gpuverbs publishes");
        return {};
    }
    const auto* first = reinterpret_cast<const std::byte*>(value->data.bo.bytes);
    std::vector<std::byte> bytes(first, first + value->data.bo.size);
    PMIX_VALUE_RELEASE(value);
    return bytes;
}

bool PmixRendezvous::available() noexcept {
    return true;
}

#else // without PMIx: the class exists and says why it cannot work

struct PmixRendezvous::Impl {};

PmixRendezvous::PmixRendezvous() : PmixRendezvous(detail::Outcome{}) {}
PmixRendezvous::PmixRendezvous(detail::Outcome outcome) {
    detail::Status status;
    status.fail(errc::unsupported, "PmixRendezvous",
                "gpuverbs was built without PMIx: install libpmix-dev (scripts/install-deps) and configure again");
    outcome.settle(status);
}
const PmixRendezvous::Impl* PmixRendezvous::joined(const char* verb, detail::Status& status) const {
    status.fail(errc::unsupported, verb, "gpuverbs was built without PMIx");
    return nullptr;
}
PmixRendezvous::~PmixRendezvous() = default;
std::uint32_t PmixRendezvous::rank() const noexcept {
    return 0;
}
std::uint32_t PmixRendezvous::world_size() const noexcept {
    return 0;
}
std::string PmixRendezvous::name() const {
    return "PMIx (not built)";
}
// Without PMIx nothing joined: each operation refuses, saying why (never a silent no-op).
void PmixRendezvous::publish_impl(const std::string&, std::span<const std::byte>, detail::Status& status) {
    (void)joined("PmixRendezvous::publish", status);
}
void PmixRendezvous::fence_impl(std::chrono::milliseconds, detail::Status& status) {
    (void)joined("PmixRendezvous::fence", status);
}
std::vector<std::byte> PmixRendezvous::lookup_impl(std::uint32_t, const std::string&, std::chrono::milliseconds,
                                                   detail::Status& status) {
    (void)joined("PmixRendezvous::lookup", status);
    return {};
}
bool PmixRendezvous::available() noexcept {
    return false;
}

#endif

} // namespace gpuverbs
