#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "core/local_watchers.h"
#include "core/store.h"

namespace idemgate::admin::testing {

// An in-memory core::Store over a std::map, for admin tests (the real
// MemoryStore lives in src/store/memory). Implements the whole contract of
// core::Store; `Fail` makes every operation (and Ping) return `status`.
// Thread-safe.
class FakeStore final : public core::Store {
 public:
  void Fail(Status status) {
    std::lock_guard lock(mu_);
    failure_ = std::move(status);
  }
  void Heal() {
    std::lock_guard lock(mu_);
    failure_.reset();
  }
  void Put(std::string key, core::Record record) {
    std::lock_guard lock(mu_);
    records_[std::move(key)] = std::move(record);
  }
  std::size_t size() const {
    std::lock_guard lock(mu_);
    return records_.size();
  }

  core::Task<StatusOr<core::ReserveResult>> Reserve(std::string key, core::Record reservation,
                                                    UnixMillis now) override {
    co_return DoReserve(std::move(key), std::move(reservation), now);
  }

  core::Task<Status> Complete(std::string key, std::string owner, core::Record completed) override {
    Status s = DoFinish(key, owner, &completed);
    if (s.ok()) watchers_.Notify(key);
    co_return s;
  }

  core::Task<Status> Release(std::string key, std::string owner) override {
    Status s = DoFinish(key, owner, nullptr);
    if (s.ok()) watchers_.Notify(key);
    co_return s;
  }

  core::Task<StatusOr<std::optional<core::Record>>> Get(std::string key, UnixMillis now) override {
    co_return DoGet(key, now);
  }

  core::Task<StatusOr<core::PurgeResult>> Purge(std::string key, core::PurgeMode mode, UnixMillis now) override {
    StatusOr<core::PurgeResult> purged = DoPurge(key, mode, now);
    if (purged.ok() && purged->outcome == core::PurgeOutcome::kPurged) watchers_.Notify(key);
    co_return purged;
  }

  core::Task<StatusOr<std::unique_ptr<core::Watch>>> WatchKey(std::string key) override {
    if (Status s = Failure(); !s.ok()) co_return s;
    co_return co_await watchers_.Make(std::move(key));
  }

  core::Task<Status> Ping() override { co_return Failure(); }

  core::StoreStats Stats() const override {
    std::lock_guard lock(mu_);
    core::StoreStats stats;
    stats.keys = records_.size();
    for (const auto& [key, record] : records_)
      stats.bytes += key.size() + core::EncodedSize(record);
    return stats;
  }

 private:
  Status Failure() const {
    std::lock_guard lock(mu_);
    return failure_.value_or(Status::Ok());
  }

  StatusOr<core::ReserveResult> DoReserve(std::string key, core::Record reservation,
                                          UnixMillis now) {
    std::lock_guard lock(mu_);
    if (failure_) return *failure_;
    reservation.state = core::RecordState::kInFlight;
    auto it = records_.find(key);
    core::ReserveResult result;
    if (it == records_.end() ||
        (it->second.state == core::RecordState::kCompleted && it->second.ExpiredAt(now))) {
      records_[key] = std::move(reservation);
      result.outcome = core::ReserveOutcome::kReserved;
    } else if (it->second.LeaseEndedAt(now) && it->second.fingerprint == reservation.fingerprint) {
      result.outcome = core::ReserveOutcome::kTakenOver;
      result.existing = std::exchange(it->second, std::move(reservation));
    } else {
      result.outcome = core::ReserveOutcome::kExists;
      result.existing = it->second;
    }
    return result;
  }

  // Completes (completed != null) or releases the in-flight record of `owner`.
  Status DoFinish(const std::string& key, const std::string& owner, core::Record* completed) {
    std::lock_guard lock(mu_);
    if (failure_) return *failure_;
    auto it = records_.find(key);
    if (it == records_.end() || it->second.state != core::RecordState::kInFlight ||
        it->second.owner != owner) {
      return FailedPreconditionError("key not held by this owner");
    }
    if (completed == nullptr) {
      records_.erase(it);
    } else {
      completed->state = core::RecordState::kCompleted;
      it->second = std::move(*completed);
    }
    return Status::Ok();
  }

  StatusOr<std::optional<core::Record>> DoGet(const std::string& key, UnixMillis now) const {
    std::lock_guard lock(mu_);
    if (failure_) return *failure_;
    auto it = records_.find(key);
    if (it == records_.end()) return std::optional<core::Record>();
    if (it->second.state == core::RecordState::kCompleted && it->second.ExpiredAt(now)) {
      return std::optional<core::Record>();
    }
    return std::optional<core::Record>(it->second);
  }

  StatusOr<core::PurgeResult> DoPurge(const std::string& key, core::PurgeMode mode, UnixMillis now) {
    std::lock_guard lock(mu_);
    if (failure_) return *failure_;
    core::PurgeResult result;
    auto it = records_.find(key);
    if (it == records_.end()) return result;
    if (it->second.state == core::RecordState::kCompleted && it->second.ExpiredAt(now)) {
      records_.erase(it);  // past retention: absent, as for Get
      return result;
    }
    result.state = it->second.state;
    if (mode == core::PurgeMode::kUnlessInFlight && it->second.state == core::RecordState::kInFlight &&
        !it->second.LeaseEndedAt(now)) {
      result.outcome = core::PurgeOutcome::kInFlight;
      result.lease_expires_ms = it->second.lease_expires_ms;
      return result;
    }
    records_.erase(it);
    result.outcome = core::PurgeOutcome::kPurged;
    return result;
  }

  mutable std::mutex mu_;
  std::map<std::string, core::Record> records_;
  std::optional<Status> failure_;
  core::LocalWatchers watchers_;
};

}  // namespace idemgate::admin::testing
