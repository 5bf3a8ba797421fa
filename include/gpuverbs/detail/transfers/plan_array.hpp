// PlanArray: the storage of a TransferPlan's requests and pieces. Sized once
// for the worst case and written in place, element by element: a
// std::vector would value-initialise every element first (a memset as large
// as the plan) or check its capacity on every push_back, and planning is
// paid per request of a KV-cache hand-off. Trivially copyable values only.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace gpuverbs::detail {

template <class T>
class PlanArray {
    static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);

public:
    PlanArray() noexcept = default;
    /// Room for `capacity` elements, none of them written yet (size 0).
    explicit PlanArray(std::size_t capacity)
        : data_(capacity == 0 ? nullptr : static_cast<T*>(::operator new(capacity * sizeof(T)))) {}
    explicit PlanArray(const std::vector<T>& values) : PlanArray(values.size()) {
        if (!values.empty()) std::memcpy(static_cast<void*>(data_), values.data(), values.size() * sizeof(T));
        size_ = values.size();
    }
    PlanArray(const PlanArray& other) : PlanArray(other.size_) {
        if (other.size_ != 0) std::memcpy(static_cast<void*>(data_), other.data_, other.size_ * sizeof(T));
        size_ = other.size_;
    }
    PlanArray(PlanArray&& other) noexcept
        : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
    PlanArray& operator=(PlanArray other) noexcept {
        std::swap(data_, other.data_);
        std::swap(size_, other.size_);
        return *this;
    }
    ~PlanArray() { ::operator delete(data_); }

    /// Element i, written in place (i below the capacity given).
    T* at(std::size_t i) noexcept { return data_ + i; }
    /// The first n elements were written.
    void set_size(std::size_t n) noexcept { size_ = n; }

    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
    [[nodiscard]] const T* data() const noexcept { return data_; }
    [[nodiscard]] const T& operator[](std::size_t i) const noexcept { return data_[i]; }
    [[nodiscard]] std::span<const T> span() const noexcept { return {data_, size_}; }

private:
    T* data_ = nullptr;
    std::size_t size_ = 0;
};

} // namespace gpuverbs::detail
